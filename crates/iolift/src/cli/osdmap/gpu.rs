//! `--device gpu` for `--test-map-pgs*`: the raw CRUSH set of every PG is
//! computed by the offload engine's CRUSH kernel (`kernels/crush.cu`,
//! through `iolift_offload::kernels::crush::map`), in batches of at most
//! `BATCH` PGs; upmaps, the up set, primary affinity and temps are then
//! applied on the CPU by the same `Mapper` code as `--device cpu`
//! (`Mapper::map_pg_crush`). Without a usable GPU the command fails with
//! the reason; nothing falls back to the CPU silently.

use anyhow::{bail, Context, Result};
use iolift_offload::device::Device;
use iolift_offload::kernels::crush::{self, Inputs, MapHandle, Mapping};
use iolift_osdmap::placement::{pg_to_pps, Pool as SeedPool};
use iolift_osdmap::types::{OsdMap, Pool};
use std::sync::Arc;

/// PGs per kernel batch: the batch's results take `BATCH x size x 4`
/// bytes (12 MiB for size 3), whatever the pool's PG count.
pub const BATCH: u32 = 1 << 20;

pub struct Gpu {
    dev: Arc<dyn Device>,
}

/// The GPU for `--device`, or None for the CPU.
pub fn open(device: &str) -> Result<Option<Gpu>> {
    match device {
        "cpu" => Ok(None),
        "gpu" => {
            let dev = iolift_offload::device::open("gpu", 1)
                .context("--device gpu: no usable GPU (use --device cpu)")?;
            if !dev.is_gpu() {
                bail!("--device gpu: {} is not a GPU", dev.name());
            }
            Ok(Some(Gpu { dev }))
        }
        d => bail!("--device {d}: expected cpu or gpu"),
    }
}

impl Gpu {
    /// The CRUSH results of seeds `start..end` of `pool` (rule `rule`),
    /// row `i` for seed `start + i`.
    pub fn rows(
        &self,
        map: &OsdMap,
        pool: &Pool,
        rule: i32,
        start: u32,
        end: u32,
    ) -> Result<Mapping> {
        let h = MapHandle::new(map.crush.clone(), Some(pool.id))
            .context("preparing the crush map for the GPU")?;
        let seed = SeedPool {
            id: pool.id,
            pg_num: pool.pg_num,
            pgp_num: pool.pgp_num,
            hashpspool: pool.hashpspool(),
        };
        let xs: Vec<i32> = (start..end).map(|s| pg_to_pps(&seed, s) as i32).collect();
        crush::map(
            &*self.dev,
            &h,
            rule,
            Inputs::Xs(&xs),
            pool.size as usize,
            &map.osd_weight,
        )
        .with_context(|| format!("mapping pool {} on {}", pool.id, self.dev.name()))
    }
}
