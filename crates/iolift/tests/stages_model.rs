//! Model-based test of the stages, in process through the BlockDev trait.
//!
//! Several tasks ("connections") issue random reads, writes (some FUA),
//! trims, write-zeroes, flushes, block-status and cache requests at once
//! through a stack of stages over a memory backend, with a random-delay
//! stage below to shuffle completions. Every 512-byte sector written holds
//! a self-describing stamp (write id + sector number), so each sector read
//! back names the write it came from.
//!
//! The reference model keeps, per sector, the writes that may still be
//! visible, each with its start and end on a logical clock. A read may
//! return the value of write `e` iff `e` started before the read ended and
//! no write `f` both started after `e` ended and ended before the read
//! started (linearizability of a register, per sector).
//!
//! Crash points: after a flush is acknowledged, every task is aborted and
//! the stack is dropped without close (cache contents and flusher gone);
//! the backend must then hold, per sector, a value allowed for a "read"
//! that started when that flush was sent: everything acknowledged before
//! the flush was sent is there. The next round starts a new stack on the
//! same backend.

use bytes::Bytes;
use iolift::backend::memory::MemoryDev;
use iolift::block::{BlockDev, DevRef, Flags, Reply, Request};
use iolift_testkit::Rng;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SECTOR: u64 = 512;
const DEV: u64 = 192 * 1024;
const NSECT: usize = (DEV / SECTOR) as usize;

fn stamp(id: u64, sector: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&id.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    for (i, b) in out[16..].iter_mut().enumerate() {
        *b = (id.wrapping_mul(31) ^ sector.wrapping_mul(7)).wrapping_add(i as u64) as u8;
    }
}

/// The write id a sector holds (0: zeroes), or why it is garbage.
fn decode(sector: u64, d: &[u8]) -> Result<u64, String> {
    if d.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let id = u64::from_le_bytes(d[..8].try_into().unwrap());
    let mut want = vec![0u8; SECTOR as usize];
    stamp(id, sector, &mut want);
    if d != &want[..] {
        return Err(format!(
            "sector {sector}: torn or foreign data (claims id {id})"
        ));
    }
    Ok(id)
}

#[derive(Debug, Clone, Copy)]
struct Ent {
    val: u64,
    start: u64,
    end: Option<u64>,
}

struct Model {
    clock: u64,
    sectors: Vec<Vec<Ent>>,
    /// Start times of reads (and crash-point flushes) in progress.
    active: BTreeMap<u64, usize>,
    next_id: u64,
    ops: u64,
}

impl Model {
    fn new(init: &[u64]) -> Self {
        Model {
            clock: 1,
            sectors: init
                .iter()
                .map(|&v| {
                    vec![Ent {
                        val: v,
                        start: 0,
                        end: Some(0),
                    }]
                })
                .collect(),
            active: BTreeMap::new(),
            next_id: 1,
            ops: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Starts a write of `vals` (per sector) at sector `s0`; returns its start.
    fn begin_write(&mut self, s0: usize, vals: &[u64]) -> u64 {
        let t = self.tick();
        for (i, &v) in vals.iter().enumerate() {
            self.sectors[s0 + i].push(Ent {
                val: v,
                start: t,
                end: None,
            });
        }
        t
    }

    fn end_write(&mut self, s0: usize, n: usize, start: u64) {
        let t = self.tick();
        for s in s0..s0 + n {
            for e in self.sectors[s].iter_mut() {
                if e.start == start {
                    e.end = Some(t);
                }
            }
        }
        self.ops += 1;
        if self.ops.is_multiple_of(64) {
            self.prune();
        }
    }

    fn begin_read(&mut self) -> u64 {
        let t = self.tick();
        *self.active.entry(t).or_insert(0) += 1;
        t
    }

    fn end_read(&mut self, rs: u64) {
        if let Some(c) = self.active.get_mut(&rs) {
            *c -= 1;
            if *c == 0 {
                self.active.remove(&rs);
            }
        }
    }

    /// Checks data read from `s0` by a read that started at `rs` and ends now.
    fn check(&mut self, rs: u64, s0: usize, data: &[u8], what: &str) -> Result<(), String> {
        let re = self.tick();
        for (i, chunk) in data.chunks(SECTOR as usize).enumerate() {
            let s = s0 + i;
            let v = decode(s as u64, chunk).map_err(|e| format!("{what}: {e}"))?;
            let ents = &self.sectors[s];
            let ok = ents.iter().any(|e| {
                e.val == v
                    && e.start < re
                    && !ents.iter().any(|f| {
                        e.end.is_some_and(|ee| f.start > ee) && f.end.is_some_and(|fe| fe < rs)
                    })
            });
            if !ok {
                return Err(format!(
                    "{what}: sector {s} holds {v}, allowed: {:?} (read {rs}..{re})",
                    ents.iter()
                        .map(|e| (e.val, e.start, e.end))
                        .collect::<Vec<_>>()
                ));
            }
        }
        Ok(())
    }

    fn prune(&mut self) {
        let threshold = self.active.keys().next().copied().unwrap_or(self.clock);
        for ents in self.sectors.iter_mut() {
            let m = ents
                .iter()
                .filter(|f| f.end.is_some_and(|fe| fe < threshold))
                .map(|f| f.start)
                .max();
            if let Some(m) = m {
                ents.retain(|e| e.end.is_none_or(|ee| ee >= m));
            }
        }
    }
}

type M = Arc<Mutex<Model>>;

fn lock(m: &M) -> std::sync::MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `n` random ops against `dev`. With `crash`, ends with a flush and
/// returns its start time once acknowledged.
async fn worker(dev: DevRef, m: M, seed: u64, n: usize) -> Result<Option<u64>, String> {
    let mut r = Rng::new(seed);
    for _ in 0..n {
        let s0 = r.below(NSECT as u64) as usize;
        let ns = (1 + r.below(24) as usize).min(NSECT - s0);
        let off = s0 as u64 * SECTOR;
        let len = ns as u64 * SECTOR;
        let mut p = r.below(100);
        if std::env::var("MODEL_NO_DISCARD").is_ok() && (70..86).contains(&p) {
            p = 50;
        }
        if std::env::var("MODEL_NO_FLUSH").is_ok() && p >= 86 {
            p = 10;
        }
        if p < 34 {
            let rs = lock(&m).begin_read();
            let c = dev
                .submit(Request::Read {
                    offset: off,
                    len: len as u32,
                })
                .await;
            let mut g = lock(&m);
            let res = match c {
                Ok(Reply::Data(d)) if d.len() as u64 == len => g.check(rs, s0, &d, "read"),
                other => Err(format!("read {off}+{len}: {other:?}")),
            };
            g.end_read(rs);
            res?;
        } else if p < 70 {
            let fua = r.below(10) == 0;
            let (start, data) = {
                let mut g = lock(&m);
                let id = g.next_id;
                g.next_id += 1;
                let id = id | (seed << 40);
                let mut buf = vec![0u8; len as usize];
                for (i, ch) in buf.chunks_mut(SECTOR as usize).enumerate() {
                    stamp(id, (s0 + i) as u64, ch);
                }
                (g.begin_write(s0, &vec![id; ns]), Bytes::from(buf))
            };
            let flags = if fua { Flags::FUA } else { Flags::NONE };
            let c = dev
                .submit(Request::Write {
                    offset: off,
                    data,
                    flags,
                })
                .await;
            if c != Ok(Reply::Done(len)) {
                return Err(format!("write {off}+{len}: {c:?}"));
            }
            lock(&m).end_write(s0, ns, start);
        } else if p < 86 {
            let fua = r.below(10) == 0;
            let flags = if fua { Flags::FUA } else { Flags::NONE };
            let start = lock(&m).begin_write(s0, &vec![0; ns]);
            let req = if p < 78 {
                Request::Trim {
                    offset: off,
                    len: len as u32,
                    flags,
                }
            } else {
                Request::WriteZeroes {
                    offset: off,
                    len: len as u32,
                    flags,
                }
            };
            let c = dev.submit(req.clone()).await;
            if c.is_err() {
                return Err(format!("{req:?}: {c:?}"));
            }
            lock(&m).end_write(s0, ns, start);
        } else if p < 93 {
            let c = dev.submit(Request::Flush).await;
            if c.is_err() {
                return Err(format!("flush: {c:?}"));
            }
        } else if p < 97 {
            let c = dev
                .submit(Request::BlockStatus {
                    offset: off,
                    len: len as u32,
                })
                .await;
            match c {
                Ok(Reply::Extents(e)) if !e.is_empty() => {}
                other => return Err(format!("block status: {other:?}")),
            }
        } else {
            let c = dev
                .submit(Request::Cache {
                    offset: off,
                    len: len as u32,
                })
                .await;
            if c.is_err() {
                return Err(format!("cache: {c:?}"));
            }
        }
    }
    Ok(None)
}

async fn backend_state(mem: &MemoryDev) -> Vec<u8> {
    match mem
        .submit(Request::Read {
            offset: 0,
            len: DEV as u32,
        })
        .await
    {
        Ok(Reply::Data(d)) => d.to_vec(),
        other => panic!("backend read: {other:?}"),
    }
}

fn decode_all(d: &[u8]) -> Vec<u64> {
    d.chunks(SECTOR as usize)
        .enumerate()
        .map(|(s, c)| decode(s as u64, c).expect("backend sector"))
        .collect()
}

/// Runs rounds of concurrent random I/O through `stack` over one memory
/// backend, crashing after a flush in every round but the last, which
/// closes the stack cleanly.
fn run_stack(stack: &[&str], seed: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mem = Arc::new(MemoryDev::new(DEV));
    let specs: Vec<String> = stack
        .iter()
        .map(|s| s.to_string())
        .chain(["delay:all=60us,jitter=60us,seed=3".to_string()])
        .collect();
    const ROUNDS: u64 = 4;
    let tasks: u64 = std::env::var("MODEL_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    const OPS: usize = 120;
    for round in 0..ROUNDS {
        let init = decode_all(&rt.block_on(backend_state(&mem)));
        let m: M = Arc::new(Mutex::new(Model::new(&init)));
        let what = format!("stack {stack:?} seed {seed} round {round}");
        let last = round + 1 == ROUNDS;
        rt.block_on(async {
            let dev = iolift::stage::build_stack(&specs, mem.clone()).unwrap();
            let mut hs = Vec::new();
            for t in 0..tasks {
                let s = seed * 1000 + round * 10 + t + 1;
                hs.push(tokio::spawn(worker(dev.clone(), m.clone(), s, OPS)));
            }
            // The crasher: runs its own ops, then flushes and crashes.
            let mut r = Rng::new(seed ^ round);
            let dev2 = dev.clone();
            let m2 = m.clone();
            let mine = OPS / 2 + r.below(OPS as u64) as usize;
            let pre = worker(dev2.clone(), m2.clone(), seed * 7 + round, mine).await;
            if let Err(e) = pre {
                panic!("{what}: {e}");
            }
            if last {
                for h in hs {
                    if let Err(e) = h.await.unwrap() {
                        panic!("{what}: {e}");
                    }
                }
                let fs = lock(&m).begin_read();
                dev.close()
                    .await
                    .unwrap_or_else(|e| panic!("{what}: close: {e:?}"));
                drop(dev2);
                drop(dev);
                let d = backend_state(&mem).await;
                lock(&m)
                    .check(fs, 0, &d, &format!("{what}: after close"))
                    .unwrap_or_else(|e| panic!("{e}"));
                return;
            }
            let fs = lock(&m).begin_read();
            let c = dev2.submit(Request::Flush).await;
            assert!(c.is_ok(), "{what}: flush: {c:?}");
            // Crash: stop every connection, drop the stack without close.
            for h in &hs {
                h.abort();
            }
            for h in hs {
                match h.await {
                    Ok(Err(e)) => panic!("{what}: {e}"),
                    Ok(Ok(_)) => {}
                    Err(e) if e.is_cancelled() => {}
                    Err(e) => panic!("{what}: task: {e}"),
                }
            }
            drop(dev2);
            drop(dev);
            let d = backend_state(&mem).await;
            lock(&m)
                .check(fs, 0, &d, &format!("{what}: after crash"))
                .unwrap_or_else(|e| panic!("{e}"));
            // Let timers and in-flight tasks of the dead stack drain.
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
    }
}

#[test]
fn model_no_stage() {
    run_stack(&[], 1);
}

#[test]
fn model_cache_writeback() {
    run_stack(&["cache:size=64k,block=4k,max_age=5ms"], 2);
}

#[test]
fn model_cache_writeback_big_blocks_tight_limits() {
    run_stack(
        &["cache:size=48k,block=8k,dirty_limit=24k,dirty_target=8k,max_age=1ms"],
        3,
    );
}

#[test]
fn model_cache_writethrough() {
    run_stack(&["cache:size=64k,mode=writethrough"], 4);
}

#[test]
fn model_cache_readonly() {
    run_stack(&["cache:size=64k,mode=readonly,block=1k"], 5);
}

#[test]
fn model_scheduler() {
    run_stack(&["scheduler:max_delay=300us,max_merge=16k,idle=hold"], 6);
}

#[test]
fn model_cache_over_scheduler() {
    run_stack(
        &[
            "stats",
            "cache:size=64k,max_age=2ms",
            "scheduler:max_delay=200us",
        ],
        7,
    );
}

#[test]
fn model_scheduler_over_cache() {
    run_stack(&["scheduler", "cache:size=32k,block=4k,max_age=3ms"], 8);
}
