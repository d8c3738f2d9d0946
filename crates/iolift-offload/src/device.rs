//! Devices: where batches run. `Device` is what the I/O pool and callers
//! hold (`Arc<dyn Device>`); a kernel reaches the concrete device through
//! `Launch`, the one place where a device type meets a kernel: each device
//! calls the `Launch` method for its own kind.
//!
//! The CPU device is a pool of worker threads (`cpu.rs`), the CUDA device
//! the streams of one GPU with the driver loaded at run time (`cuda/`).
//! Neither module knows about this trait or about any kernel.

use crate::cpu::CpuDevice;
use crate::cuda::CudaDevice;
use crate::error::{OffloadError, Result};
use std::sync::Arc;

/// A device: a set of processing elements that run batches.
pub trait Device: Send + Sync + 'static {
    /// What it is, for reports ("cpu (16 worker threads)", "cuda:0 ...").
    fn name(&self) -> String;
    /// Processing elements: CPU workers or CUDA streams.
    fn processing_elements(&self) -> usize;
    fn is_gpu(&self) -> bool;
    /// Hand `job` this device: calls `job.on_cpu` or `job.on_cuda`.
    fn launch(&self, job: &mut dyn Launch);
}

/// Work that can run on each kind of device (see `kernel::run_batch`).
pub trait Launch {
    fn on_cpu(&mut self, cpu: &CpuDevice);
    fn on_cuda(&mut self, gpu: &CudaDevice);
}

impl Device for CpuDevice {
    fn name(&self) -> String {
        format!("cpu ({} worker threads)", self.workers())
    }
    fn processing_elements(&self) -> usize {
        self.workers()
    }
    fn is_gpu(&self) -> bool {
        false
    }
    fn launch(&self, job: &mut dyn Launch) {
        job.on_cpu(self)
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        CudaDevice::name(self)
    }
    fn processing_elements(&self) -> usize {
        self.streams()
    }
    fn is_gpu(&self) -> bool {
        true
    }
    fn launch(&self, job: &mut dyn Launch) {
        job.on_cuda(self)
    }
}

/// The CPU device with `workers` threads (0 = one per CPU).
pub fn cpu(workers: usize) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(CpuDevice::new(workers)?))
}

/// GPU `ordinal` with `streams` processing elements. Without a driver or
/// GPU: `OffloadError::NoGpu` with the reason.
pub fn cuda(ordinal: usize, streams: usize) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(CudaDevice::new(ordinal, streams)?))
}

/// "cpu", "cpu:N" (N workers), "gpu", "cuda", "gpu:N" (GPU ordinal);
/// `pes` processing elements (CPU workers when no N is given, 0 = one per
/// CPU; CUDA streams, at least 1).
pub fn open(spec: &str, pes: usize) -> Result<Arc<dyn Device>> {
    let (kind, arg) = spec.split_once(':').unwrap_or((spec, ""));
    let num = |d: usize| -> Result<usize> {
        if arg.is_empty() {
            Ok(d)
        } else {
            arg.parse()
                .map_err(|_| OffloadError::Invalid(format!("bad device '{spec}'")))
        }
    };
    match kind {
        "cpu" => cpu(num(pes)?),
        "gpu" | "cuda" => cuda(num(0)?, pes.max(1)),
        _ => Err(OffloadError::Invalid(format!(
            "unknown device '{spec}' (cpu, cpu:N, gpu, gpu:N)"
        ))),
    }
}

/// The error for a [`Launch`] that `dev` never ran (its result is unset).
pub(crate) fn no_launch(dev: &dyn Device) -> crate::OffloadError {
    crate::OffloadError::Invalid(format!("{} ran no launch", dev.name()))
}
