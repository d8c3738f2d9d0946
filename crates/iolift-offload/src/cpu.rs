//! The CPU device: a pool of worker threads, one processing element per
//! thread. A kernel's CPU side runs a batch on the calling thread (one
//! processing element) or spreads it over the workers with `install`.

use crate::error::{OffloadError, Result};

pub struct CpuDevice {
    pool: rayon::ThreadPool,
    workers: usize,
}

impl CpuDevice {
    /// `workers` threads (0 = one per CPU).
    pub fn new(workers: usize) -> Result<CpuDevice> {
        let workers = if workers == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            workers
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .thread_name(|i| format!("iolift-pe{i}"))
            .build()
            .map_err(|e| OffloadError::Invalid(format!("cpu pool: {e}")))?;
        Ok(CpuDevice { pool, workers })
    }

    /// Worker threads (processing elements).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Run `f` inside the worker pool: rayon parallel iterators in `f` use
    /// this device's workers.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}
