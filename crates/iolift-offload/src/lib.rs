//! iolift offload engine: devices behind one trait (a CPU worker pool, a
//! CUDA GPU loaded at run time), batchable kernels with a CPU side and a
//! CUDA side, and an I/O pool that batches any kernel's tasks onto the
//! device's processing elements and completes them through futures or
//! callbacks. CRUSH placement is the first kernel, bit-exact with
//! `iolift-crush` (docs/offload.md).

mod compile;
pub mod cpu;
pub mod cuda;
pub mod device;
mod error;
pub mod kernel;
pub mod kernels;
pub mod nvrtc;
pub mod pool;

pub use compile::{cache_dir, cached_ptx, source_hash, CacheHit, KernelSource};
pub use cpu::CpuDevice;
pub use cuda::CudaDevice;
pub use device::{Device, Launch};
pub use error::{OffloadError, Result};
pub use kernel::Kernel;
pub use kernels::crush::{CrushKernel, Inputs, MapHandle, Mapping};
pub use pool::{Completion, GroupCompletion, IoPool, PoolConfig, PoolStats};
