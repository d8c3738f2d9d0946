//! The upmap balancer: `pg_upmap_items` entries that bring every OSD's PG
//! count of a pool near its target (its share of the pool's shards by
//! CRUSH weight times reweight), as `osdmaptool --upmap` proposes them,
//! and the cleanup of entries that no longer apply.
//!
//! `calc_pool` maps the pool once on all cores (`state`), resolves the
//! rule's failure domains (`rule`), runs a greedy search that updates the
//! counts per move without remapping (`calc`), then places every changed
//! PG again with the real mapper on a copy of the map and keeps only the
//! changes whose up set is the one predicted and valid for the rule.
//! Memory is bounded by the map: two OSD ids per PG shard of one pool,
//! a few words per OSD, and one entry per changed PG.

mod calc;
mod clean;
pub mod rule;
pub mod state;
#[cfg(test)]
mod tests;

pub use clean::clean;

use crate::mapping::{find_rule, Mapper, PgPlacement};
use crate::types::{OsdMap, PgId};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

/// A set of upmap edits, as `ceph osd` commands would make them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// `ceph osd rm-pg-upmap PG`
    pub rm_upmap: BTreeSet<PgId>,
    /// `ceph osd rm-pg-upmap-items PG`
    pub rm_items: BTreeSet<PgId>,
    /// `ceph osd pg-upmap-items PG FROM TO ...` (the whole new list)
    pub set_items: BTreeMap<PgId, Vec<(i32, i32)>>,
}

impl Changes {
    /// Number of PGs changed.
    pub fn len(&self) -> usize {
        let mut pgs: BTreeSet<PgId> = self.rm_upmap.clone();
        pgs.extend(self.rm_items.iter().copied());
        pgs.extend(self.set_items.keys().copied());
        pgs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Add `other` (later edits of a PG replace earlier ones).
    pub fn merge(&mut self, other: Changes) {
        for pg in other.rm_items {
            self.set_items.remove(&pg);
            self.rm_items.insert(pg);
        }
        for (pg, v) in other.set_items {
            self.rm_items.remove(&pg);
            self.set_items.insert(pg, v);
        }
        self.rm_upmap.extend(other.rm_upmap);
    }

    /// Apply to `map` (as the monitor applies the commands).
    pub fn apply(&self, map: &mut OsdMap) {
        for pg in &self.rm_upmap {
            map.pg_upmap.remove(pg);
        }
        for pg in &self.rm_items {
            map.pg_upmap_items.remove(pg);
        }
        for (pg, v) in &self.set_items {
            map.pg_upmap_items.insert(*pg, v.clone());
        }
    }

    /// The commands, one per line, in the order osdmaptool prints them.
    pub fn write_commands(&self, w: &mut dyn Write) -> std::io::Result<()> {
        for pg in &self.rm_upmap {
            writeln!(w, "ceph osd rm-pg-upmap {pg}")?;
        }
        for pg in &self.rm_items {
            writeln!(w, "ceph osd rm-pg-upmap-items {pg}")?;
        }
        for (pg, v) in &self.set_items {
            write!(w, "ceph osd pg-upmap-items {pg}")?;
            for (f, t) in v {
                write!(w, " {f} {t}")?;
            }
            writeln!(w)?;
        }
        Ok(())
    }
}

/// What balancing one pool did: deviations (largest absolute, standard
/// deviation) before and after, by the balancer's own counts.
#[derive(Debug, Clone, Default)]
pub struct PoolResult {
    pub changes: Changes,
    pub before: (f64, f64),
    pub after: (f64, f64),
    /// Why the pool was skipped, when it was.
    pub skipped: Option<String>,
}

/// Propose at most `max` changed PGs for pool `pool_id` so that no OSD is
/// more than `deviation` PGs from its target; `threads` 0 uses all cores.
pub fn calc_pool(
    map: &OsdMap,
    pool_id: i64,
    deviation: f64,
    max: usize,
    threads: usize,
) -> crate::Result<PoolResult> {
    let pool = map
        .pools
        .get(&pool_id)
        .ok_or_else(|| crate::OsdMapError::Invalid(format!("there is no pool {pool_id}")))?;
    let ruleno = find_rule(map, pool);
    let skip = |why: String| PoolResult {
        skipped: Some(why),
        ..PoolResult::default()
    };
    if ruleno < 0 {
        return Ok(skip(format!(
            "pool {} has no matching crush rule",
            pool.name
        )));
    }
    let shape = match rule::analyze(map, ruleno) {
        Ok(s) => s,
        Err(e) => return Ok(skip(format!("pool {}: rule {ruleno}: {e}", pool.name))),
    };
    let threads = crate::bulk::thread_count(threads);
    let st = state::PoolState::build(map, pool, ruleno, &shape, threads);
    let before = st.spread();
    // Every PG id of the pool, in the order the upmap tables keep them.
    let pid = pool_id as u64;
    let pool_pgs = PgId { pool: pid, seed: 0 }..=PgId {
        pool: pid,
        seed: u32::MAX,
    };
    let items = map
        .pg_upmap_items
        .range(pool_pgs.clone())
        .map(|(pg, v)| (pg.seed, v.clone()))
        .collect();
    let pinned = map
        .pg_upmap
        .range(pool_pgs)
        .map(|(pg, _)| pg.seed)
        .collect();
    let mut search = calc::Search {
        st,
        shape: &shape,
        items,
        pinned,
        touched: BTreeSet::new(),
    };
    search.run(deviation, max);
    let after = search.st.spread();

    let mut changes = Changes::default();
    for &seed in &search.touched {
        let pg = PgId { pool: pid, seed };
        let old = map.pg_upmap_items.get(&pg);
        let new = search.items.get(&seed).filter(|v| !v.is_empty());
        match (old, new) {
            (Some(o), Some(n)) if o == n => {}
            (None, None) => {}
            (Some(_), None) => {
                changes.rm_items.insert(pg);
            }
            (_, Some(n)) => {
                changes.set_items.insert(pg, n.clone());
            }
        }
    }
    // Check with the real mapper; drop any change that does not give the
    // predicted, valid up set.
    let mut check = map.clone();
    changes.apply(&mut check);
    let mut mapper = Mapper::new(&check);
    let mut p = PgPlacement::default();
    let mut bad = Vec::new();
    let changed: Vec<PgId> = changes
        .rm_items
        .iter()
        .chain(changes.set_items.keys())
        .copied()
        .collect();
    for pg in changed {
        mapper.map_pg(pool, ruleno, pg.seed, &mut p);
        let want = search.st.set(pg.seed);
        let same = p.up.len() <= want.len()
            && want
                .iter()
                .enumerate()
                .all(|(i, &o)| p.up.get(i).copied().unwrap_or(crate::types::ITEM_NONE) == o);
        if !same || !shape.valid_set(&p.up) {
            bad.push(pg);
        }
    }
    for pg in bad {
        changes.rm_items.remove(&pg);
        changes.set_items.remove(&pg);
    }
    Ok(PoolResult {
        changes,
        before,
        after,
        skipped: None,
    })
}
