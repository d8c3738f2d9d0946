//! The CUDA device: cudarc with the driver loaded at run time (no link-time
//! CUDA dependency), kernels compiled by NVRTC and cached, one stream per
//! processing element, each map uploaded once and reused.

use crate::device::{fix_fallbacks, kernel_fits, pool_kernel_params, Inputs, MapHandle, Mapping};
use crate::error::{OffloadError, Result};
use crate::kernel::{cached_ptx, CRUSH_CU, KERNEL_THREAD, KERNEL_WARP};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// Batches up to this many inputs use the latency (warp) kernel.
pub fn warp_kernel_max() -> usize {
    std::env::var("IOLIFT_WARP_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Last reweight vector uploaded for a map, and its device copy.
type WeightsCache = Mutex<Option<(Vec<u32>, Arc<CudaSlice<u32>>)>>;

struct GpuMap {
    words: CudaSlice<u32>,
    ln: CudaSlice<i64>,
    weights: WeightsCache,
}

/// Per-stream input/output buffers, grown on demand and reused, so a
/// launch allocates nothing on the device.
#[derive(Default)]
struct Scratch {
    xs: Option<CudaSlice<i32>>,
    out: Option<CudaSlice<i32>>,
    lens: Option<CudaSlice<u32>>,
}

fn ensure<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<()> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = Some(
            stream
                .alloc_zeros::<T>(n.next_power_of_two())
                .map_err(cuda_err)?,
        );
    }
    Ok(())
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    streams: Vec<Arc<CudaStream>>,
    scratch: Vec<Mutex<Scratch>>,
    thread_fn: CudaFunction,
    warp_fn: CudaFunction,
    maps: Mutex<HashMap<u64, Arc<GpuMap>>>,
    name: String,
}

fn cuda_err<E: std::fmt::Debug>(e: E) -> OffloadError {
    OffloadError::Cuda(format!("{e:?}"))
}

/// Whether libcuda can be loaded, without touching cudarc's panicking loader.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by name.
    catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false)
}

impl CudaDevice {
    pub fn new(ordinal: usize, streams: usize) -> Result<CudaDevice> {
        if !driver_present() {
            return Err(OffloadError::NoGpu(
                "the CUDA driver library (libcuda.so) is not installed on this machine; use --device cpu".into(),
            ));
        }
        let r = catch_unwind(AssertUnwindSafe(|| -> Result<CudaDevice> {
            let n = CudaContext::device_count().map_err(cuda_err)?;
            if n <= 0 || ordinal >= n as usize {
                return Err(OffloadError::NoGpu(format!(
                    "GPU {ordinal} requested, {n} CUDA device(s) present"
                )));
            }
            let ctx =
                CudaContext::new(ordinal).map_err(|e| OffloadError::NoGpu(format!("{e:?}")))?;
            // Buffers are per stream, or uploaded and synchronised before any
            // other stream reads them: cudarc's per-buffer events are not needed.
            // SAFETY: see above; no buffer is shared between streams while written.
            unsafe { ctx.disable_event_tracking() };
            // do_rule keeps ~1 KiB of per-thread state (result/work arrays,
            // sparse permutation) in non-inlined frames: give the stack room.
            let _ = ctx.set_limit(cudarc::driver::sys::CUlimit::CU_LIMIT_STACK_SIZE, 4096);
            let (maj, min) = ctx.compute_capability().map_err(cuda_err)?;
            let arch: &'static str = Box::leak(format!("compute_{maj}{min}").into_boxed_str());
            let (ptx, _) = cached_ptx(CRUSH_CU, "crush", arch)?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx.as_str()))
                .map_err(cuda_err)?;
            let thread_fn = module.load_function(KERNEL_THREAD).map_err(cuda_err)?;
            let warp_fn = module.load_function(KERNEL_WARP).map_err(cuda_err)?;
            let mut st = Vec::new();
            for _ in 0..streams.max(1) {
                st.push(ctx.new_stream().map_err(cuda_err)?);
            }
            let name = format!(
                "cuda:{ordinal} {} (sm_{maj}{min}, {} streams)",
                ctx.name().unwrap_or_default(),
                st.len()
            );
            let scratch = st.iter().map(|_| Mutex::new(Scratch::default())).collect();
            Ok(CudaDevice {
                ctx,
                scratch,
                streams: st,
                thread_fn,
                warp_fn,
                maps: Mutex::new(HashMap::new()),
                name,
            })
        }));
        match r {
            Ok(r) => r,
            Err(_) => Err(OffloadError::NoGpu(
                "the CUDA driver could not be initialised (loader panicked)".into(),
            )),
        }
    }

    pub fn name(&self) -> String {
        self.name.clone()
    }

    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Upload (once) and return the device copy of `h`'s flat map.
    fn gpu_map(&self, h: &MapHandle) -> Result<Arc<GpuMap>> {
        let mut maps = self.maps.lock().expect("map cache lock");
        if let Some(m) = maps.get(&h.flat.id) {
            return Ok(m.clone());
        }
        let s = &self.streams[0];
        let words = s.clone_htod(&h.flat.words).map_err(cuda_err)?;
        let ln = s.clone_htod(h.flat.ln.as_slice()).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        let m = Arc::new(GpuMap {
            words,
            ln,
            weights: Mutex::new(None),
        });
        maps.insert(h.flat.id, m.clone());
        Ok(m)
    }

    fn gpu_weights(
        &self,
        m: &GpuMap,
        stream: &Arc<CudaStream>,
        w: &[u32],
    ) -> Result<Arc<CudaSlice<u32>>> {
        let mut g = m.weights.lock().expect("weights lock");
        if let Some((host, dev)) = g.as_ref() {
            if host.as_slice() == w {
                return Ok(dev.clone());
            }
        }
        let src: Vec<u32> = if w.is_empty() { vec![0] } else { w.to_vec() };
        let dev = Arc::new(stream.clone_htod(&src).map_err(cuda_err)?);
        stream.synchronize().map_err(cuda_err)?;
        *g = Some((w.to_vec(), dev.clone()));
        Ok(dev)
    }

    pub fn map(
        &self,
        pe: usize,
        h: &MapHandle,
        rule: i32,
        inputs: Inputs,
        result_max: usize,
        weights: &[u32],
    ) -> Result<Mapping> {
        let n = inputs.len();
        if n == 0 {
            return Ok(Mapping {
                result_max,
                out: vec![],
                lens: vec![],
                fallbacks: 0,
            });
        }
        if !kernel_fits(result_max) || n > u32::MAX as usize / 32 {
            let mut m = Mapping {
                result_max,
                out: vec![0; n * result_max],
                lens: vec![crate::flat::LEN_FALLBACK; n],
                fallbacks: 0,
            };
            fix_fallbacks(h, rule, inputs, weights, &mut m);
            return Ok(m);
        }
        let si = pe % self.streams.len();
        let stream = &self.streams[si];
        let mut scratch = self.scratch[si].lock().expect("scratch lock");
        let sc = &mut *scratch;
        let gm = self.gpu_map(h)?;
        let wdev = self.gpu_weights(&gm, stream, weights)?;
        let rm1 = result_max.max(1);
        ensure(stream, &mut sc.xs, n)?;
        ensure(stream, &mut sc.out, n * rm1)?;
        ensure(stream, &mut sc.lens, n)?;
        let (xs_dev, out, lens) = (
            sc.xs.as_mut().expect("ensured"),
            sc.out.as_mut().expect("ensured"),
            sc.lens.as_mut().expect("ensured"),
        );
        let (x0, pgp_num, pgp_mask, pool_id, flags) = match inputs {
            Inputs::Xs(xs) => {
                stream
                    .memcpy_htod(xs, &mut xs_dev.slice_mut(0..n))
                    .map_err(cuda_err)?;
                (0i32, 0u32, 0u32, 0u32, 0u32)
            }
            Inputs::Pool(p) => {
                let (a, b, c, d) = pool_kernel_params(p);
                (0, a, b, c, d | 2)
            }
        };
        let has_xs: bool = matches!(inputs, Inputs::Xs(_));
        let n32 = n as u32;
        let rm = result_max as u32;
        let wmax = weights.len() as u32;
        let warp = n <= warp_kernel_max();
        let (func, threads) = if warp {
            (&self.warp_fn, n * 32)
        } else {
            (&self.thread_fn, n)
        };
        let block = 128u32;
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(block as usize) as u32, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let null_xs: u64 = 0;
        let mut lb = stream.launch_builder(func);
        lb.arg(&gm.words)
            .arg(&gm.ln)
            .arg(wdev.as_ref())
            .arg(&wmax)
            .arg(&rule);
        if has_xs {
            lb.arg(&*xs_dev);
        } else {
            lb.arg(&null_xs);
        }
        lb.arg(&x0)
            .arg(&n32)
            .arg(&rm)
            .arg(&pgp_num)
            .arg(&pgp_mask)
            .arg(&pool_id)
            .arg(&flags)
            .arg(&mut *out)
            .arg(&mut *lens);
        // SAFETY: argument list matches the kernel signature in kernels/crush.cu.
        unsafe { lb.launch(cfg) }.map_err(cuda_err)?;
        let lens_h = stream.clone_dtoh(&lens.slice(0..n)).map_err(cuda_err)?;
        let mut out_h = stream
            .clone_dtoh(&out.slice(0..n * rm1))
            .map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        drop(scratch);
        // rows past their length hold stale data from earlier launches
        for (i, &l) in lens_h.iter().enumerate() {
            if l != crate::flat::LEN_FALLBACK {
                out_h[i * rm1 + l as usize..(i + 1) * rm1]
                    .iter_mut()
                    .for_each(|v| *v = 0);
            }
        }
        let mut m = Mapping {
            result_max,
            out: out_h,
            lens: lens_h,
            fallbacks: 0,
        };
        if result_max == 0 {
            m.out.clear();
        }
        fix_fallbacks(h, rule, inputs, weights, &mut m);
        let _ = &self.ctx;
        Ok(m)
    }
}
