//! Kernels: batchable work with a CPU side and a CUDA side. A kernel is
//! one CUDA file in `crates/iolift-offload/kernels/`, one host module here
//! (its `SOURCE: KernelSource` and a type implementing `Kernel`) and its
//! name in the `kernels!` line below (docs/offload.md, "Adding a kernel").
//!
//! The I/O pool (`pool::IoPool`) runs any `Kernel`: it batches tasks
//! (`Input`s), runs a batch on one processing element (`run_batch`) and
//! completes each task with its `Item` or a group with one `Output`.

use crate::cpu::CpuDevice;
use crate::cuda::CudaDevice;
use crate::device::{Device, Launch};
use crate::error::Result;

pub use crate::compile::KernelSource;

/// Declares the kernel modules and `ALL`, the list of their sources.
macro_rules! kernels {
    ($($name:ident),* $(,)?) => {
        $(pub mod $name;)*
        /// Every kernel's CUDA source, in registration order (tests compile
        /// each with NVRTC and g++; `iolift offload kernels` lists them).
        pub const ALL: &[&KernelSource] = &[$(&$name::SOURCE),*];
    };
}

// The registration line: one name per kernel module.
kernels!(crush, ec);

/// A batchable kernel: what one task takes and gives, and how a batch of
/// tasks runs on each kind of device.
pub trait Kernel: Send + Sync + 'static {
    /// One task's input.
    type Input: Clone + Send + Sync + 'static;
    /// The results of a batch, in input order.
    type Output: Send + 'static;
    /// One task's result.
    type Item: Send + 'static;

    /// Run `inputs` as one batch on the calling thread (one CPU processing
    /// element).
    fn run_cpu(&self, cpu: &CpuDevice, inputs: &[Self::Input]) -> Result<Self::Output>;
    /// Run `inputs` as one launch on the stream of processing element `pe`.
    fn run_cuda(&self, gpu: &CudaDevice, pe: usize, inputs: &[Self::Input])
        -> Result<Self::Output>;
    /// Result `i` of a batch (completes a single task).
    fn item(&self, out: &Self::Output, i: usize) -> Self::Item;
    /// An output with room for `n` results, to be filled by `copy_rows`
    /// (a group's buffer).
    fn alloc(&self, n: usize) -> Self::Output;
    /// Results `from..from + len` of `src` into `at..at + len` of `dst`.
    fn copy_rows(
        &self,
        dst: &mut Self::Output,
        at: usize,
        src: &Self::Output,
        from: usize,
        len: usize,
    );
}

/// Run `inputs` as one batch of kernel `k` on processing element `pe` of
/// `dev`.
pub fn run_batch<K: Kernel>(
    dev: &dyn Device,
    pe: usize,
    k: &K,
    inputs: &[K::Input],
) -> Result<K::Output> {
    struct Job<'a, K: Kernel> {
        k: &'a K,
        pe: usize,
        inputs: &'a [K::Input],
        out: Option<Result<K::Output>>,
    }
    impl<K: Kernel> Launch for Job<'_, K> {
        fn on_cpu(&mut self, cpu: &CpuDevice) {
            self.out = Some(self.k.run_cpu(cpu, self.inputs));
        }
        fn on_cuda(&mut self, gpu: &CudaDevice) {
            self.out = Some(self.k.run_cuda(gpu, self.pe, self.inputs));
        }
    }
    let mut job = Job {
        k,
        pe,
        inputs,
        out: None,
    };
    dev.launch(&mut job);
    job.out.unwrap_or_else(|| {
        Err(crate::OffloadError::Invalid(format!(
            "{} ran no launch",
            dev.name()
        )))
    })
}

/// Get every registered kernel ready on `dev`: on a GPU, compile (or take
/// from the PTX cache) and load each module; the CPU needs nothing. One
/// `(kernel name, result)` per kernel, for `iolift offload info`.
pub fn prepare_all(dev: &dyn Device) -> Vec<(&'static str, Result<()>)> {
    struct Prepare(Vec<(&'static str, Result<()>)>);
    impl Launch for Prepare {
        fn on_cpu(&mut self, _cpu: &CpuDevice) {
            self.0 = ALL.iter().map(|k| (k.name, Ok(()))).collect();
        }
        fn on_cuda(&mut self, gpu: &CudaDevice) {
            self.0 = ALL
                .iter()
                .map(|k| (k.name, gpu.module(k).map(drop)))
                .collect();
        }
    }
    let mut p = Prepare(Vec::new());
    dev.launch(&mut p);
    p.0
}
