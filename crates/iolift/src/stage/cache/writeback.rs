//! The cache's write-back: runs of dirty blocks written below, FLUSH, the
//! dirty limit that holds writers, and the background flusher.
//!
//! Contract: a write-back snapshots dirty blocks under the lock and marks
//! their range busy; the writes below and the settling of each run happen
//! in a task of its own, so a dropped caller cannot leave blocks busy. A
//! run's blocks turn clean only if unchanged since the snapshot (their
//! generation is the one written). [`Inner::write_back_set`] returns once
//! every block it was given has had a snapshot at least as new as the
//! given generation written below, or has left the cache; FLUSH, FUA and
//! block status are built on it.

use super::map::{BlockGen, State};
use super::{notified_enabled, Inner};
use crate::block::{Completion, Errno, Flags, Request};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Write-backs in flight below at once, per batch of runs.
const WB_WINDOW: usize = 64;

/// Adjacent dirty blocks written back as one write.
struct Run {
    /// First block.
    b0: u64,
    /// End block (exclusive).
    b1: u64,
    /// Id of the busy range held for `[b0, b1)`.
    busy: u64,
    /// The blocks' data at the snapshot.
    data: Bytes,
    /// Each block's generation at the snapshot.
    gens: Vec<u64>,
}

/// The background flusher: one round every quarter of `max_age` (between
/// 1 ms and 100 ms) or when kicked, until the cache is dropped.
pub(super) async fn flusher(weak: Weak<Inner>) {
    let tick = {
        let Some(i) = weak.upgrade() else { return };
        (i.cfg.max_age / 4).clamp(Duration::from_millis(1), Duration::from_millis(100))
    };
    loop {
        let Some(i) = weak.upgrade() else { return };
        let _ = tokio::time::timeout(tick, i.kick.notified()).await;
        i.background().await;
    }
}

impl Inner {
    /// Waits while dirty data is over the limit. While it waits, its
    /// length counts in `throttled`, so the flusher frees at least that
    /// much even when dirty data is not over `dirty_target` (a target equal
    /// to the limit would otherwise leave the writer to wait for max_age).
    pub(super) async fn throttle(&self, len: u64) {
        struct Waiting<'a>(&'a AtomicU64, u64);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(self.1, Relaxed);
            }
        }
        let mut waiting = None;
        loop {
            let n = notified_enabled(&self.changed);
            {
                let st = self.lock();
                if st.dirty_bytes == 0 || st.dirty_bytes + len <= self.cfg.dirty_limit {
                    if st.dirty_bytes > self.cfg.dirty_target {
                        self.kick.notify_one();
                    }
                    return;
                }
            }
            if waiting.is_none() {
                self.throttled.fetch_add(len, Relaxed);
                waiting = Some(Waiting(&self.throttled, len));
            }
            self.kick.notify_one();
            n.await;
        }
    }

    /// Writes back the dirty, non-busy blocks among `cand` (sorted), each
    /// extended by its dirty neighbours into runs of up to max_run blocks.
    /// Returns how many runs were written.
    async fn write_back(self: &Arc<Self>, cand: &[u64]) -> Result<usize, Errno> {
        let bs = self.bs();
        let mut runs: Vec<Run> = Vec::new();
        {
            let mut st = self.lock();
            let mut taken: BTreeSet<u64> = BTreeSet::new();
            for &b in cand {
                if taken.contains(&b)
                    || !st.map.get(&b).is_some_and(|e| e.dirty)
                    || st.is_busy(b, b + 1)
                {
                    continue;
                }
                let ok = |st: &State, x: u64, taken: &BTreeSet<u64>| {
                    !taken.contains(&x) && st.dirty.contains(&x) && !st.is_busy(x, x + 1)
                };
                let (mut s, mut e) = (b, b + 1);
                while s > 0 && e - s < self.max_run && ok(&st, s - 1, &taken) {
                    s -= 1;
                }
                while e - s < self.max_run && ok(&st, e, &taken) {
                    e += 1;
                }
                let mut buf = BytesMut::with_capacity(((e - s) * bs) as usize);
                let mut gens = Vec::with_capacity((e - s) as usize);
                for x in s..e {
                    let en = &st.map[&x];
                    buf.extend_from_slice(&en.data);
                    gens.push(en.gen);
                    taken.insert(x);
                }
                let busy = st.push_busy(s, e);
                runs.push(Run {
                    b0: s,
                    b1: e,
                    busy,
                    data: buf.freeze(),
                    gens,
                });
            }
        }
        if runs.is_empty() {
            return Ok(0);
        }
        // The I/O and the bookkeeping run in a task of their own, so that a
        // caller dropping its future cannot leave blocks busy, or release
        // them while a write is still on its way below.
        let me = self.clone();
        tokio::spawn(async move { me.finish_write_back(runs).await })
            .await
            .unwrap_or(Err(Errno::EIO))
    }

    /// Writes `runs` below, at most [`WB_WINDOW`] at a time, and settles
    /// each run as soon as its write completes: its blocks stop being busy
    /// and turn clean (if unchanged since the snapshot), so writers held
    /// by the dirty limit resume with the first completion rather than
    /// the last.
    async fn finish_write_back(&self, runs: Vec<Run>) -> Result<usize, Errno> {
        let bs = self.bs();
        let mut set = tokio::task::JoinSet::new();
        let mut index: HashMap<tokio::task::Id, usize> = HashMap::new();
        let mut next = 0;
        let mut err = None;
        loop {
            while next < runs.len() && set.len() < WB_WINDOW {
                let r = &runs[next];
                self.writebacks.fetch_add(1, Relaxed);
                self.writeback_bytes.fetch_add(r.data.len() as u64, Relaxed);
                let fut = self.below.submit(Request::Write {
                    offset: r.b0 * bs,
                    data: r.data.clone(),
                    flags: Flags::NONE,
                });
                index.insert(set.spawn(fut).id(), next);
                next += 1;
            }
            let (id, res) = match set.join_next_with_id().await {
                Some(Ok((id, res))) => (id, res),
                Some(Err(e)) => (e.id(), Err(Errno::EIO)),
                None => break,
            };
            let Some(i) = index.remove(&id) else { continue };
            if let Err(e) = res {
                err.get_or_insert(e);
            }
            self.settle(&runs[i], res.is_ok());
            self.changed.notify_waiters();
        }
        match err {
            Some(e) => Err(e),
            None => Ok(runs.len()),
        }
    }

    /// Ends one write-back run: its range is no longer busy and, if the
    /// write succeeded, each block still at the written generation is clean.
    fn settle(&self, r: &Run, ok: bool) {
        let mut st = self.lock();
        st.drop_busy(r.busy);
        if ok {
            for (x, &g) in (r.b0..r.b1).zip(&r.gens) {
                st.written_back(x, g);
            }
        }
        self.evict(&mut st);
    }

    /// Writes back until every block of `set` has had a snapshot at least
    /// as new as the given generation written (or has left the cache).
    pub(super) async fn write_back_set(
        self: &Arc<Self>,
        mut set: Vec<BlockGen>,
    ) -> Result<(), Errno> {
        loop {
            let n = notified_enabled(&self.changed);
            let todo: Vec<u64> = {
                let st = self.lock();
                set.retain(|x| st.map.get(&x.block).is_some_and(|e| e.flushed_gen < x.gen));
                if set.is_empty() {
                    return Ok(());
                }
                set.iter()
                    .map(|x| x.block)
                    .filter(|&b| st.map.get(&b).is_some_and(|e| e.dirty) && !st.is_busy(b, b + 1))
                    .collect()
            };
            if todo.is_empty() || self.write_back(&todo).await? == 0 {
                n.await;
            }
        }
    }

    /// FLUSH: writes back every block dirty now, then flushes below.
    pub(super) async fn flush(self: Arc<Self>) -> Completion {
        if self.cfg.mode == super::Mode::WriteBack {
            let set = self.lock().dirty_gens(None);
            self.write_back_set(set).await?;
        }
        self.below.submit(Request::Flush).await
    }

    /// One round of the background flusher.
    async fn background(self: &Arc<Self>) {
        for _ in 0..64 {
            let cand: Vec<u64> = {
                let st = self.lock();
                let now = Instant::now();
                // Oldest first: those past max_age, then enough to get
                // down to the target; at most 4096 blocks a pass.
                let mut over = st
                    .dirty_bytes
                    .saturating_sub(self.cfg.dirty_target)
                    .max(self.throttled.load(Relaxed));
                let mut cand: Vec<u64> = Vec::new();
                for (_, &b) in st.dirty_fifo.iter().take(4096) {
                    let old = st
                        .map
                        .get(&b)
                        .is_some_and(|e| now.duration_since(e.dirty_since) >= self.cfg.max_age);
                    if !old && over == 0 {
                        break;
                    }
                    over = over.saturating_sub(self.blk_len(b));
                    cand.push(b);
                }
                cand.sort_unstable();
                cand.dedup();
                cand
            };
            if cand.is_empty() {
                return;
            }
            match self.write_back(&cand).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}
