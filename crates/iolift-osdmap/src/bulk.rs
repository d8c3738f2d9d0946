//! All PGs of a set of pools, on many threads, results delivered in PG
//! order. Work is cut in chunks of `CHUNK` PGs; at most `threads *
//! WINDOW_PER_THREAD` chunk results are held at once, so memory stays
//! bounded however many PGs there are.

use crate::mapping::{find_rule, Mapper, PgPlacement};
use crate::types::{OsdMap, Pool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// PGs per unit of work.
pub const CHUNK: u32 = 2048;
/// Chunk results kept in flight per thread (the memory bound).
pub const WINDOW_PER_THREAD: usize = 8;

/// A run of PGs of one pool: seeds `start..end`.
#[derive(Debug, Clone, Copy)]
pub struct PgRange<'m> {
    pub pool: &'m Pool,
    pub rule: i32,
    pub start: u32,
    pub end: u32,
}

/// The chunks covering every PG (`0..pg_num`) of `pools`, in order.
pub fn ranges<'m>(map: &'m OsdMap, pools: &[&'m Pool]) -> Vec<PgRange<'m>> {
    let mut v = Vec::new();
    for &pool in pools {
        let rule = find_rule(map, pool);
        let mut s = 0;
        while s < pool.pg_num {
            let e = pool.pg_num.min(s.saturating_add(CHUNK));
            v.push(PgRange {
                pool,
                rule,
                start: s,
                end: e,
            });
            s = e;
        }
    }
    v
}

/// Number of threads to use for `requested` (0: all available cores).
pub fn thread_count(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Run `work` on every range with per-thread state from `init`, on
/// `threads` threads; `sink` receives each range's result in order on the
/// calling thread. Returns the per-thread states for merging.
pub fn run<'m, S, T, I, W, K>(
    map: &'m OsdMap,
    ranges: &[PgRange<'m>],
    threads: usize,
    init: I,
    work: W,
    mut sink: K,
) -> Vec<S>
where
    S: Send,
    T: Send,
    I: Fn() -> S + Sync,
    W: Fn(&mut S, &mut Mapper<'m>, &mut PgPlacement, &PgRange<'m>) -> T + Sync,
    K: FnMut(T),
{
    let threads = threads.max(1).min(ranges.len().max(1));
    if threads == 1 {
        let mut st = init();
        let mut mapper = Mapper::new(map);
        let mut p = PgPlacement::default();
        for r in ranges {
            sink(work(&mut st, &mut mapper, &mut p, r));
        }
        return vec![st];
    }
    let window = threads * WINDOW_PER_THREAD;
    let mut states = Vec::with_capacity(threads);
    let mut base = 0;
    // One scope per window: workers fill the window's slots, the caller
    // drains them in order.
    let mut carried: Vec<Option<S>> = (0..threads).map(|_| None).collect();
    while base < ranges.len() {
        let end = (base + window).min(ranges.len());
        let slots: Vec<Mutex<Option<T>>> = (base..end).map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(base);
        let done: Vec<S> = std::thread::scope(|sc| {
            let handles: Vec<_> = carried
                .iter_mut()
                .map(|c| {
                    let mut st = c.take();
                    let (next, slots, work, init) = (&next, &slots, &work, &init);
                    sc.spawn(move || {
                        let mut st = st.take().unwrap_or_else(init);
                        let mut mapper = Mapper::new(map);
                        let mut p = PgPlacement::default();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= end {
                                break;
                            }
                            let t = work(&mut st, &mut mapper, &mut p, &ranges[i]);
                            *slots[i - base].lock().expect("slot") = Some(t);
                        }
                        st
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("mapping thread panicked"))
                .collect()
        });
        for s in slots {
            if let Some(t) = s.into_inner().expect("slot") {
                sink(t);
            }
        }
        carried = done.into_iter().map(Some).collect();
        base = end;
    }
    for s in carried.into_iter().flatten() {
        states.push(s);
    }
    states
}

/// Place every PG of `pools` (all pools when empty); results in PG order.
pub fn map_all(
    map: &OsdMap,
    pools: &[i64],
    threads: usize,
) -> crate::Result<Vec<(crate::PgId, PgPlacement)>> {
    let sel: Vec<&Pool> = if pools.is_empty() {
        map.pools.values().collect()
    } else {
        pools
            .iter()
            .map(|id| {
                map.pools
                    .get(id)
                    .ok_or_else(|| crate::OsdMapError::Invalid(format!("there is no pool {id}")))
            })
            .collect::<crate::Result<_>>()?
    };
    let rs = ranges(map, &sel);
    let mut out = Vec::new();
    run(
        map,
        &rs,
        thread_count(threads),
        || (),
        |_, m, p, r| {
            let mut v = Vec::with_capacity((r.end - r.start) as usize);
            for s in r.start..r.end {
                m.map_pg(r.pool, r.rule, s, p);
                v.push((
                    crate::PgId {
                        pool: r.pool.id as u64,
                        seed: s,
                    },
                    p.clone(),
                ));
            }
            v
        },
        |v| out.extend(v),
    );
    Ok(out)
}
