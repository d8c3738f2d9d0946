//! CRUSH on the CUDA device: the kernels of `crush.cu` loaded once per
//! device, each map uploaded once and reused, per-stream page-locked and
//! device buffers, zero-copy launches for small batches and staged copies
//! for large ones, inputs the kernel hands back recomputed on the host.

use super::flat::LEN_FALLBACK;
use super::{fix_fallbacks, kernel_fits, pool_kernel_params, Batch, Inputs, MapHandle, Mapping};
use super::{KERNEL_THREAD, KERNEL_WARP, SOURCE};
use crate::cuda::mem::{ensure, ensure_pinned, par_copy, Pinned};
use crate::cuda::{cuda_err, CudaDevice};
use crate::error::Result;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
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

/// Which thread kernel `IOLIFT_THREAD_KERNEL` / `IOLIFT_BLOCK` pick, for
/// reports: "crush_map_thread x 128".
pub fn thread_kernel_name() -> String {
    let (name, block) = thread_kernel_choice();
    format!("{name} x {block}")
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

/// What CRUSH keeps on one CUDA device (`CudaDevice::state`).
struct CrushCuda {
    thread_fn: CudaFunction,
    /// Threads per block of the thread kernel.
    block: u32,
    warp_fn: CudaFunction,
    scratch: Vec<Mutex<Scratch>>,
    maps: Mutex<HashMap<u64, Arc<GpuMap>>>,
}

impl CrushCuda {
    fn new(gpu: &CudaDevice) -> Result<CrushCuda> {
        // do_rule keeps ~1 KiB of per-thread state (result/work arrays,
        // sparse permutation) in non-inlined frames: give the stack room.
        let _ = gpu
            .context()
            .set_limit(cudarc::driver::sys::CUlimit::CU_LIMIT_STACK_SIZE, 4096);
        let module = gpu.module(&SOURCE)?;
        let (thread_name, block) = thread_kernel_choice();
        Ok(CrushCuda {
            thread_fn: module.load_function(&thread_name).map_err(cuda_err)?,
            block,
            warp_fn: module.load_function(KERNEL_WARP).map_err(cuda_err)?,
            scratch: (0..gpu.streams())
                .map(|_| Mutex::new(Scratch::default()))
                .collect(),
            maps: Mutex::new(HashMap::new()),
        })
    }

    /// Upload (once) and return the device copy of `h`'s flat map.
    fn gpu_map(&self, gpu: &CudaDevice, h: &MapHandle) -> Result<Arc<GpuMap>> {
        let mut maps = self.maps.lock().expect("map cache lock");
        if let Some(m) = maps.get(&h.flat.id) {
            return Ok(m.clone());
        }
        let s = gpu.stream(0);
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

    fn map(&self, gpu: &CudaDevice, pe: usize, b: &Batch) -> Result<Mapping> {
        let Batch {
            h,
            rule,
            inputs,
            result_max,
            weights,
        } = *b;
        let n = inputs.len();
        if n == 0 {
            return Ok(Mapping::zeroed(0, result_max));
        }
        if !kernel_fits(result_max) || n > u32::MAX as usize / 32 {
            let mut m = Mapping::zeroed(n, result_max);
            m.lens.fill(LEN_FALLBACK);
            fix_fallbacks(b, &mut m);
            return Ok(m);
        }
        let si = pe % gpu.streams();
        let stream = gpu.stream(si);
        let ctx = gpu.context();
        // the raw async copies below need the context current on this thread
        ctx.bind_to_thread().map_err(cuda_err)?;
        let mut scratch = self.scratch[si].lock().expect("scratch lock");
        let sc = &mut *scratch;
        let gm = self.gpu_map(gpu, h)?;
        let wdev = self.gpu_weights(&gm, stream, weights)?;
        let rm1 = result_max.max(1);
        let nres = n + n * rm1;
        let zero_copy = n <= zero_copy_max();
        ensure_pinned(ctx, &mut sc.res_h, nres)?;
        let (x0, pgp_num, pgp_mask, pool_id, flags) = match inputs {
            Inputs::Xs(xs) => {
                ensure_pinned(ctx, &mut sc.xs_h, n)?;
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
                    sc.xs_h.as_ref().expect("ensured").dptr()
                } else {
                    0
                },
                sc.res_h.as_ref().expect("ensured").dptr(),
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
        // SAFETY: argument list matches the kernel signature in crush.cu;
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
            if l != LEN_FALLBACK && (l as usize) < rm1 {
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
        fix_fallbacks(b, &mut m);
        Ok(m)
    }
}

/// Map a batch on processing element `pe` of `gpu` (one launch).
pub(super) fn map(gpu: &CudaDevice, pe: usize, b: &Batch) -> Result<Mapping> {
    let state = gpu.state(CrushCuda::new)?;
    state.map(gpu, pe, b)
}
