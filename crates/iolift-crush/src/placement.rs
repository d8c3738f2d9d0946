//! Object name -> PG -> OSDs, the client path of `OSDMap::object_locator_to_pg`
//! and `_pg_to_raw_osds` (without upmap / temp overrides).

use crate::hash::{hash32_2, str_hash_rjenkins};
use crate::map::CrushMap;
use crate::mapper::{do_rule, Workspace};
use crate::{CrushError, Result};

/// `ceph_stable_mod(x, b, bmask)`.
pub fn stable_mod(x: u32, b: u32, bmask: u32) -> u32 {
    if (x & bmask) < b {
        x & bmask
    } else {
        x & (bmask >> 1)
    }
}

/// `2^ceil(log2(n)) - 1` (`calc_bits_of(n-1)` mask).
pub fn pg_mask(n: u32) -> u32 {
    if n <= 1 {
        return 0;
    }
    let bits = 32 - (n - 1).leading_zeros();
    if bits >= 32 {
        u32::MAX
    } else {
        (1u32 << bits) - 1
    }
}

/// Pool parameters that affect placement.
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    pub id: i64,
    pub pg_num: u32,
    pub pgp_num: u32,
    pub hashpspool: bool,
}

/// Where an object lands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub raw_hash: u32,
    pub ps: u32,
    pub pps: u32,
    pub osds: Vec<i32>,
}

/// Object name (optionally with a namespace) -> hash, PG, placement seed, OSDs.
pub fn map_object(
    map: &CrushMap,
    pool: &Pool,
    namespace: Option<&str>,
    name: &str,
    rule: i32,
    size: usize,
    weight: &[u32],
) -> Result<Placement> {
    if pool.pg_num == 0 || pool.pgp_num == 0 {
        return Err(CrushError::Invalid("pg_num and pgp_num must be > 0".into()));
    }
    if map.rule(rule).is_none() {
        return Err(CrushError::NoSuchRule(rule));
    }
    let key: Vec<u8> = match namespace {
        Some(ns) if !ns.is_empty() => {
            let mut k = ns.as_bytes().to_vec();
            k.push(0x1f);
            k.extend_from_slice(name.as_bytes());
            k
        }
        _ => name.as_bytes().to_vec(),
    };
    let raw = str_hash_rjenkins(&key);
    let ps = stable_mod(raw, pool.pg_num, pg_mask(pool.pg_num));
    let pps = pg_to_pps(pool, ps);
    let mut out = vec![0; size];
    let mut ws = Workspace::new(map, size);
    let n = do_rule(
        map,
        rule,
        pps as i32,
        &mut out,
        weight,
        &mut ws,
        map.choose_args_for(pool.id),
    );
    out.truncate(n);
    Ok(Placement {
        raw_hash: raw,
        ps,
        pps,
        osds: out,
    })
}

/// `pg_pool_t::raw_pg_to_pps`.
pub fn pg_to_pps(pool: &Pool, ps: u32) -> u32 {
    let m = stable_mod(ps, pool.pgp_num, pg_mask(pool.pgp_num));
    if pool.hashpspool {
        hash32_2(m, pool.id as u32)
    } else {
        m.wrapping_add(pool.id as u32)
    }
}
