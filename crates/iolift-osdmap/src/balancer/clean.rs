//! Cleanup of upmap entries that no longer apply (what osdmaptool runs
//! as "checking for upmap cleanups" before balancing): entries of a pool
//! that is gone or of a PG beyond pg_num; pg_upmap entries naming an OSD
//! that is gone or out; pg_upmap_items pairs whose source is no longer
//! in the PG's CRUSH set or whose target is gone or out; and any entry
//! whose resulting up set breaks the rule's failure domains.

use super::rule::{analyze, RuleShape};
use super::Changes;
use crate::mapping::{find_rule, Mapper, PgPlacement};
use crate::types::{OsdMap, PgId};
use std::collections::BTreeMap;

/// The cleanup edits for `map` (nothing is changed in it).
pub fn clean(map: &OsdMap) -> Changes {
    let mut ch = Changes::default();
    let mut shapes: BTreeMap<i64, Option<(i32, RuleShape)>> = BTreeMap::new();
    let mut shape_of = |pool: i64| -> Option<(i32, RuleShape)> {
        shapes
            .entry(pool)
            .or_insert_with(|| {
                let p = map.pools.get(&pool)?;
                let r = find_rule(map, p);
                analyze(map, r).ok().map(|s| (r, s))
            })
            .clone()
    };
    let gone = |pg: &PgId| {
        map.pools
            .get(&(pg.pool as i64))
            .is_none_or(|p| pg.seed >= p.pg_num)
    };
    let unusable = |o: i32| o != crate::types::ITEM_NONE && (!map.exists(o) || map.is_out(o));
    for (pg, osds) in &map.pg_upmap {
        if gone(pg) || osds.iter().any(|&o| unusable(o)) {
            ch.rm_upmap.insert(*pg);
        } else if let Some((_, s)) = shape_of(pg.pool as i64) {
            if !s.valid_set(osds) {
                ch.rm_upmap.insert(*pg);
            }
        }
    }
    let mut mapper = Mapper::new(map);
    let mut p = PgPlacement::default();
    for (pg, items) in &map.pg_upmap_items {
        if gone(pg) {
            ch.rm_items.insert(*pg);
            continue;
        }
        mapper.map_pgid(*pg, &mut p);
        let kept: Vec<(i32, i32)> = items
            .iter()
            .copied()
            .filter(|&(f, t)| p.raw.contains(&f) && !unusable(t))
            .collect();
        if kept.is_empty() {
            ch.rm_items.insert(*pg);
            continue;
        }
        let up_ok = match shape_of(pg.pool as i64) {
            Some((_, s)) => {
                let base = map.pg_upmap.get(pg).unwrap_or(&p.raw);
                s.valid_set(&apply_items(map, base, &kept))
            }
            None => true,
        };
        if !up_ok {
            ch.rm_items.insert(*pg);
        } else if &kept != items {
            ch.set_items.insert(*pg, kept);
        }
    }
    ch
}

/// `set` with upmap item pairs applied as placement applies them: a pair
/// replaces its source when its target is not in the set already and is
/// not marked out.
fn apply_items(map: &OsdMap, set: &[i32], items: &[(i32, i32)]) -> Vec<i32> {
    let mut v = set.to_vec();
    for &(f, t) in items {
        if v.contains(&t) || (t >= 0 && t < map.max_osd && map.weight(t) == 0) {
            continue;
        }
        if let Some(slot) = v.iter_mut().find(|o| **o == f) {
            *slot = t;
        }
    }
    v
}
