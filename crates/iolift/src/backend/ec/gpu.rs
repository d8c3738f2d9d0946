//! `device=gpu`: parity of whole-chunk stripes computed by the offload
//! engine's erasure-coding kernel in an I/O pool, so that many stripes
//! written at once (deep queues) are encoded in one launch. Column ranges
//! smaller than a chunk (small read-modify-writes) stay on the CPU.
//!
//! The device is the CUDA GPU; `IOLIFT_EC_GPU_DEVICE=cpu` runs the same
//! pool on the offload engine's CPU device (a dry run where there is no
//! GPU, as `iolift ec --device gpu` does).

use crate::block::Errno;
use anyhow::{Context, Result};
use iolift_ec::Codec;
use iolift_offload::kernels::ec::EcKernel;
use iolift_offload::{IoPool, PoolConfig};
use std::sync::Arc;
use std::time::Duration;

/// Stripes per launch at most (memory: this x (k+m) x chunk staged).
const MAX_BATCH: usize = 64;

pub struct Gpu {
    pool: IoPool<EcKernel>,
}

impl Gpu {
    pub fn open(codec: Arc<Codec>, chunk: usize) -> Result<Gpu> {
        let spec = std::env::var("IOLIFT_EC_GPU_DEVICE").unwrap_or_else(|_| "gpu".into());
        let dev = iolift_offload::device::open(&spec, 2).map_err(|e| {
            anyhow::anyhow!("backend ec: device=gpu: no CUDA device/driver found ({e})")
        })?;
        let kernel = EcKernel::encoder(codec, chunk)
            .map_err(|e| anyhow::anyhow!("backend ec: device=gpu: {e}"))?;
        if dev.is_gpu() {
            kernel
                .gpu_supported()
                .map_err(|e| anyhow::anyhow!("backend ec: device=gpu: {e}"))?;
        }
        let cfg = PoolConfig {
            max_batch: MAX_BATCH,
            max_wait: Duration::from_micros(20),
            pes: 0,
        };
        let pool = IoPool::new(dev, kernel, cfg).context("backend ec: device=gpu: I/O pool")?;
        Ok(Gpu { pool })
    }

    /// The m parity chunks of one stripe (k chunks back to back).
    pub async fn encode(&self, stripe: &[u8]) -> Result<Vec<u8>, Errno> {
        self.pool.submit(Arc::from(stripe)).await.map_err(|e| {
            tracing::error!("ec: device=gpu: encode failed: {e}");
            Errno::EIO
        })
    }
}
