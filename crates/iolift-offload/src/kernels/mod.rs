//! Kernels: batchable work with a CPU side and a CUDA side. A kernel is
//! one CUDA file in `crates/iolift-offload/kernels/`, one host module here
//! (its `SOURCE: KernelSource` and a type implementing `Kernel`) and its
//! name in the `kernels!` line below (docs/offload.md, "Adding a kernel").
//!
//! The contract a kernel implements (`Kernel`, `run_batch`) is in
//! `kernel.rs`; the I/O pool (`pool::IoPool`) runs any `Kernel`: it batches
//! tasks (`Input`s), runs a batch on one processing element (`run_batch`)
//! and completes each task with its `Item` or a group with one `Output`.

use crate::cpu::CpuDevice;
use crate::cuda::CudaDevice;
use crate::device::{Device, Launch};
use crate::error::Result;

pub use crate::compile::KernelSource;
pub use crate::kernel::{run_batch, Kernel};

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
