//! One pool's placement as the balancer sees it: every PG's up set (from
//! the bulk mapper, on all cores), the PGs on each OSD, each OSD's target
//! PG count from CRUSH weights and reweights, and the OSDs ordered by
//! deviation (count - target). A move updates all of it in place; nothing
//! is remapped. Memory: pg_num * size OSD ids twice (sets and per-OSD
//! lists) plus a few words per OSD.

use super::rule::RuleShape;
use crate::bulk;
use crate::types::{OsdMap, Pool, ITEM_NONE};
use std::collections::BTreeSet;

/// Deviation in 1/2^20 PG steps, for an exact total order.
pub type Key = i64;

pub struct PoolState {
    pub size: usize,
    /// Up sets, `size` slots per PG (ITEM_NONE where a set is shorter).
    pub sets: Vec<i32>,
    /// The PGs (seeds) on each OSD.
    pub pgs_on: Vec<Vec<u32>>,
    pub count: Vec<u32>,
    pub target: Vec<f64>,
    /// (deviation key, osd) of every OSD with a target or a PG.
    pub order: BTreeSet<(Key, i32)>,
}

pub fn key(dev: f64) -> Key {
    (dev * (1u64 << 20) as f64).round() as Key
}

impl PoolState {
    /// Map every PG of `pool` (rule `rule`) on `threads` threads and
    /// compute targets from `shape` and the map's reweights.
    pub fn build(map: &OsdMap, pool: &Pool, rule: i32, shape: &RuleShape, threads: usize) -> Self {
        let size = pool.size as usize;
        let n = map.max_osd.max(0) as usize;
        let mut sets = Vec::with_capacity(pool.pg_num as usize * size);
        let ranges = bulk::ranges(map, &[pool]);
        bulk::run(
            map,
            &ranges,
            threads,
            || (),
            |_, m, p, r| {
                let mut v = Vec::with_capacity((r.end - r.start) as usize * size);
                for s in r.start..r.end {
                    m.map_pg(r.pool, rule, s, p);
                    for i in 0..size {
                        v.push(p.up.get(i).copied().unwrap_or(ITEM_NONE));
                    }
                }
                v
            },
            |v| sets.extend_from_slice(&v),
        );
        let mut pgs_on = vec![Vec::new(); n];
        let mut count = vec![0u32; n];
        for (i, &o) in sets.iter().enumerate() {
            if o >= 0 && (o as usize) < n {
                pgs_on[o as usize].push((i / size) as u32);
                count[o as usize] += 1;
            }
        }
        let mut w = vec![0f64; n];
        for (o, wo) in w.iter_mut().enumerate() {
            if shape.weight[o] > 0 && map.is_up(o as i32) {
                *wo = shape.weight[o] as f64 * map.weight(o as i32) as f64 / 65536.0;
            }
        }
        let total: f64 = w.iter().sum();
        let pgs = pool.pg_num as f64 * size as f64;
        let target: Vec<f64> = w
            .iter()
            .map(|&x| if total > 0.0 { x * pgs / total } else { 0.0 })
            .collect();
        let mut st = PoolState {
            size,
            sets,
            pgs_on,
            count,
            target,
            order: BTreeSet::new(),
        };
        for o in 0..n {
            if st.target[o] > 0.0 || st.count[o] > 0 {
                st.order.insert((key(st.dev(o as i32)), o as i32));
            }
        }
        st
    }

    pub fn dev(&self, osd: i32) -> f64 {
        self.count[osd as usize] as f64 - self.target[osd as usize]
    }

    pub fn set(&self, seed: u32) -> &[i32] {
        let s = seed as usize * self.size;
        &self.sets[s..s + self.size]
    }

    /// Move PG `seed`'s shard from `from` to `to`.
    pub fn apply_move(&mut self, seed: u32, from: i32, to: i32) {
        let s = seed as usize * self.size;
        for slot in &mut self.sets[s..s + self.size] {
            if *slot == from {
                *slot = to;
                break;
            }
        }
        let (f, t) = (from as usize, to as usize);
        self.order.remove(&(key(self.dev(from)), from));
        self.order.remove(&(key(self.dev(to)), to));
        self.count[f] -= 1;
        self.count[t] += 1;
        if let Some(i) = self.pgs_on[f].iter().position(|&p| p == seed) {
            self.pgs_on[f].swap_remove(i);
        }
        self.pgs_on[t].push(seed);
        self.order.insert((key(self.dev(from)), from));
        self.order.insert((key(self.dev(to)), to));
    }

    /// Largest absolute deviation and the standard deviation of the
    /// deviations over the OSDs with a target or a PG.
    pub fn spread(&self) -> (f64, f64) {
        let mut max = 0f64;
        let mut sq = 0f64;
        for &(_, o) in &self.order {
            let d = self.dev(o);
            max = max.max(d.abs());
            sq += d * d;
        }
        let n = self.order.len().max(1) as f64;
        (max, (sq / n).sqrt())
    }
}
