//! The cache's request handling: reads (hits from the map, misses read
//! from below and inserted), writes in each mode, trims and write-zeroes,
//! and block status.
//!
//! Contract: every function here takes the block-map lock only between
//! awaits; a read miss registers a fill before it reads below and inserts
//! what it read only if the fill is untainted; a write or discard that goes
//! below holds a busy range for its blocks until it is done below, in a
//! task of its own so that a dropped caller cannot leave the range busy.
//! Write-back writes and FUA ask `writeback.rs` to write their blocks back.

use super::map::{BlockGen, State};
use super::{notified_enabled, Inner, Mode};
use crate::block::{Completion, Errno, Flags, Reply, Request};
use bytes::{Bytes, BytesMut};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Blocks `[b0, b1)` missing from the cache, read from below under fill
/// `fill`.
struct Miss {
    b0: u64,
    b1: u64,
    fill: u64,
}

impl Inner {
    /// Waits until [b0, b1) is not busy, then marks it busy (tainting the
    /// fills it overlaps) and runs `f`. Returns the busy range's id.
    async fn acquire(&self, b0: u64, b1: u64, mut f: impl FnMut(&mut State)) -> u64 {
        loop {
            let n = notified_enabled(&self.changed);
            {
                let mut st = self.lock();
                if !st.is_busy(b0, b1) {
                    let id = st.push_busy(b0, b1);
                    st.taint(b0, b1);
                    f(&mut st);
                    return id;
                }
            }
            n.await;
        }
    }

    /// Ends busy range `id` and taints the fills it overlaps.
    fn release(&self, st: &mut State, id: u64) {
        if let Some(r) = st.drop_busy(id) {
            st.taint(r.b0, r.b1);
        }
    }

    /// Reads [off, off+len) from below, in pieces of at most max_run blocks.
    async fn read_below(&self, off: u64, len: u64) -> Result<Bytes, Errno> {
        let max = self.max_run * self.bs();
        if len <= max {
            return match self
                .below
                .submit(Request::Read {
                    offset: off,
                    len: len as u32,
                })
                .await?
            {
                Reply::Data(d) if d.len() as u64 == len => Ok(d),
                _ => Err(Errno::EIO),
            };
        }
        let mut out = BytesMut::with_capacity(len as usize);
        let mut done = 0;
        while done < len {
            let n = max.min(len - done);
            match self
                .below
                .submit(Request::Read {
                    offset: off + done,
                    len: n as u32,
                })
                .await?
            {
                Reply::Data(d) if d.len() as u64 == n => out.extend_from_slice(&d),
                _ => return Err(Errno::EIO),
            }
            done += n;
        }
        Ok(out.freeze())
    }

    pub(super) async fn read(self: Arc<Self>, off: u64, len: u32) -> Completion {
        if len == 0 {
            return self.below.submit(Request::Read { offset: off, len }).await;
        }
        let bs = self.bs();
        let (b0, b1) = self.blocks(off, len as u64);
        let end = off + len as u64;
        loop {
            let n = notified_enabled(&self.changed);
            let mut out = BytesMut::zeroed(len as usize);
            let mut runs: Vec<Miss> = Vec::new();
            let mut wait = false;
            {
                let mut st = self.lock();
                let mut hits = 0;
                for b in b0..b1 {
                    if let Some(e) = st.map.get(&b) {
                        let s = (b * bs).max(off);
                        let t = (b * bs + e.data.len() as u64).min(end);
                        out[(s - off) as usize..(t - off) as usize]
                            .copy_from_slice(&e.data[(s - b * bs) as usize..(t - b * bs) as usize]);
                        hits += 1;
                        st.touch(b);
                    } else {
                        match runs.last_mut() {
                            Some(r) if r.b1 == b => r.b1 = b + 1,
                            _ => runs.push(Miss {
                                b0: b,
                                b1: b + 1,
                                fill: 0,
                            }),
                        }
                    }
                }
                self.hits.fetch_add(hits, Relaxed);
                if runs.is_empty() {
                    return Ok(Reply::Data(out.freeze()));
                }
                if runs.iter().any(|r| st.is_busy(r.b0, r.b1)) {
                    wait = true;
                }
                for r in runs.iter_mut().filter(|_| !wait) {
                    r.fill = st.push_fill(r.b0, r.b1);
                }
            }
            if wait {
                n.await;
                continue;
            }
            let mut results = Vec::with_capacity(runs.len());
            for r in &runs {
                let o = r.b0 * bs;
                let l = (r.b1 * bs).min(self.dev_size) - o;
                self.misses.fetch_add(r.b1 - r.b0, Relaxed);
                results.push(self.read_below(o, l).await);
            }
            let mut st = self.lock();
            let mut err = None;
            for (r, res) in runs.iter().zip(results) {
                let tainted = st.take_fill(r.fill);
                let d = match res {
                    Ok(d) => d,
                    Err(e) => {
                        err = Some(e);
                        continue;
                    }
                };
                let base = r.b0 * bs;
                let s = base.max(off);
                let t = (base + d.len() as u64).min(end);
                out[(s - off) as usize..(t - off) as usize]
                    .copy_from_slice(&d[(s - base) as usize..(t - base) as usize]);
                if !tainted {
                    for b in r.b0..r.b1 {
                        if !st.map.contains_key(&b) {
                            let p = ((b - r.b0) * bs) as usize;
                            let v = d[p..p + self.blk_len(b) as usize].to_vec();
                            st.insert_clean(b, v);
                        }
                    }
                }
            }
            self.evict(&mut st);
            return match err {
                Some(e) => Err(e),
                None => Ok(Reply::Data(out.freeze())),
            };
        }
    }

    pub(super) async fn write(self: Arc<Self>, off: u64, data: Bytes, flags: Flags) -> Completion {
        let len = data.len() as u64;
        if len == 0 {
            return self
                .below
                .submit(Request::Write {
                    offset: off,
                    data,
                    flags,
                })
                .await;
        }
        if self.cfg.mode == Mode::WriteBack {
            let touched = self.cache_write(off, &data).await?;
            if flags.fua {
                self.write_back_set(touched).await?;
                self.below.submit(Request::Flush).await?;
            }
            return Ok(Reply::Done(len));
        }
        let bs = self.bs();
        let (b0, b1) = self.blocks(off, len);
        let id = self
            .acquire(b0, b1, |st| {
                for b in b0..b1 {
                    st.remove(b);
                }
            })
            .await;
        // In a task of its own: the busy range is released only once the
        // write is done below, even if the caller goes away.
        let me = self.clone();
        tokio::spawn(async move {
            let r = me
                .below
                .submit(Request::Write {
                    offset: off,
                    data: data.clone(),
                    flags,
                })
                .await;
            {
                let mut st = me.lock();
                if r.is_ok() && me.cfg.mode == Mode::WriteThrough {
                    for b in b0..b1 {
                        let s = b * bs;
                        let bl = me.blk_len(b);
                        if s >= off && s + bl <= off + len {
                            let p = (s - off) as usize;
                            st.insert_clean(b, data[p..p + bl as usize].to_vec());
                        }
                    }
                    me.evict(&mut st);
                }
                me.release(&mut st, id);
            }
            me.changed.notify_waiters();
            r
        })
        .await
        .unwrap_or(Err(Errno::EIO))
    }

    /// Write-back mode: puts a write into the cache. Returns the touched
    /// blocks with their generations.
    async fn cache_write(&self, off: u64, data: &Bytes) -> Result<Vec<BlockGen>, Errno> {
        let bs = self.bs();
        let len = data.len() as u64;
        let end = off + len;
        let (b0, b1) = self.blocks(off, len);
        self.throttle(len).await;
        let partial: Vec<u64> = [b0, b1 - 1]
            .into_iter()
            .filter(|&b| b * bs < off || (b * bs + self.blk_len(b)) > end)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        loop {
            let n = notified_enabled(&self.changed);
            let mut fetch: Vec<Miss> = Vec::new();
            {
                let mut st = self.lock();
                let missing: Vec<u64> = partial
                    .iter()
                    .copied()
                    .filter(|b| !st.map.contains_key(b))
                    .collect();
                if missing.is_empty() {
                    return Ok(self.apply(&mut st, off, data));
                }
                let wait = missing.iter().any(|&b| st.is_busy(b, b + 1));
                for b in missing.into_iter().filter(|_| !wait) {
                    let fill = st.push_fill(b, b + 1);
                    fetch.push(Miss {
                        b0: b,
                        b1: b + 1,
                        fill,
                    });
                }
                if wait {
                    fetch.clear();
                }
            }
            if fetch.is_empty() {
                n.await;
                continue;
            }
            let mut got = Vec::new();
            for m in &fetch {
                self.misses.fetch_add(1, Relaxed);
                got.push(self.read_below(m.b0 * bs, self.blk_len(m.b0)).await);
            }
            let mut st = self.lock();
            let mut retry = false;
            let mut err = None;
            let mut fetched = Vec::new();
            for (m, r) in fetch.iter().zip(got) {
                let tainted = st.take_fill(m.fill);
                match r {
                    Err(e) => err = Some(e),
                    Ok(_) if tainted => retry = true,
                    Ok(d) => fetched.push((m.b0, d)),
                }
            }
            if let Some(e) = err {
                return Err(e);
            }
            if retry {
                continue;
            }
            for (b, d) in fetched {
                if !st.map.contains_key(&b) {
                    st.insert_clean(b, d.to_vec());
                }
            }
            // A partial block present at the first look may have been
            // evicted while this one was read.
            if partial.iter().any(|b| !st.map.contains_key(b)) {
                continue;
            }
            return Ok(self.apply(&mut st, off, data));
        }
    }

    /// Copies a write into the cache (its partial blocks are present) and
    /// marks its blocks dirty.
    fn apply(&self, st: &mut State, off: u64, data: &Bytes) -> Vec<BlockGen> {
        let bs = self.bs();
        let end = off + data.len() as u64;
        let (b0, b1) = self.blocks(off, data.len() as u64);
        let mut touched = Vec::with_capacity((b1 - b0) as usize);
        for b in b0..b1 {
            let bl = self.blk_len(b);
            let s = (b * bs).max(off);
            let t = (b * bs + bl).min(end);
            if let Some(e) = st.map.get_mut(&b) {
                e.data[(s - b * bs) as usize..(t - b * bs) as usize]
                    .copy_from_slice(&data[(s - off) as usize..(t - off) as usize]);
                st.mark_dirty(b);
            } else {
                // Whole block (partial ones were fetched by the caller):
                // built from the payload, no zero fill.
                debug_assert_eq!(t - s, bl);
                st.insert_dirty(b, data[(s - off) as usize..(t - off) as usize].to_vec());
            }
            touched.push(BlockGen {
                block: b,
                gen: st.gen,
            });
        }
        st.taint(b0, b1);
        self.evict(st);
        touched
    }

    /// Trim and write-zeroes.
    pub(super) async fn discard(self: Arc<Self>, req: Request) -> Completion {
        let Some((off, len)) = req.range() else {
            return Err(Errno::EINVAL);
        };
        if len == 0 {
            return self.below.submit(req).await;
        }
        let bs = self.bs();
        let end = off + len;
        let (b0, b1) = self.blocks(off, len);
        let mut touched = Vec::new();
        let id = self
            .acquire(b0, b1, |st| {
                for b in b0..b1 {
                    let s = b * bs;
                    let bl = self.blk_len(b);
                    let whole = s >= off && s + bl <= end;
                    let dirty = st.map.get(&b).map(|e| e.dirty);
                    match dirty {
                        None => {}
                        Some(true) if !whole => {
                            let a = off.max(s) - s;
                            let z = end.min(s + bl) - s;
                            if let Some(e) = st.map.get_mut(&b) {
                                e.data[a as usize..z as usize].fill(0);
                            }
                            st.mark_dirty(b);
                            touched.push(BlockGen {
                                block: b,
                                gen: st.gen,
                            });
                        }
                        Some(_) => st.remove(b),
                    }
                }
            })
            .await;
        let fua = req.flags().fua;
        let me = self.clone();
        let r = tokio::spawn(async move {
            let r = me.below.submit(req).await;
            {
                let mut st = me.lock();
                me.release(&mut st, id);
            }
            me.changed.notify_waiters();
            r
        })
        .await
        .unwrap_or(Err(Errno::EIO));
        if r.is_ok() && fua && !touched.is_empty() {
            self.write_back_set(touched).await?;
            self.below.submit(Request::Flush).await?;
        }
        r
    }

    pub(super) async fn block_status(self: Arc<Self>, off: u64, len: u32) -> Completion {
        if self.cfg.mode == Mode::WriteBack && len > 0 {
            // Dirty data must be below before the allocation map is read.
            let (b0, b1) = self.blocks(off, len as u64);
            let set = self.lock().dirty_gens(Some((b0, b1)));
            self.write_back_set(set).await?;
        }
        self.below
            .submit(Request::BlockStatus { offset: off, len })
            .await
    }
}
