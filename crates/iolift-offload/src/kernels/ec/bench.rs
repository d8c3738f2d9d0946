//! GPU erasure-coding timings and the device-resident round trip: encode
//! GB/s (data bytes in per second) with the data already in device memory
//! (`encode_resident`, launches only) and from host memory (the pool's
//! path: page-locked staging, copy in, launch, copy out), checked against
//! the CPU codec. Both need the CUDA device: on the CPU device they are an
//! error that says so.

use super::{encode_resident, EcKernel, Stripes};
use crate::cpu::CpuDevice;
use crate::cuda::{cuda_err, CudaDevice};
use crate::device::{Device, Launch};
use crate::error::{OffloadError, Result};
use crate::kernel::Kernel;
use std::time::{Duration, Instant};

/// One timing: `gbps` data GB/s (10^9 bytes) over `iters` launches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub gbps: f64,
    pub iters: u64,
}

/// Encode rates of one kernel and batch size on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuBench {
    pub device: String,
    /// Data in device memory.
    pub resident: Rate,
    /// Data in host memory (copies included).
    pub host: Rate,
    /// Both paths' parity equals the CPU codec's (every byte).
    pub matches_cpu: bool,
}

/// Run `f` with the CUDA device behind `dev`, or fail naming the device.
fn on_gpu<T>(dev: &dyn Device, f: impl FnOnce(&CudaDevice) -> Result<T>) -> Result<T> {
    struct Job<F, T> {
        f: Option<F>,
        out: Option<Result<T>>,
    }
    impl<T, F: FnOnce(&CudaDevice) -> Result<T>> Launch for Job<F, T> {
        fn on_cpu(&mut self, cpu: &CpuDevice) {
            let _ = cpu;
            self.out = Some(Err(OffloadError::NoGpu(
                "this needs the CUDA device, not the CPU device".into(),
            )));
        }
        fn on_cuda(&mut self, gpu: &CudaDevice) {
            if let Some(f) = self.f.take() {
                self.out = Some(f(gpu));
            }
        }
    }
    let mut job = Job {
        f: Some(f),
        out: None,
    };
    dev.launch(&mut job);
    job.out
        .unwrap_or_else(|| Err(crate::device::no_launch(dev)))
}

/// `data` (whole stripes) uploaded, encoded by `encode_resident` on
/// processing element 0, the output copied back.
pub fn resident_round_trip(dev: &dyn Device, k: &EcKernel, data: &[u8]) -> Result<Vec<u8>> {
    let stripes = data.len() / k.stripe_bytes();
    if stripes * k.stripe_bytes() != data.len() {
        return Err(OffloadError::Invalid("not whole stripes".into()));
    }
    on_gpu(dev, |gpu| {
        let s = gpu.stream(0);
        let d = s.clone_htod(data).map_err(cuda_err)?;
        let mut o = s
            .alloc_zeros::<u8>((stripes * k.rows() * k.chunk_len()).max(1))
            .map_err(cuda_err)?;
        encode_resident(gpu, 0, k, &d, &mut o, stripes)?;
        let mut v = s.clone_dtoh(&o).map_err(cuda_err)?;
        v.truncate(stripes * k.rows() * k.chunk_len());
        Ok(v)
    })
}

/// Time `k` over `stripes` stripes of pseudo-random data for about `ms`
/// milliseconds per path on the GPU behind `dev`.
pub fn gpu_encode(dev: &dyn Device, k: &EcKernel, stripes: usize, ms: u64) -> Result<GpuBench> {
    k.gpu_supported()?;
    let n = stripes * k.stripe_bytes();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let cpu = CpuDevice::new(1)?;
    let task: Stripes = data.into();
    let want = k.run_cpu(&cpu, std::slice::from_ref(&task))?;
    let budget = Duration::from_millis(ms.max(1));
    on_gpu(dev, |gpu| {
        let s = gpu.stream(0);
        let d = s.clone_htod(&task[..]).map_err(cuda_err)?;
        let out_len = stripes * k.rows() * k.chunk_len();
        let mut o = s.alloc_zeros::<u8>(out_len.max(1)).map_err(cuda_err)?;
        // warm-up: module, tables, buffers
        encode_resident(gpu, 0, k, &d, &mut o, stripes)?;
        let mut res = s.clone_dtoh(&o).map_err(cuda_err)?;
        res.truncate(out_len);
        let resident = time(budget, n, || {
            encode_resident(gpu, 0, k, &d, &mut o, stripes)
        })?;
        let staged = k.run_cuda(gpu, 0, std::slice::from_ref(&task))?;
        let host = time(budget, n, || {
            k.run_cuda(gpu, 0, std::slice::from_ref(&task)).map(drop)
        })?;
        Ok(GpuBench {
            device: gpu.name(),
            resident,
            host,
            matches_cpu: res == want.bytes && staged.bytes == want.bytes,
        })
    })
}

/// Repeat `f` for `budget`; `bytes` of data per call.
fn time(budget: Duration, bytes: usize, mut f: impl FnMut() -> Result<()>) -> Result<Rate> {
    let t0 = Instant::now();
    let mut iters = 0u64;
    while iters == 0 || t0.elapsed() < budget {
        f()?;
        iters += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(Rate {
        gbps: bytes as f64 * iters as f64 / secs / 1e9,
        iters,
    })
}
