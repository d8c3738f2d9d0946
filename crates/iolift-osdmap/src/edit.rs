//! In-memory edits of an OSDMap (what-if changes and test set-ups); the
//! result encodes to a map Ceph's tools read.

use crate::types::{OsdMap, Pool, DEFAULT_PRIMARY_AFFINITY, OSD_EXISTS, OSD_IN, OSD_OUT, OSD_UP};
use crate::{OsdMapError, Result};

impl OsdMap {
    fn check_osd(&self, osd: i32) -> Result<usize> {
        if osd < 0 || osd >= self.max_osd {
            return Err(OsdMapError::Invalid(format!(
                "osd.{osd} is not in the map (max_osd {})",
                self.max_osd
            )));
        }
        Ok(osd as usize)
    }

    /// Reweight to 0 (`ceph osd out`).
    pub fn mark_out(&mut self, osd: i32) -> Result<()> {
        let i = self.check_osd(osd)?;
        self.osd_weight[i] = OSD_OUT;
        Ok(())
    }

    /// Set the reweight (16.16; 0x10000 = in).
    pub fn set_weight(&mut self, osd: i32, weight: u32) -> Result<()> {
        let i = self.check_osd(osd)?;
        self.osd_weight[i] = weight.min(OSD_IN);
        Ok(())
    }

    /// The OSD exists and is up and fully in.
    pub fn mark_up_in(&mut self, osd: i32) -> Result<()> {
        let i = self.check_osd(osd)?;
        self.osd_state[i] |= OSD_EXISTS | OSD_UP;
        self.osd_weight[i] = OSD_IN;
        Ok(())
    }

    /// The OSD is down (it still exists).
    pub fn mark_down(&mut self, osd: i32) -> Result<()> {
        let i = self.check_osd(osd)?;
        self.osd_state[i] &= !OSD_UP;
        Ok(())
    }

    /// Primary affinity (16.16, 0..=0x10000); creates the vector (all at
    /// the default) when the map carries none.
    pub fn set_primary_affinity(&mut self, osd: i32, affinity: u32) -> Result<()> {
        let i = self.check_osd(osd)?;
        if affinity > DEFAULT_PRIMARY_AFFINITY {
            return Err(OsdMapError::Invalid(format!(
                "primary affinity {affinity:#x} above 0x10000"
            )));
        }
        if self.primary_affinity.is_empty() {
            self.primary_affinity = vec![DEFAULT_PRIMARY_AFFINITY; self.max_osd as usize];
        }
        self.primary_affinity[i] = affinity;
        Ok(())
    }

    /// Add pool `id` named `name`, a copy of pool `like` (its encoding
    /// and every field not given here) with another type, size, rule and
    /// PG count.
    #[allow(clippy::too_many_arguments)]
    pub fn add_pool_like(
        &mut self,
        like: i64,
        id: i64,
        name: &str,
        pool_type: u8,
        size: u8,
        crush_rule: u8,
        pg_num: u32,
    ) -> Result<()> {
        if self.pools.contains_key(&id) || id < 0 {
            return Err(OsdMapError::Invalid(format!(
                "pool {id} exists or is negative"
            )));
        }
        if !(pool_type == 1 || pool_type == 3) || pg_num == 0 || size == 0 {
            return Err(OsdMapError::Invalid(format!(
                "pool type {pool_type} (1 or 3), size {size}, pg_num {pg_num} (> 0)"
            )));
        }
        let src = self
            .pools
            .get(&like)
            .ok_or_else(|| OsdMapError::Invalid(format!("there is no pool {like}")))?;
        let p = Pool {
            id,
            name: name.to_string(),
            pool_type,
            size,
            min_size: if pool_type == 1 {
                size - size / 2
            } else {
                size
            },
            crush_rule,
            pg_num,
            pgp_num: pg_num,
            ..src.clone()
        };
        self.pools.insert(id, p);
        let names = &mut self.enc.pool_names;
        names.retain(|(i, _)| *i != id);
        names.push((id, name.to_string()));
        names.sort_by_key(|(i, _)| *i);
        self.pool_max = self.pool_max.max(id as i32);
        Ok(())
    }
}
