//! Which PGs change their up set between two maps, and how many shards
//! move to and from each OSD. Both maps are placed by the bulk driver on
//! all cores, chunk by chunk, each worker holding one `Mapper` per map;
//! changed PGs reach the caller in PG order (streamed, never all held).
//!
//! A shard moves where the up sets differ: for a replicated pool each OSD
//! in the new set and not in the old one receives a copy (in) and each one
//! only in the old set gives one up (out); for an erasure pool shards keep
//! their position, so position `i` moves from `old[i]` to `new[i]` when
//! they differ (a hole, NONE, neither sends nor receives).

use crate::bulk::{self, PgRange};
use crate::mapping::{find_rule, Mapper, PgPlacement};
use crate::types::{OsdMap, PgId, Pool, ITEM_NONE};
use crate::{OsdMapError, Result};

/// One PG whose up set differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgChange {
    pub pg: PgId,
    pub old_up: Vec<i32>,
    pub new_up: Vec<i32>,
    /// OSDs receiving a shard, and giving one up.
    pub moved_in: Vec<i32>,
    pub moved_out: Vec<i32>,
}

/// Totals of a diff. Per-OSD counters are indexed by OSD id (both maps'
/// `max_osd`, so their memory is bounded by the maps).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffTotals {
    pub pgs: u64,
    pub changed: u64,
    /// PGs of the compared pools that exist in one map only (pg_num
    /// changed); not counted as moves.
    pub only_old: u64,
    pub only_new: u64,
    pub shards_in: Vec<u64>,
    pub shards_out: Vec<u64>,
    pub bytes_in: Vec<u64>,
    pub bytes_out: Vec<u64>,
}

impl DiffTotals {
    fn new(n: usize) -> DiffTotals {
        DiffTotals {
            shards_in: vec![0; n],
            shards_out: vec![0; n],
            bytes_in: vec![0; n],
            bytes_out: vec![0; n],
            ..DiffTotals::default()
        }
    }

    fn merge(&mut self, o: &DiffTotals) {
        self.pgs += o.pgs;
        self.changed += o.changed;
        for (a, b) in [
            (&mut self.shards_in, &o.shards_in),
            (&mut self.shards_out, &o.shards_out),
            (&mut self.bytes_in, &o.bytes_in),
            (&mut self.bytes_out, &o.bytes_out),
        ] {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
    }

    pub fn total_in(&self) -> u64 {
        self.shards_in.iter().sum()
    }

    pub fn total_out(&self) -> u64 {
        self.shards_out.iter().sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.bytes_in.iter().sum()
    }
}

/// Fill `moved_in` / `moved_out` of a change (see the module doc).
pub fn shard_moves(erasure: bool, old: &[i32], new: &[i32], c: &mut PgChange) {
    c.moved_in.clear();
    c.moved_out.clear();
    if erasure {
        for i in 0..old.len().max(new.len()) {
            let o = old.get(i).copied().unwrap_or(ITEM_NONE);
            let n = new.get(i).copied().unwrap_or(ITEM_NONE);
            if o != n {
                if n != ITEM_NONE {
                    c.moved_in.push(n);
                }
                if o != ITEM_NONE {
                    c.moved_out.push(o);
                }
            }
        }
    } else {
        c.moved_in
            .extend(new.iter().copied().filter(|o| !old.contains(o)));
        c.moved_out
            .extend(old.iter().copied().filter(|o| !new.contains(o)));
    }
}

/// Bytes of one shard of a PG of a pool.
pub type ShardBytes<'a> = &'a (dyn Fn(&Pool, PgId) -> u64 + Sync);

/// What to compare and how.
pub struct DiffOptions<'a> {
    /// Pools to compare (empty: every pool present in both maps).
    pub pools: &'a [i64],
    pub threads: usize,
    /// Bytes of one shard of a PG, for the byte counters (none: 0).
    pub shard_bytes: Option<ShardBytes<'a>>,
}

struct Worker<'n> {
    new_map: &'n OsdMap,
    mapper: Mapper<'n>,
    place: PgPlacement,
    rules: Vec<(i64, i32)>,
    totals: DiffTotals,
}

/// Compare the up set of every PG of the selected pools in `old` and
/// `new`; `each` receives each changed PG in order. Returns the totals.
pub fn diff(
    old: &OsdMap,
    new: &OsdMap,
    opts: &DiffOptions,
    mut each: impl FnMut(&PgChange),
) -> Result<DiffTotals> {
    let ids: Vec<i64> = if opts.pools.is_empty() {
        old.pools
            .keys()
            .copied()
            .filter(|id| new.pools.contains_key(id))
            .collect()
    } else {
        for id in opts.pools {
            for (m, which) in [(old, "old"), (new, "new")] {
                if !m.pools.contains_key(id) {
                    return Err(OsdMapError::Invalid(format!(
                        "pool {id} is not in the {which} map"
                    )));
                }
            }
        }
        opts.pools.to_vec()
    };
    let n_osd = old.max_osd.max(new.max_osd) as usize;
    let (mut only_old, mut only_new) = (0u64, 0u64);
    // Chunks of the seeds both maps have, placed with the old map's pool.
    let mut ranges: Vec<PgRange> = Vec::new();
    for id in &ids {
        let (po, pn) = (&old.pools[id], &new.pools[id]);
        let common = po.pg_num.min(pn.pg_num);
        only_old += (po.pg_num - common) as u64;
        only_new += (pn.pg_num - common) as u64;
        let rule = find_rule(old, po);
        let mut s = 0;
        while s < common {
            let e = common.min(s.saturating_add(bulk::CHUNK));
            ranges.push(PgRange {
                pool: po,
                rule,
                start: s,
                end: e,
            });
            s = e;
        }
    }
    let states = bulk::run(
        old,
        &ranges,
        bulk::thread_count(opts.threads),
        || Worker {
            new_map: new,
            mapper: Mapper::new(new),
            place: PgPlacement::default(),
            rules: Vec::new(),
            totals: DiffTotals::new(n_osd),
        },
        |w, m, p, r| {
            let pool_new = &w.new_map.pools[&r.pool.id];
            let rule = match w.rules.iter().find(|(id, _)| *id == r.pool.id) {
                Some(&(_, rule)) => rule,
                None => {
                    let rule = find_rule(w.new_map, pool_new);
                    w.rules.push((r.pool.id, rule));
                    rule
                }
            };
            let mut out = Vec::new();
            let mut c = PgChange {
                pg: PgId { pool: 0, seed: 0 },
                old_up: Vec::new(),
                new_up: Vec::new(),
                moved_in: Vec::new(),
                moved_out: Vec::new(),
            };
            for seed in r.start..r.end {
                m.map_pg(r.pool, r.rule, seed, p);
                w.mapper.map_pg(pool_new, rule, seed, &mut w.place);
                w.totals.pgs += 1;
                if p.up == w.place.up {
                    continue;
                }
                w.totals.changed += 1;
                c.pg = PgId {
                    pool: r.pool.id as u64,
                    seed,
                };
                shard_moves(r.pool.is_erasure(), &p.up, &w.place.up, &mut c);
                let bytes = opts.shard_bytes.map_or(0, |f| f(r.pool, c.pg));
                for &o in &c.moved_in {
                    if let Some(x) = w.totals.shards_in.get_mut(o as usize) {
                        *x += 1;
                        w.totals.bytes_in[o as usize] += bytes;
                    }
                }
                for &o in &c.moved_out {
                    if let Some(x) = w.totals.shards_out.get_mut(o as usize) {
                        *x += 1;
                        w.totals.bytes_out[o as usize] += bytes;
                    }
                }
                c.old_up.clone_from(&p.up);
                c.new_up.clone_from(&w.place.up);
                out.push(c.clone());
            }
            out
        },
        |v| v.iter().for_each(&mut each),
    );
    let mut t = DiffTotals::new(n_osd);
    for w in &states {
        t.merge(&w.totals);
    }
    t.only_old = only_old;
    t.only_new = only_new;
    Ok(t)
}
