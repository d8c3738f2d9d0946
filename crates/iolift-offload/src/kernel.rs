//! The kernel contract: what one task takes and gives, how a batch runs on
//! each kind of device (`Kernel`), and `run_batch`, which runs one batch on
//! one processing element of any device. The I/O pool (`pool::IoPool`) is
//! generic over `Kernel`; the kernels themselves live in `kernels/`.

use crate::cpu::CpuDevice;
use crate::cuda::CudaDevice;
use crate::device::{Device, Launch};
use crate::error::Result;

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
    job.out
        .unwrap_or_else(|| Err(crate::device::no_launch(dev)))
}
