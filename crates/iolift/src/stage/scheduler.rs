//! `scheduler`: a self-tuning coalescing I/O scheduler (DeLiBA III-A).
//!
//! Reads and (non-FUA) writes are held for a window of half the rolling
//! mean backend latency, capped by `max_delay`; contiguous requests of the
//! same direction that arrive within the window go down as one backend
//! request of at most `max_merge` bytes, and its result is split back to
//! the original requests. A flush dispatches everything held at once, waits
//! until every request submitted before it has completed below, then
//! flushes below; requests after a flush are never merged with requests
//! before it. Trim, write-zeroes, FUA writes and the rest pass straight
//! through (but a flush still waits for them).
//!
//! Only requests that continue a recent one (their offset is where one of
//! the last 32 requests ended) are held: a random request has nothing to
//! wait for, and holding it only adds latency (measured: 4k random reads
//! over a 50 us backend lost 3/4 of their IOPS when every request was
//! held). A sequential stream is held from its second request on.
//!
//! Options in [`OPTIONS`]. With `idle=dispatch` (the default) a request
//! arriving while nothing is in flight below or held goes down at once,
//! since there is nothing to merge it with yet, and only requests
//! continuing a recent one are held; with `idle=hold` every read and write
//! is held.

use super::{timer, Kind, OptHelp, Opts};
use crate::block::{BlockDev, Completion, DevInfo, DevRef, Errno, Flags, IoFuture, Reply, Request};
use crate::metrics::{self, Instance, MetricSource};
use anyhow::Result;
use bytes::BytesMut;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

const MAX_HELD: usize = 256;
/// How many recent request ends are remembered to detect sequential runs.
const RECENT: usize = 32;

pub struct SchedDev {
    inner: Arc<Inner>,
}

struct Pending {
    req: Request,
    tx: oneshot::Sender<Completion>,
    epoch: u64,
}

struct State {
    pending: Vec<Pending>,
    pending_bytes: u64,
    timer_armed: bool,
    epoch: u64,
    /// Requests not yet completed, by flush epoch.
    inflight: BTreeMap<u64, usize>,
    /// Backend requests in flight.
    below_inflight: usize,
    /// Rolling mean backend latency (EWMA), nanoseconds.
    mean_ns: f64,
    /// End offsets of the last RECENT reads/writes (a ring).
    recent_ends: [u64; RECENT],
    recent_pos: usize,
}

struct Inner {
    below: DevRef,
    id: Instance,
    max_delay: Duration,
    max_merge: u64,
    hold_idle: bool,
    st: Mutex<State>,
    drained: Notify,
    requests_in: AtomicU64,
    backend_out: AtomicU64,
    merged: AtomicU64,
    flushes: AtomicU64,
}

/// Counters of one scheduler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedCounters {
    /// Requests submitted to the scheduler.
    pub requests_in: u64,
    /// Requests it sent below (merged ones count once).
    pub backend_out: u64,
    /// Original requests that went down as part of a merged request.
    pub merged: u64,
}

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "max_delay",
        kind: Kind::Duration,
        default: "1ms",
        help: "cap on the hold window (half the mean backend latency)",
    },
    OptHelp {
        name: "max_merge",
        kind: Kind::Size,
        default: "1M",
        help: "cap on a merged request (also capped by the device's max block)",
    },
    OptHelp {
        name: "idle",
        kind: Kind::Choice(IDLE),
        default: "dispatch",
        help: "dispatch: hold only requests continuing a recent one, none while idle; hold: every read and write",
    },
    OptHelp {
        name: "name",
        kind: Kind::Label,
        default: "a number",
        help: "the `instance` label of its /metrics series",
    },
];

const IDLE: &[&str] = &["dispatch", "hold"];

/// The checked options of one scheduler.
pub struct SchedConfig {
    pub max_delay: Duration,
    pub max_merge: u64,
    pub hold_idle: bool,
    pub name: Option<String>,
}

pub fn parse(o: &Opts) -> Result<SchedConfig> {
    let max_merge = o.size("max_merge", 1 << 20)?;
    if max_merge == 0 || max_merge > u32::MAX as u64 {
        return Err(o.err("max_merge", "must be between 1 and 4G-1"));
    }
    Ok(SchedConfig {
        max_delay: o.duration("max_delay", Duration::from_millis(1))?,
        max_merge,
        hold_idle: o.choice("idle", IDLE, "dispatch")? == "hold",
        name: o.label("name")?,
    })
}

pub fn build(o: Opts, below: DevRef) -> Result<DevRef> {
    let c = parse(&o)?;
    Ok(Arc::new(SchedDev::new(
        below,
        c.name,
        c.max_delay,
        c.max_merge,
        c.hold_idle,
    )))
}

impl SchedDev {
    pub fn new(
        below: DevRef,
        name: Option<String>,
        max_delay: Duration,
        max_merge: u64,
        hold_idle: bool,
    ) -> Self {
        let max_merge = max_merge.min(below.info().max_block.max(1) as u64);
        let inner = Arc::new(Inner {
            below,
            id: Instance::new("scheduler", name),
            max_delay,
            max_merge,
            hold_idle,
            st: Mutex::new(State {
                pending: Vec::new(),
                pending_bytes: 0,
                timer_armed: false,
                epoch: 0,
                inflight: BTreeMap::new(),
                below_inflight: 0,
                mean_ns: 0.0,
                recent_ends: [u64::MAX; RECENT],
                recent_pos: 0,
            }),
            drained: Notify::new(),
            requests_in: AtomicU64::new(0),
            backend_out: AtomicU64::new(0),
            merged: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        });
        metrics::register(inner.clone());
        SchedDev { inner }
    }

    pub fn counters(&self) -> SchedCounters {
        let i = &self.inner;
        SchedCounters {
            requests_in: i.requests_in.load(Relaxed),
            backend_out: i.backend_out.load(Relaxed),
            merged: i.merged.load(Relaxed),
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn window(&self, st: &State) -> Duration {
        Duration::from_nanos((st.mean_ns / 2.0) as u64).min(self.max_delay)
    }

    /// Sends a batch of held requests down, merging contiguous runs.
    fn dispatch(self: &Arc<Self>, st: &mut State, mut batch: Vec<Pending>) {
        if batch.is_empty() {
            return;
        }
        batch.sort_by_key(|p| {
            let (off, _) = p.req.range().unwrap_or((0, 0));
            (matches!(p.req, Request::Write { .. }), off)
        });
        let mut group: Vec<Pending> = Vec::new();
        let mut end = 0u64;
        let mut bytes = 0u64;
        for p in batch {
            let (off, len) = p.req.range().unwrap_or((0, 0));
            let same_dir = group
                .last()
                .is_some_and(|g| std::mem::discriminant(&g.req) == std::mem::discriminant(&p.req));
            if !(same_dir && off == end && bytes + len <= self.max_merge) {
                self.send_group(st, std::mem::take(&mut group));
                bytes = 0;
            }
            end = off + len;
            bytes += len;
            group.push(p);
        }
        self.send_group(st, group);
    }

    fn send_group(self: &Arc<Self>, st: &mut State, group: Vec<Pending>) {
        if group.is_empty() {
            return;
        }
        let n = group.len();
        self.backend_out.fetch_add(1, Relaxed);
        if n > 1 {
            self.merged.fetch_add(n as u64, Relaxed);
        }
        st.below_inflight += 1;
        let (off, _) = group[0].req.range().unwrap_or((0, 0));
        let req = if n == 1 {
            group[0].req.clone()
        } else if matches!(group[0].req, Request::Write { .. }) {
            let total: usize = group
                .iter()
                .map(|p| p.req.range().unwrap_or((0, 0)).1 as usize)
                .sum();
            let mut buf = BytesMut::with_capacity(total);
            for p in &group {
                if let Request::Write { data, .. } = &p.req {
                    buf.extend_from_slice(data);
                }
            }
            Request::Write {
                offset: off,
                data: buf.freeze(),
                flags: Flags::NONE,
            }
        } else {
            let total: u64 = group
                .iter()
                .map(|p| p.req.range().unwrap_or((0, 0)).1)
                .sum();
            Request::Read {
                offset: off,
                len: total as u32,
            }
        };
        let f = self.below.submit(req);
        let me = self.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let c = f.await;
            let ns = t.elapsed().as_nanos() as f64;
            {
                let mut st = me.lock();
                st.below_inflight -= 1;
                st.mean_ns = if st.mean_ns == 0.0 {
                    ns
                } else {
                    st.mean_ns + (ns - st.mean_ns) / 16.0
                };
            }
            for p in group {
                let (o, l) = p.req.range().unwrap_or((0, 0));
                let r = match (&c, &p.req) {
                    (Err(e), _) => Err(*e),
                    (Ok(r), _) if n == 1 => Ok(r.clone()),
                    (Ok(Reply::Data(d)), Request::Read { .. }) => {
                        let a = (o - off) as usize;
                        if a + l as usize <= d.len() {
                            Ok(Reply::Data(d.slice(a..a + l as usize)))
                        } else {
                            Err(Errno::EIO)
                        }
                    }
                    (Ok(_), Request::Write { .. }) => Ok(Reply::Done(l)),
                    _ => Err(Errno::EIO),
                };
                let _ = p.tx.send(r);
                me.finish(p.epoch);
            }
        });
    }

    fn finish(&self, epoch: u64) {
        let mut st = self.lock();
        if let Some(c) = st.inflight.get_mut(&epoch) {
            *c -= 1;
            if *c == 0 {
                st.inflight.remove(&epoch);
            }
        }
        drop(st);
        self.drained.notify_waiters();
    }

    fn arm_timer(self: &Arc<Self>, st: &mut State) {
        if st.timer_armed {
            return;
        }
        st.timer_armed = true;
        let d = self.window(st);
        let me = self.clone();
        tokio::spawn(async move {
            timer::sleep(d).await;
            let mut st = me.lock();
            st.timer_armed = false;
            let batch = std::mem::take(&mut st.pending);
            st.pending_bytes = 0;
            me.dispatch(&mut st, batch);
        });
    }

    async fn flush(self: Arc<Self>) -> Completion {
        self.flushes.fetch_add(1, Relaxed);
        let e = {
            let mut st = self.lock();
            let batch = std::mem::take(&mut st.pending);
            st.pending_bytes = 0;
            self.dispatch(&mut st, batch);
            let e = st.epoch;
            st.epoch += 1;
            e
        };
        loop {
            let n = self.drained.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.lock().inflight.range(..=e).next().is_none() {
                break;
            }
            n.await;
        }
        self.below.submit(Request::Flush).await
    }
}

/// Accounts a straight-through request when it completes or is dropped.
struct Straight {
    inner: Arc<Inner>,
    epoch: u64,
    start: Instant,
    timed: bool,
}

impl Drop for Straight {
    fn drop(&mut self) {
        {
            let mut st = self.inner.lock();
            st.below_inflight -= 1;
            if self.timed {
                let ns = self.start.elapsed().as_nanos() as f64;
                st.mean_ns = if st.mean_ns == 0.0 {
                    ns
                } else {
                    st.mean_ns + (ns - st.mean_ns) / 16.0
                };
            }
        }
        self.inner.finish(self.epoch);
    }
}

impl MetricSource for Inner {
    fn render(&self, out: &mut String) {
        let (win, mean) = {
            let st = self.lock();
            (self.window(&st).as_secs_f64(), st.mean_ns / 1e9)
        };
        for (fam, v) in [
            ("requests_total", self.requests_in.load(Relaxed)),
            ("backend_requests_total", self.backend_out.load(Relaxed)),
            ("merged_requests_total", self.merged.load(Relaxed)),
            ("flushes_total", self.flushes.load(Relaxed)),
        ] {
            self.id.sample(out, &format!("iolift_sched_{fam}"), &[], v);
        }
        for (fam, v) in [
            ("window_seconds", win),
            ("backend_latency_mean_seconds", mean),
        ] {
            self.id
                .sample(out, &format!("iolift_sched_{fam}"), &[], format!("{v:e}"));
        }
    }

    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[
            (
                "iolift_sched_requests_total",
                "counter",
                "Requests submitted to the scheduler.",
            ),
            (
                "iolift_sched_backend_requests_total",
                "counter",
                "Requests the scheduler sent below (a merged request counts once).",
            ),
            (
                "iolift_sched_merged_requests_total",
                "counter",
                "Requests that went below as part of a merged request.",
            ),
            (
                "iolift_sched_flushes_total",
                "counter",
                "Flushes through the scheduler.",
            ),
            (
                "iolift_sched_window_seconds",
                "gauge",
                "Current hold window (half the mean backend latency, capped).",
            ),
            (
                "iolift_sched_backend_latency_mean_seconds",
                "gauge",
                "Rolling mean backend latency.",
            ),
        ]
    }
}

impl BlockDev for SchedDev {
    fn info(&self) -> DevInfo {
        self.inner.below.info()
    }

    fn submit(&self, req: Request) -> IoFuture {
        let i = &self.inner;
        i.requests_in.fetch_add(1, Relaxed);
        if matches!(req, Request::Flush) {
            return Box::pin(i.clone().flush());
        }
        let mut st = i.lock();
        let epoch = st.epoch;
        *st.inflight.entry(epoch).or_insert(0) += 1;
        let mergeable = match &req {
            Request::Read { .. } => true,
            Request::Write { flags, .. } => !flags.fua,
            _ => false,
        };
        let idle = st.below_inflight == 0 && st.pending.is_empty() && !i.hold_idle;
        // Sequential: continues where a recent request ended.
        let mut continues = i.hold_idle;
        if mergeable {
            if let Some((off, len)) = req.range() {
                continues |= st.recent_ends.contains(&off);
                let p = st.recent_pos;
                st.recent_ends[p] = off + len;
                st.recent_pos = (p + 1) % RECENT;
            }
        }
        if !mergeable || idle || !continues || i.window(&st).is_zero() {
            // Straight through.
            i.backend_out.fetch_add(1, Relaxed);
            st.below_inflight += 1;
            drop(st);
            let f = i.below.submit(req);
            let guard = Straight {
                inner: i.clone(),
                epoch,
                start: Instant::now(),
                timed: mergeable,
            };
            return Box::pin(async move {
                let c = f.await;
                drop(guard);
                c
            });
        }
        let (tx, rx) = oneshot::channel();
        st.pending_bytes += req.range().map_or(0, |r| r.1);
        st.pending.push(Pending { req, tx, epoch });
        if st.pending_bytes >= i.max_merge || st.pending.len() >= MAX_HELD {
            let batch = std::mem::take(&mut st.pending);
            st.pending_bytes = 0;
            i.dispatch(&mut st, batch);
        } else {
            i.arm_timer(&mut st);
        }
        Box::pin(async move { rx.await.unwrap_or(Err(Errno::EIO)) })
    }

    fn name(&self) -> String {
        format!("scheduler({})", self.inner.id.name())
    }

    fn close(&self) -> IoFuture {
        let f = self.submit(Request::Flush);
        let below = self.inner.below.clone();
        Box::pin(async move {
            f.await?;
            below.close().await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDev;
    use crate::block::BlockDevExt;
    use bytes::Bytes;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn merges_contiguous_writes_and_splits_reads() {
        let mem = Arc::new(MemoryDev::new(1 << 20));
        let slow = super::super::build("delay:all=300us", mem.clone()).unwrap();
        let s = Arc::new(SchedDev::new(
            slow,
            Some("t".into()),
            Duration::from_millis(1),
            1 << 20,
            false,
        ));
        // Teach it the backend latency.
        s.write(0, Bytes::from(vec![1u8; 4096]), Flags::NONE)
            .await
            .unwrap();
        let mut fs = Vec::new();
        for i in 0..32u64 {
            fs.push(s.write(i * 4096, Bytes::from(vec![i as u8; 4096]), Flags::NONE));
        }
        for f in fs {
            assert_eq!(f.await, Ok(Reply::Done(4096)));
        }
        s.flush().await.unwrap();
        let mut rs = Vec::new();
        for i in 0..32u64 {
            rs.push(s.read(i * 4096, 4096));
        }
        for (i, f) in rs.into_iter().enumerate() {
            let d = f.await.unwrap();
            assert!(d.iter().all(|&b| b == i as u8), "block {i}");
        }
        let c = s.counters();
        assert_eq!(c.requests_in, 1 + 32 + 1 + 32);
        assert!(c.merged >= 32, "{c:?}");
        assert!(c.backend_out < c.requests_in - 30, "{c:?}");
    }
}
