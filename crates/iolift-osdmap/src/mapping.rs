//! PG -> OSDs exactly as `OSDMap::_pg_to_up_acting_osds` computes it in
//! Ceph 16.2: the placement seed, the pool's CRUSH rule (`find_rule`),
//! non-existent OSDs removed, pg_upmap / pg_upmap_items (with the checks
//! that make Ceph ignore an upmap), down OSDs removed, the primary and
//! primary affinity, then pg_temp / primary_temp for the acting set.
//! One `Mapper` per thread; `map_pg` is the only placement code path.

use crate::placement::{pg_mask, pg_to_pps, stable_mod, Pool as SeedPool};
use crate::types::{OsdMap, PgId, Pool, DEFAULT_PRIMARY_AFFINITY, ITEM_NONE};
use iolift_crush::hash::{hash32_2, str_hash_rjenkins};
use iolift_crush::{do_rule, Workspace};

/// Where one PG is placed. `raw` is the CRUSH result without
/// non-existent OSDs; `up` has upmaps applied and down OSDs removed;
/// `acting` has the temp mappings applied. Primaries are -1 when none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgPlacement {
    pub raw: Vec<i32>,
    pub raw_primary: i32,
    pub up: Vec<i32>,
    pub up_primary: i32,
    pub acting: Vec<i32>,
    pub acting_primary: i32,
}

/// `CrushWrapper::find_rule` as Pacific uses it: the first rule whose
/// ruleset, type and size range match the pool; -1 when none does.
pub fn find_rule(map: &OsdMap, pool: &Pool) -> i32 {
    let size = pool.size;
    for (i, r) in map.crush.rules.iter().enumerate() {
        if let Some(r) = r {
            if r.ruleset == pool.crush_rule
                && r.rule_type == pool.pool_type
                && r.min_size <= size
                && r.max_size >= size
            {
                return i as i32;
            }
        }
    }
    -1
}

/// `ceph_str_hash_linux` (object_hash 1).
pub fn str_hash_linux(key: &[u8]) -> u32 {
    let mut h: u32 = 0;
    for &c in key {
        let c = c as u32;
        h = h
            .wrapping_add((c << 4).wrapping_add(c >> 4))
            .wrapping_mul(11);
    }
    h
}

/// Object name (and namespace) -> raw hash, as `pg_pool_t::hash_key`.
pub fn object_hash(pool: &Pool, namespace: &str, name: &str) -> crate::Result<u32> {
    let mut key = Vec::with_capacity(namespace.len() + 1 + name.len());
    if !namespace.is_empty() {
        key.extend_from_slice(namespace.as_bytes());
        key.push(0x1f);
    }
    key.extend_from_slice(name.as_bytes());
    match pool.object_hash {
        1 => Ok(str_hash_linux(&key)),
        2 => Ok(str_hash_rjenkins(&key)),
        h => Err(crate::OsdMapError::Invalid(format!(
            "pool {} uses object_hash {h}, which Ceph does not define",
            pool.id
        ))),
    }
}

/// Object -> PG id (`object_locator_to_pg` then `raw_pg_to_pg`).
pub fn object_to_pg(pool: &Pool, namespace: &str, name: &str) -> crate::Result<PgId> {
    let h = object_hash(pool, namespace, name)?;
    Ok(PgId {
        pool: pool.id as u64,
        seed: stable_mod(h, pool.pg_num, pg_mask(pool.pg_num)),
    })
}

/// Maps PGs of one OSDMap; holds the CRUSH workspace and scratch, so a
/// mapping allocates nothing once the vectors have grown.
pub struct Mapper<'a> {
    map: &'a OsdMap,
    ws: Workspace,
    buf: Vec<i32>,
    temp: Vec<i32>,
    any_affinity: bool,
}

impl<'a> Mapper<'a> {
    pub fn new(map: &'a OsdMap) -> Mapper<'a> {
        let any_affinity = map
            .primary_affinity
            .iter()
            .any(|&a| a != DEFAULT_PRIMARY_AFFINITY);
        Mapper {
            map,
            ws: Workspace::new(&map.crush, 16),
            buf: Vec::new(),
            temp: Vec::new(),
            any_affinity,
        }
    }

    pub fn map(&self) -> &'a OsdMap {
        self.map
    }

    /// `_pg_to_raw_osds`: CRUSH, then non-existent OSDs dropped (replicated)
    /// or replaced by NONE (erasure). Returns the placement seed.
    fn raw(&mut self, pool: &Pool, rule: i32, ps: u32, raw: &mut Vec<i32>) -> u32 {
        let m = self.map;
        let pps = Self::pps(pool, ps);
        raw.clear();
        if rule >= 0 {
            let size = pool.size as usize;
            if self.buf.len() < size {
                self.buf.resize(size, 0);
            }
            let n = do_rule(
                &m.crush,
                rule,
                pps as i32,
                &mut self.buf[..size],
                &m.osd_weight,
                &mut self.ws,
                m.crush.choose_args_for(pool.id),
            );
            raw.extend_from_slice(&self.buf[..n]);
        }
        self.drop_missing(pool, raw);
        pps
    }

    /// The placement seed of raw seed `ps` (`raw_pg_to_pps`).
    fn pps(pool: &Pool, ps: u32) -> u32 {
        let seed = SeedPool {
            id: pool.id,
            pg_num: pool.pg_num,
            pgp_num: pool.pgp_num,
            hashpspool: pool.hashpspool(),
        };
        pg_to_pps(&seed, ps)
    }

    /// Non-existent OSDs of a CRUSH result dropped (replicated) or NONE
    /// (erasure).
    fn drop_missing(&self, pool: &Pool, raw: &mut Vec<i32>) {
        let m = self.map;
        if pool.can_shift_osds() {
            raw.retain(|&o| m.exists(o));
        } else {
            for o in raw.iter_mut() {
                if !m.exists(*o) {
                    *o = ITEM_NONE;
                }
            }
        }
    }

    /// Ceph's target check for upmaps: an id in the map whose reweight is 0.
    fn marked_out(&self, osd: i32) -> bool {
        osd != ITEM_NONE && osd >= 0 && osd < self.map.max_osd && self.map.weight(osd) == 0
    }

    /// `_apply_upmap`.
    fn apply_upmap(&self, pg: PgId, set: &mut Vec<i32>) {
        let m = self.map;
        if let Some(targets) = m.pg_upmap.get(&pg) {
            if targets.iter().any(|&o| self.marked_out(o)) {
                return;
            }
            set.clear();
            set.extend_from_slice(targets);
        }
        if let Some(items) = m.pg_upmap_items.get(&pg) {
            for &(from, to) in items {
                let mut exists = false;
                let mut pos = None;
                for (i, &o) in set.iter().enumerate() {
                    if o == to {
                        exists = true;
                        break;
                    }
                    if o == from && pos.is_none() && !self.marked_out(to) {
                        pos = Some(i);
                    }
                }
                if let (false, Some(i)) = (exists, pos) {
                    set[i] = to;
                }
            }
        }
    }

    /// `_apply_primary_affinity`.
    fn apply_affinity(&self, pps: u32, pool: &Pool, up: &mut [i32], primary: &mut i32) {
        let m = self.map;
        if !self.any_affinity
            || !up
                .iter()
                .any(|&o| o != ITEM_NONE && m.primary_affinity_of(o) != DEFAULT_PRIMARY_AFFINITY)
        {
            return;
        }
        let mut pos: Option<usize> = None;
        for (i, &o) in up.iter().enumerate() {
            if o == ITEM_NONE {
                continue;
            }
            let a = m.primary_affinity_of(o);
            if a < DEFAULT_PRIMARY_AFFINITY && (hash32_2(pps, o as u32) >> 16) >= a {
                if pos.is_none() {
                    pos = Some(i);
                }
            } else {
                pos = Some(i);
                break;
            }
        }
        let Some(pos) = pos else { return };
        *primary = up[pos];
        if pool.can_shift_osds() && pos > 0 {
            up.copy_within(0..pos, 1);
            up[0] = *primary;
        }
    }

    /// Place one PG of `pool` (`rule` from [`find_rule`]). A raw seed at or
    /// beyond pg_num is placed as Ceph does: CRUSH with its own seed,
    /// upmaps and temps of the PG it folds into.
    pub fn map_pg(&mut self, pool: &Pool, rule: i32, seed: u32, out: &mut PgPlacement) {
        let mut raw = std::mem::take(&mut out.raw);
        let pps = self.raw(pool, rule, seed, &mut raw);
        self.finish(pool, seed, pps, raw, out);
    }

    /// Place one PG whose CRUSH result (`do_rule` of the pool's rule for
    /// its placement seed, `pool.size` slots at most) was computed
    /// elsewhere, e.g. by the offload kernel: the same steps as
    /// [`Mapper::map_pg`] after CRUSH.
    pub fn map_pg_crush(&mut self, pool: &Pool, seed: u32, crush: &[i32], out: &mut PgPlacement) {
        let mut raw = std::mem::take(&mut out.raw);
        raw.clear();
        raw.extend_from_slice(crush);
        self.drop_missing(pool, &mut raw);
        self.finish(pool, seed, Self::pps(pool, seed), raw, out);
    }

    /// Upmaps, up set, primary affinity and temps over `raw`.
    fn finish(&mut self, pool: &Pool, seed: u32, pps: u32, raw: Vec<i32>, out: &mut PgPlacement) {
        let m = self.map;
        let pg = PgId {
            pool: pool.id as u64,
            seed: if seed < pool.pg_num {
                seed
            } else {
                stable_mod(seed, pool.pg_num, pg_mask(pool.pg_num))
            },
        };
        out.raw_primary = first(&raw);

        // up: upmaps over a copy of raw, then down / missing OSDs out
        let mut up = std::mem::take(&mut out.up);
        up.clear();
        up.extend_from_slice(&raw);
        self.apply_upmap(pg, &mut up);
        if pool.can_shift_osds() {
            up.retain(|&o| m.is_up(o));
        } else {
            for o in up.iter_mut() {
                if !m.is_up(*o) {
                    *o = ITEM_NONE;
                }
            }
        }
        let mut up_primary = first(&up);
        self.apply_affinity(pps, pool, &mut up, &mut up_primary);

        // acting: pg_temp / primary_temp (`_get_temp_osds`)
        let temp = &mut self.temp;
        temp.clear();
        if let Some(t) = m.pg_temp.get(&pg) {
            for &o in t {
                if m.is_up(o) {
                    temp.push(o);
                } else if !pool.can_shift_osds() {
                    temp.push(ITEM_NONE);
                }
            }
        }
        let mut acting_primary = match m.primary_temp.get(&pg) {
            Some(&p) => p,
            None => first(temp),
        };
        let mut acting = std::mem::take(&mut out.acting);
        acting.clear();
        if temp.is_empty() {
            acting.extend_from_slice(&up);
            if acting_primary == -1 {
                acting_primary = up_primary;
            }
        } else {
            acting.extend_from_slice(temp);
        }
        out.raw = raw;
        out.up = up;
        out.up_primary = up_primary;
        out.acting = acting;
        out.acting_primary = acting_primary;
    }

    /// Place any PG id (`pg_to_up_acting_osds`): a missing pool gives
    /// empty sets.
    pub fn map_pgid(&mut self, pg: PgId, out: &mut PgPlacement) {
        let map = self.map;
        match map.pools.get(&(pg.pool as i64)) {
            Some(pool) => {
                let rule = find_rule(map, pool);
                self.map_pg(pool, rule, pg.seed, out);
            }
            _ => {
                *out = PgPlacement {
                    raw_primary: -1,
                    up_primary: -1,
                    acting_primary: -1,
                    ..PgPlacement::default()
                };
            }
        }
    }
}

/// First entry that is not NONE, or -1 (`_pick_primary`).
fn first(v: &[i32]) -> i32 {
    v.iter().copied().find(|&o| o != ITEM_NONE).unwrap_or(-1)
}
