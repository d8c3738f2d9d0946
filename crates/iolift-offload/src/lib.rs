//! iolift offload engine: a device abstraction (CPU worker pool, CUDA GPU
//! loaded at run time), an I/O pool that batches tasks onto processing
//! elements and completes them through futures or callbacks, and CRUSH
//! mapping on either device, bit-exact with `iolift-crush` (docs/offload.md).

pub mod bench;
pub mod crushtest;
pub mod cuda;
pub mod device;
mod error;
pub mod flat;
pub mod kernel;
pub mod pool;
pub mod synth;

pub use device::{Device, Inputs, MapHandle, Mapping};
pub use error::{OffloadError, Result};
pub use pool::{Completion, GroupCompletion, IoPool, PoolConfig};
