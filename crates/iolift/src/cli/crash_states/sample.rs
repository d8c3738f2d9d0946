//! Choosing the crash states to check: the flush point and the durable-only
//! state of every epoch and a seeded sample of crash points with random
//! subsets of their pending writes.

use super::model::{Model, State, Unit};
use super::CrashStatesArgs;
use crate::stage::log_writes::RecKind;
use crate::stage::Rng;
use std::collections::HashSet;

/// Picks the states to check, in order of their crash point.
pub(super) fn plan(m: &Model, a: &CrashStatesArgs) -> Vec<State> {
    let from = a.from.unwrap_or(0);
    // The crash points of each epoch: data records at or after --from.
    let mut epochs: Vec<Vec<usize>> = Vec::new();
    for (i, r) in m.log.records.iter().enumerate() {
        if r.head.kind == RecKind::Flush || r.end < from {
            continue;
        }
        let e = m.epoch[i];
        match epochs.last_mut() {
            Some(v) if m.epoch[v[0]] == e => v.push(i),
            _ => epochs.push(vec![i]),
        }
    }
    if epochs.is_empty() || a.max_states == 0 {
        return Vec::new();
    }
    // Too many epochs for the budget: spread the ones taken evenly.
    let take = epochs.len().min(a.max_states);
    let mut rng = Rng::new(a.seed);
    let mut seen = HashSet::new();
    // Each epoch's candidates: its flush point, its durable-only state,
    // then distinct random ones (small epochs have fewer to give).
    let mut cands: Vec<Vec<State>> = Vec::with_capacity(take);
    for k in 0..take {
        let idx = if take == 1 {
            epochs.len() - 1
        } else {
            k * (epochs.len() - 1) / (take - 1)
        };
        let pts = &epochs[idx];
        let last = *pts.last().unwrap();
        let want = a.samples + 2;
        let mut mine = Vec::new();
        let mut push = |s: State, mine: &mut Vec<State>| {
            if seen.insert(s.clone()) {
                mine.push(s);
            }
        };
        push(
            State {
                point: last,
                kept: m.units(last),
            },
            &mut mine,
        );
        push(
            State {
                point: last,
                kept: Vec::new(),
            },
            &mut mine,
        );
        let mut tries = 0;
        while mine.len() < want && tries < want * 8 {
            tries += 1;
            let point = pts[(rng.next_u64() % pts.len() as u64) as usize];
            let kept: Vec<Unit> = m
                .units(point)
                .into_iter()
                .filter(|_| rng.next_u64() & 1 == 1)
                .collect();
            push(State { point, kept }, &mut mine);
        }
        cands.push(mine);
    }
    // Over budget: the same quota for every epoch, as high as fits; what
    // small epochs leave unused goes to the others.
    let total: usize = cands.iter().map(Vec::len).sum();
    if total > a.max_states {
        let fits = |q: usize| cands.iter().map(|c| c.len().min(q)).sum::<usize>() <= a.max_states;
        let mut q = 0;
        while fits(q + 1) {
            q += 1;
        }
        let mut left = a.max_states - cands.iter().map(|c| c.len().min(q)).sum::<usize>();
        for c in &mut cands {
            let extra = usize::from(left > 0 && c.len() > q);
            left -= extra;
            c.truncate(q + extra);
        }
    }
    let mut states: Vec<State> = cands.into_iter().flatten().collect();
    states.sort_by_key(|s| s.point);
    states
}
