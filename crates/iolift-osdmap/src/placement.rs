//! Object name -> PG -> OSDs, the client path of `OSDMap::object_locator_to_pg`
//! and `_pg_to_raw_osds` (without upmap / temp overrides).

use crate::{OsdMapError, Result};
use iolift_crush::hash::{hash32_2, str_hash_rjenkins};
use iolift_crush::{do_rule, CrushMap, Workspace};

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
        return Err(OsdMapError::Invalid(
            "pg_num and pgp_num must be > 0".into(),
        ));
    }
    if map.rule(rule).is_none() {
        return Err(OsdMapError::NoSuchRule(rule));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `stable_mod` always lands in 0..b, equals x % b when b is a power of
    /// two, and never moves an x whose masked value is already below b.
    #[test]
    fn stable_mod_stays_in_range() {
        for b in 1u32..300 {
            let m = pg_mask(b);
            assert!(m >= b - 1 && m < 2 * b.max(1), "mask {m} of {b}");
            for x in (0u32..5000).chain([u32::MAX, u32::MAX - 7, 1 << 31]) {
                let r = stable_mod(x, b, m);
                assert!(r < b, "stable_mod({x}, {b}) = {r}");
                if b.is_power_of_two() {
                    assert_eq!(r, x % b);
                }
                if x & m < b {
                    assert_eq!(r, x & m);
                }
            }
        }
        assert_eq!(pg_mask(0), 0);
        assert_eq!(pg_mask(u32::MAX), u32::MAX);
    }

    /// Without hashpspool the seed is the folded PG plus the pool id; with
    /// it, a hash of both: different pools give different seeds.
    #[test]
    fn pps_with_and_without_hashpspool() {
        let mut p = Pool {
            id: 7,
            pg_num: 100,
            pgp_num: 64,
            hashpspool: false,
        };
        for ps in 0..100 {
            assert_eq!(pg_to_pps(&p, ps), stable_mod(ps, 64, 63) + 7);
        }
        p.hashpspool = true;
        let q = Pool { id: 8, ..p };
        let differ = (0..100)
            .filter(|&ps| pg_to_pps(&p, ps) != pg_to_pps(&q, ps))
            .count();
        assert!(differ > 90, "{differ} of 100 seeds differ between pools");
    }

    #[test]
    fn bad_requests_are_errors() {
        let map = CrushMap {
            max_devices: 0,
            buckets: Vec::new(),
            rules: Vec::new(),
            type_names: Default::default(),
            names: Default::default(),
            rule_names: Default::default(),
            tunables: iolift_crush::map::Tunables::LEGACY,
            class_map: Default::default(),
            class_names: Default::default(),
            class_bucket: Default::default(),
            choose_args: Default::default(),
            optional_groups: 0,
        };
        let pool = Pool {
            id: 1,
            pg_num: 8,
            pgp_num: 8,
            hashpspool: true,
        };
        assert_eq!(
            map_object(&map, &pool, None, "o", 0, 3, &[]),
            Err(OsdMapError::NoSuchRule(0))
        );
        let empty = Pool { pg_num: 0, ..pool };
        assert!(matches!(
            map_object(&map, &empty, None, "o", 0, 3, &[]),
            Err(OsdMapError::Invalid(_))
        ));
    }
}
