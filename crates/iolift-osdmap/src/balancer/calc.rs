//! The greedy search of one pool. Each step takes the OSD farthest from
//! its target (above `+deviation` or below `-deviation`) and moves one
//! shard off it (or onto it) to the OSD farthest on the other side that
//! the rule allows; a move is taken only when it lowers the sum of
//! squared deviations (the two deviations differ by more than one PG).
//! An OSD for which no move exists is set aside for the rest of the run.
//! The budget `max` bounds both the PGs changed and the shard moves (a
//! PG changed earlier in the run is preferred, as it adds no command
//! line); the search stops when it is spent or every OSD is within the
//! deviation.

use super::rule::RuleShape;
use super::state::PoolState;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Candidates on the other side tried per step (the farthest first).
const CANDIDATES: usize = 64;

pub struct Search<'s> {
    pub st: PoolState,
    pub shape: &'s RuleShape,
    /// pg_upmap_items of the pool by seed, as changed so far.
    pub items: HashMap<u32, Vec<(i32, i32)>>,
    /// PGs with a full pg_upmap (left alone).
    pub pinned: HashSet<u32>,
    /// PGs changed in this run.
    pub touched: BTreeSet<u32>,
}

impl Search<'_> {
    /// Whether PG `seed`'s shard on `from` may move to `to`.
    fn can_move(&self, seed: u32, from: i32, to: i32) -> bool {
        if self.pinned.contains(&seed) || self.st.target[to as usize] <= 0.0 {
            return false;
        }
        if let Some(it) = self.items.get(&seed) {
            // `to` may only appear as the source of the item that put
            // the shard on `from` (the move then undoes that item).
            for &(f, t) in it {
                if (t == to || f == to) && !(f == to && t == from) {
                    return false;
                }
            }
        }
        self.shape.allows(from, to, self.st.set(seed))
    }

    fn improves(&self, from: i32, to: i32) -> bool {
        self.st.dev(from) - self.st.dev(to) > 1.0 + 1e-9
    }

    /// A PG on `from` that may move to `to`; one changed already first.
    fn pick_pg(&self, from: i32, to: i32, budget_left: bool) -> Option<u32> {
        let pgs = &self.st.pgs_on[from as usize];
        let free = pgs
            .iter()
            .copied()
            .find(|&s| self.touched.contains(&s) && self.can_move(s, from, to));
        if free.is_some() || !budget_left {
            return free;
        }
        pgs.iter()
            .copied()
            .find(|&s| !self.touched.contains(&s) && self.can_move(s, from, to))
    }

    fn do_move(&mut self, seed: u32, from: i32, to: i32) {
        let it = self.items.entry(seed).or_default();
        if let Some(i) = it.iter().position(|&(_, t)| t == from) {
            if it[i].0 == to {
                it.remove(i);
            } else {
                it[i].1 = to;
            }
        } else {
            it.push((from, to));
        }
        self.st.apply_move(seed, from, to);
        self.touched.insert(seed);
    }

    /// Run until `max` PGs are changed, `max` shards moved, or nothing
    /// more helps.
    pub fn run(&mut self, deviation: f64, max: usize) {
        let mut moves = 0usize;
        let mut stuck_over: HashSet<i32> = HashSet::new();
        let mut stuck_under: HashSet<i32> = HashSet::new();
        // Each move lowers the sum of squares by at least 2e-9; the cap
        // only guards against rounding.
        let mut steps = 0usize;
        let cap = max.saturating_mul(64).saturating_add(100_000);
        while steps < cap && moves < max {
            steps += 1;
            let budget = self.touched.len() < max;
            let over = self
                .st
                .order
                .iter()
                .rev()
                .map(|&(_, o)| o)
                .find(|o| !stuck_over.contains(o))
                .filter(|&o| self.st.dev(o) > deviation);
            let under = self
                .st
                .order
                .iter()
                .map(|&(_, o)| o)
                .find(|o| !stuck_under.contains(o))
                .filter(|&o| self.st.dev(o) < -deviation);
            let from_over = match (over, under) {
                (None, None) => break,
                (Some(o), Some(u)) => self.st.dev(o) >= -self.st.dev(u),
                (o, _) => o.is_some(),
            };
            let found = if from_over {
                let o = over.unwrap_or_default();
                let r = self.move_off(o, budget);
                if r.is_none() {
                    stuck_over.insert(o);
                }
                r
            } else {
                let u = under.unwrap_or_default();
                let r = self.move_onto(u, budget);
                if r.is_none() {
                    stuck_under.insert(u);
                }
                r
            };
            if let Some((seed, from, to)) = found {
                self.do_move(seed, from, to);
                moves += 1;
            }
        }
    }

    /// Best move of a shard off overfull `o`: to the most underfull OSD
    /// that takes one of its PGs.
    fn move_off(&self, o: i32, budget: bool) -> Option<(u32, i32, i32)> {
        let targets: Vec<i32> = self
            .st
            .order
            .iter()
            .map(|&(_, u)| u)
            .take_while(|&u| self.improves(o, u))
            .take(CANDIDATES)
            .collect();
        for u in targets {
            if let Some(s) = self.pick_pg(o, u, budget) {
                return Some((s, o, u));
            }
        }
        None
    }

    /// Best move onto underfull `u`: from the most overfull OSD that has
    /// a PG that may move there.
    fn move_onto(&self, u: i32, budget: bool) -> Option<(u32, i32, i32)> {
        let sources: Vec<i32> = self
            .st
            .order
            .iter()
            .rev()
            .map(|&(_, o)| o)
            .take_while(|&o| self.improves(o, u))
            .take(CANDIDATES)
            .collect();
        for o in sources {
            if let Some(s) = self.pick_pg(o, u, budget) {
                return Some((s, o, u));
            }
        }
        None
    }
}
