//! The CUDA device: cudarc with the driver loaded at run time (no link-time
//! CUDA dependency), kernels compiled by NVRTC and cached, one stream per
//! processing element, each map uploaded once and reused.

use crate::device::{fix_fallbacks, kernel_fits, pool_kernel_params, Inputs, MapHandle, Mapping};
use crate::error::{OffloadError, Result};
use crate::kernel::{cached_ptx, CRUSH_CU, KERNEL_THREAD, KERNEL_WARP};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
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

/// Inputs up to this many are mapped zero-copy: the kernel reads the
/// inputs from and writes the results to mapped page-locked host memory (no
/// copies, one launch and one synchronisation). Larger batches are staged:
/// one async copy in, the kernel on device buffers, one async copy out of
/// results and lengths together, one synchronisation.
pub fn zero_copy_max() -> usize {
    std::env::var("IOLIFT_ZERO_COPY_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
}

/// Threads per block of the throughput kernel (`IOLIFT_BLOCK`, default 128)
/// and which thread-kernel variant to run (`IOLIFT_THREAD_KERNEL`: empty =
/// `crush_map_thread`, `lb6` / `lb8` = the `__launch_bounds__(128, 6 / 8)`
/// variants, which trade registers for occupancy).
fn thread_kernel_choice() -> (String, u32) {
    let v = std::env::var("IOLIFT_THREAD_KERNEL").unwrap_or_default();
    let block = std::env::var("IOLIFT_BLOCK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128u32);
    match v.as_str() {
        "lb6" | "lb8" => (format!("{KERNEL_THREAD}_{v}"), 128),
        _ => (KERNEL_THREAD.to_string(), block.clamp(32, 1024)),
    }
}

/// Page-locked host memory mapped into the device's address space.
struct Pinned<T> {
    ctx: Arc<CudaContext>,
    ptr: *mut T,
    len: usize,
    dptr: u64,
}

// SAFETY: plain host memory owned by this value; access is serialised by
// the per-stream scratch lock.
unsafe impl<T: Send> Send for Pinned<T> {}

impl<T: Copy> Pinned<T> {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Pinned<T>> {
        use cudarc::driver::sys;
        ctx.bind_to_thread().map_err(cuda_err)?;
        let bytes = len.max(1) * std::mem::size_of::<T>();
        // SAFETY: allocation of `bytes` of page-locked memory; checked below.
        let p = unsafe {
            cudarc::driver::result::malloc_host(
                bytes,
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }
        .map_err(cuda_err)?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `p` was allocated with DEVICEMAP just above.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, p, 0) };
        let pinned = Pinned {
            ctx: ctx.clone(),
            ptr: p as *mut T,
            len: len.max(1),
            dptr,
        };
        r.result().map_err(cuda_err)?;
        Ok(pinned)
    }

    fn slice(&self, n: usize) -> &[T] {
        assert!(n <= self.len);
        // SAFETY: `len` initialised-or-device-written elements of T (plain
        // integers: every bit pattern is valid).
        unsafe { std::slice::from_raw_parts(self.ptr, n) }
    }

    fn slice_mut(&mut self, n: usize) -> &mut [T] {
        assert!(n <= self.len);
        // SAFETY: as above, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, n) }
    }
}

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host; no launch using it is pending
        // (buffers are only replaced after the stream was synchronised).
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr as _) };
    }
}

/// Per-stream buffers, grown on demand and reused, so a launch allocates
/// nothing: page-locked host inputs and results (lengths, then rows), and
/// their device twins for staged launches.
#[derive(Default)]
struct Scratch {
    xs_h: Option<Pinned<i32>>,
    res_h: Option<Pinned<u32>>,
    xs: Option<CudaSlice<i32>>,
    res: Option<CudaSlice<u32>>,
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

fn ensure_pinned<T: Copy>(
    ctx: &Arc<CudaContext>,
    buf: &mut Option<Pinned<T>>,
    n: usize,
) -> Result<()> {
    if buf.as_ref().is_none_or(|b| b.len < n) {
        *buf = None;
        *buf = Some(Pinned::new(ctx, n.next_power_of_two())?);
    }
    Ok(())
}

/// `dst.copy_from_slice(src)`, over the rayon pool for large copies.
fn par_copy<T: Copy + Send + Sync>(dst: &mut [T], src: &[T]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 18;
    if src.len() < 4 * CHUNK {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    streams: Vec<Arc<CudaStream>>,
    scratch: Vec<Mutex<Scratch>>,
    thread_fn: CudaFunction,
    /// Threads per block of the thread kernel.
    block: u32,
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
            let (thread_name, block) = thread_kernel_choice();
            let thread_fn = module.load_function(&thread_name).map_err(cuda_err)?;
            let warp_fn = module.load_function(KERNEL_WARP).map_err(cuda_err)?;
            let mut st = Vec::new();
            for _ in 0..streams.max(1) {
                st.push(ctx.new_stream().map_err(cuda_err)?);
            }
            let name = format!(
                "cuda:{ordinal} {} (sm_{maj}{min}, {} streams, {thread_name} x {block})",
                ctx.name().unwrap_or_default(),
                st.len()
            );
            let scratch = st.iter().map(|_| Mutex::new(Scratch::default())).collect();
            Ok(CudaDevice {
                ctx,
                scratch,
                streams: st,
                thread_fn,
                block,
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
        // the raw async copies below need the context current on this thread
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let mut scratch = self.scratch[si].lock().expect("scratch lock");
        let sc = &mut *scratch;
        let gm = self.gpu_map(h)?;
        let wdev = self.gpu_weights(&gm, stream, weights)?;
        let rm1 = result_max.max(1);
        let nres = n + n * rm1;
        let zero_copy = n <= zero_copy_max();
        ensure_pinned(&self.ctx, &mut sc.res_h, nres)?;
        let (x0, pgp_num, pgp_mask, pool_id, flags) = match inputs {
            Inputs::Xs(xs) => {
                ensure_pinned(&self.ctx, &mut sc.xs_h, n)?;
                par_copy(sc.xs_h.as_mut().expect("ensured").slice_mut(n), xs);
                (0i32, 0u32, 0u32, 0u32, 0u32)
            }
            Inputs::Pool(p) => {
                let (a, b, c, d) = pool_kernel_params(p);
                (0, a, b, c, d | 2)
            }
        };
        let has_xs: bool = matches!(inputs, Inputs::Xs(_));
        // device addresses of the inputs, lengths and rows
        let (xs_ptr, lens_ptr): (u64, u64) = if zero_copy {
            (
                if has_xs {
                    sc.xs_h.as_ref().expect("ensured").dptr
                } else {
                    0
                },
                sc.res_h.as_ref().expect("ensured").dptr,
            )
        } else {
            ensure(stream, &mut sc.res, nres)?;
            let res_d = {
                let (p, _g) = sc.res.as_ref().expect("ensured").device_ptr(stream);
                p
            };
            let xs_d = if has_xs {
                ensure(stream, &mut sc.xs, n)?;
                let (p, _g) = sc.xs.as_ref().expect("ensured").device_ptr(stream);
                let src = sc.xs_h.as_ref().expect("ensured").slice(n);
                // SAFETY: `p` holds >= n i32; `src` is page-locked and stays
                // untouched until the stream is synchronised below.
                unsafe { cudarc::driver::result::memcpy_htod_async(p, src, stream.cu_stream()) }
                    .map_err(cuda_err)?;
                p
            } else {
                0
            };
            (xs_d, res_d)
        };
        let out_ptr = lens_ptr + 4 * n as u64;
        let n32 = n as u32;
        let rm = result_max as u32;
        let wmax = weights.len() as u32;
        let warp = n <= warp_kernel_max();
        let (func, threads, block) = if warp {
            (&self.warp_fn, n * 32, 128u32)
        } else {
            (&self.thread_fn, n, self.block)
        };
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(block as usize) as u32, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut lb = stream.launch_builder(func);
        lb.arg(&gm.words)
            .arg(&gm.ln)
            .arg(wdev.as_ref())
            .arg(&wmax)
            .arg(&rule)
            .arg(&xs_ptr)
            .arg(&x0)
            .arg(&n32)
            .arg(&rm)
            .arg(&pgp_num)
            .arg(&pgp_mask)
            .arg(&pool_id)
            .arg(&flags)
            .arg(&out_ptr)
            .arg(&lens_ptr);
        // SAFETY: argument list matches the kernel signature in kernels/crush.cu;
        // the pointers address >= n inputs, n lengths and n * result_max rows.
        unsafe { lb.launch(cfg) }.map_err(cuda_err)?;
        if !zero_copy {
            let dst = sc.res_h.as_mut().expect("ensured").slice_mut(nres);
            // SAFETY: device buffer holds >= nres u32 written by the kernel;
            // `dst` is page-locked and read only after the synchronisation.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, lens_ptr, stream.cu_stream()) }
                .map_err(cuda_err)?;
        }
        stream.synchronize().map_err(cuda_err)?;
        let res = sc.res_h.as_ref().expect("ensured").slice(nres);
        let lens_h = res[..n].to_vec();
        let mut out_h = vec![0i32; n * rm1];
        {
            // SAFETY: u32 -> i32 reinterpretation of plain integers.
            let rows: &[i32] =
                unsafe { std::slice::from_raw_parts(res[n..].as_ptr() as *const i32, n * rm1) };
            par_copy(&mut out_h, rows);
        }
        drop(scratch);
        // rows past their length hold stale data from earlier launches
        for (i, &l) in lens_h.iter().enumerate() {
            if l != crate::flat::LEN_FALLBACK && (l as usize) < rm1 {
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
        Ok(m)
    }
}
