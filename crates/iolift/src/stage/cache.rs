//! `cache`: an LRU block cache, write-back, write-through or read-only
//! (DeLiBA III-A: a user-space server has no page cache, so it brings one).
//!
//! `cache[:size=32M,block=4k,mode=writeback,dirty_limit=24M,dirty_target=16M,max_age=1s,name=L]`
//!
//! The device is cut into blocks of `block` bytes; the cache holds up to
//! `size` bytes of them, evicting the least recently used clean block.
//!
//! - writeback: writes land in the cache (a partial write of an uncached
//!   block first reads that block from below) and complete; a background
//!   flusher writes dirty blocks back once they are older than `max_age` or
//!   when dirty data exceeds `dirty_target`; a writer waits while dirty data
//!   is over `dirty_limit`. Runs of adjacent dirty blocks go down as one
//!   write. FLUSH writes back every block dirty when it arrived, then
//!   flushes below. A FUA write is cached, its blocks are written back and
//!   the device below is flushed before it completes.
//! - writethrough: writes go below; once done, the whole blocks they cover
//!   are cached clean.
//! - readonly: writes go below and drop the blocks they touch from the cache.
//!
//! Trim and write-zeroes drop the whole blocks they cover (dirty or not),
//! zero the covered part of a partially covered dirty block, drop a
//! partially covered clean one, and go below.
//!
//! Concurrency: one mutex guards the block map; it is never held across an
//! await. Every write to the device below holds a *busy* block range; busy
//! ranges never overlap, so two write-backs of one block never race and a
//! trim never races a write-back. Each block carries a generation bumped on
//! every change: a write-back marks a block clean only if it is unchanged
//! since the snapshot it wrote (no lost update). A read miss registers a
//! *fill*; any change to its blocks while it is reading below taints it, and
//! a tainted fill is not inserted (no stale data). Misses on busy blocks
//! wait for the range to settle.

use super::metrics::{self, MetricSource};
use super::Opts;
use crate::block::{BlockDev, Completion, DevInfo, DevRef, Errno, Flags, IoFuture, Reply, Request};
use anyhow::{bail, Result};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Hasher for block numbers: one multiply (Fibonacci hashing). The keys are
/// block numbers chosen by clients, but hashbrown's probing copes with
/// clustered values and a cache lookup is on every request's path, where
/// SipHash showed in profiles.
#[derive(Default, Clone, Copy)]
struct BlockHash;

impl std::hash::BuildHasher for BlockHash {
    type Hasher = BlockHasher;
    fn build_hasher(&self) -> BlockHasher {
        BlockHasher(0)
    }
}

struct BlockHasher(u64);

impl std::hash::Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
use tokio::sync::Notify;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    WriteBack,
    WriteThrough,
    ReadOnly,
}

/// Settings of one cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub size: u64,
    pub block: u64,
    pub mode: Mode,
    pub dirty_limit: u64,
    pub dirty_target: u64,
    pub max_age: Duration,
    pub name: String,
}

pub fn build(o: Opts, below: DevRef) -> Result<DevRef> {
    o.check(&[
        "size",
        "block",
        "mode",
        "dirty_limit",
        "dirty_target",
        "max_age",
        "name",
    ])?;
    let size = o.size("size", 32 << 20)?;
    let block = o.size("block", 4096)?;
    if !block.is_power_of_two() || !(512..=(1 << 20)).contains(&block) {
        bail!("stage cache: option block: {block} must be a power of two from 512 to 1M");
    }
    if size < 2 * block {
        bail!("stage cache: option size: {size} must hold at least two blocks of {block}");
    }
    let mode = match o.choice(
        "mode",
        &["writeback", "writethrough", "readonly", "wb", "wt", "ro"],
        "writeback",
    )? {
        "writeback" | "wb" => Mode::WriteBack,
        "writethrough" | "wt" => Mode::WriteThrough,
        _ => Mode::ReadOnly,
    };
    let dirty_limit = o.size("dirty_limit", (24 << 20).min(size / 4 * 3))?;
    let dirty_target = o.size("dirty_target", (16 << 20).min(size / 2).min(dirty_limit))?;
    if dirty_limit > size || dirty_limit < block {
        bail!("stage cache: option dirty_limit: {dirty_limit} must be between one block and size ({size})");
    }
    if dirty_target > dirty_limit {
        bail!(
            "stage cache: option dirty_target: {dirty_target} is above dirty_limit ({dirty_limit})"
        );
    }
    let max_age = o.duration("max_age", Duration::from_secs(1))?;
    let name = o.label("name", &format!("cache{}", metrics::next_id()))?;
    Ok(Arc::new(CacheDev::new(
        below,
        CacheConfig {
            size,
            block,
            mode,
            dirty_limit,
            dirty_target,
            max_age,
            name,
        },
    )))
}

struct Entry {
    data: Vec<u8>,
    dirty: bool,
    /// Generation of the last change.
    gen: u64,
    /// Generation of the newest snapshot written back.
    flushed_gen: u64,
    dirty_since: Instant,
    /// Position in the dirty FIFO; dirty entries only.
    dirty_seq: u64,
    /// LRU position; clean entries only.
    tick: Option<u64>,
}

/// Write-backs in flight below at once, per batch of runs.
const WB_WINDOW: usize = 64;

/// A write-back run: first block, end block, busy id, data, generations.
type Run = (u64, u64, u64, Bytes, Vec<u64>);

struct Fill {
    id: u64,
    b0: u64,
    b1: u64,
    tainted: bool,
}

#[derive(Default)]
struct State {
    map: HashMap<u64, Entry, BlockHash>,
    /// Clean entries by last use.
    lru: BTreeMap<u64, u64>,
    dirty: BTreeSet<u64>,
    /// Dirty blocks, oldest first.
    dirty_fifo: BTreeMap<u64, u64>,
    bytes: u64,
    dirty_bytes: u64,
    tick: u64,
    gen: u64,
    /// Block ranges [b0, b1) with a write below in flight.
    busy: Vec<(u64, u64, u64)>,
    fills: Vec<Fill>,
    ids: u64,
}

struct Inner {
    below: DevRef,
    cfg: CacheConfig,
    dev_size: u64,
    max_run: u64,
    st: Mutex<State>,
    /// Signalled when a busy range is released or a block turns clean.
    changed: Notify,
    /// Wakes the flusher.
    kick: Notify,
    hits: AtomicU64,
    misses: AtomicU64,
    writebacks: AtomicU64,
    writeback_bytes: AtomicU64,
    evictions: AtomicU64,
    /// Bytes of writes waiting at the dirty limit.
    throttled: AtomicU64,
}

pub struct CacheDev {
    inner: Arc<Inner>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

impl CacheDev {
    pub fn new(below: DevRef, cfg: CacheConfig) -> Self {
        let info = below.info();
        let max_run = (1u64 << 20).min(info.max_block as u64).max(cfg.block) / cfg.block;
        let inner = Arc::new(Inner {
            below,
            dev_size: info.size,
            max_run,
            cfg,
            st: Mutex::new(State::default()),
            changed: Notify::new(),
            kick: Notify::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            writebacks: AtomicU64::new(0),
            writeback_bytes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
        });
        metrics::register(inner.clone());
        let dev = CacheDev {
            inner,
            flusher: Mutex::new(None),
        };
        dev.start_flusher();
        dev
    }

    fn start_flusher(&self) {
        if self.inner.cfg.mode != Mode::WriteBack {
            return;
        }
        let mut g = self.flusher.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_some() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        *g = Some(rt.spawn(flusher(weak)));
    }

    fn stop_flusher(&self) {
        if let Some(h) = self
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.abort();
        }
    }

    /// Bytes of dirty data held.
    pub fn dirty_bytes(&self) -> u64 {
        self.inner.lock().dirty_bytes
    }
}

impl Drop for CacheDev {
    fn drop(&mut self) {
        // Process death: the flusher stops, dirty data is gone.
        self.stop_flusher();
    }
}

async fn flusher(weak: Weak<Inner>) {
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

fn trace_on() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("IOLIFT_CACHE_TRACE").is_some())
}

macro_rules! trace {
    ($($a:tt)*) => {
        if trace_on() {
            eprintln!($($a)*);
        }
    };
}

fn ids(d: &[u8]) -> Vec<u64> {
    d.chunks(512)
        .map(|c| u64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8])) & 0xffffff)
        .collect()
}

fn notified_enabled(n: &Notify) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
    let mut f = Box::pin(n.notified());
    f.as_mut().enable();
    f
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bs(&self) -> u64 {
        self.cfg.block
    }

    fn blk_len(&self, b: u64) -> u64 {
        self.bs().min(self.dev_size - b * self.bs())
    }

    /// Blocks [b0, b1) covering a byte range (len > 0).
    fn blocks(&self, off: u64, len: u64) -> (u64, u64) {
        (off / self.bs(), (off + len).div_ceil(self.bs()))
    }

    fn busy(st: &State, b0: u64, b1: u64) -> bool {
        st.busy.iter().any(|&(s, e, _)| s < b1 && b0 < e)
    }

    fn taint(st: &mut State, b0: u64, b1: u64) {
        for f in st.fills.iter_mut() {
            if f.b0 < b1 && b0 < f.b1 {
                f.tainted = true;
            }
        }
    }

    fn touch(st: &mut State, b: u64) {
        st.tick += 1;
        let t = st.tick;
        if let Some(e) = st.map.get_mut(&b) {
            if let Some(old) = e.tick {
                st.lru.remove(&old);
                e.tick = Some(t);
                st.lru.insert(t, b);
            }
        }
    }

    fn remove(st: &mut State, b: u64) {
        trace!("T remove b={b}");
        if let Some(e) = st.map.remove(&b) {
            st.bytes -= e.data.len() as u64;
            if let Some(t) = e.tick {
                st.lru.remove(&t);
            }
            if e.dirty {
                st.dirty_fifo.remove(&e.dirty_seq);
                st.dirty.remove(&b);
                st.dirty_bytes -= e.data.len() as u64;
            }
        }
    }

    fn insert_clean(&self, st: &mut State, b: u64, data: Vec<u8>) {
        trace!("T insert_clean b={b} d={:?}", ids(&data));
        Self::remove(st, b);
        st.gen += 1;
        st.tick += 1;
        let (g, t) = (st.gen, st.tick);
        st.bytes += data.len() as u64;
        st.lru.insert(t, b);
        st.map.insert(
            b,
            Entry {
                data,
                dirty: false,
                gen: g,
                flushed_gen: g,
                dirty_since: Instant::now(),
                dirty_seq: 0,
                tick: Some(t),
            },
        );
    }

    fn mark_dirty(st: &mut State, b: u64) {
        st.gen += 1;
        let g = st.gen;
        let Some(e) = st.map.get_mut(&b) else { return };
        e.gen = g;
        if !e.dirty {
            e.dirty = true;
            e.dirty_since = Instant::now();
            st.tick += 1;
            e.dirty_seq = st.tick;
            st.dirty_fifo.insert(st.tick, b);
            if let Some(t) = e.tick.take() {
                st.lru.remove(&t);
            }
            st.dirty.insert(b);
            st.dirty_bytes += e.data.len() as u64;
        }
    }

    /// Drops least recently used clean blocks while over size.
    fn evict(&self, st: &mut State) {
        if st.bytes <= self.cfg.size {
            return;
        }
        let mut victims = Vec::new();
        let mut freed = 0;
        let need = st.bytes - self.cfg.size;
        for (_, &b) in st.lru.iter() {
            if freed >= need {
                break;
            }
            if !Self::busy(st, b, b + 1) {
                freed += st.map.get(&b).map_or(0, |e| e.data.len() as u64);
                victims.push(b);
            }
        }
        self.evictions.fetch_add(victims.len() as u64, Relaxed);
        for b in victims {
            Self::remove(st, b);
        }
    }

    /// Waits until [b0, b1) is not busy, then marks it busy and runs `f`.
    async fn acquire(&self, b0: u64, b1: u64, mut f: impl FnMut(&mut State)) -> u64 {
        loop {
            let n = notified_enabled(&self.changed);
            {
                let mut st = self.lock();
                if !Self::busy(&st, b0, b1) {
                    st.ids += 1;
                    let id = st.ids;
                    st.busy.push((b0, b1, id));
                    Self::taint(&mut st, b0, b1);
                    f(&mut st);
                    return id;
                }
            }
            n.await;
        }
    }

    fn release(&self, st: &mut State, id: u64) {
        if let Some(p) = st.busy.iter().position(|x| x.2 == id) {
            let (b0, b1, _) = st.busy.swap_remove(p);
            Self::taint(st, b0, b1);
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

    async fn read(self: Arc<Self>, off: u64, len: u32) -> Completion {
        if len == 0 {
            return self.below.submit(Request::Read { offset: off, len }).await;
        }
        let bs = self.bs();
        let (b0, b1) = self.blocks(off, len as u64);
        let end = off + len as u64;
        loop {
            let n = notified_enabled(&self.changed);
            let mut out = BytesMut::zeroed(len as usize);
            let mut runs: Vec<(u64, u64, u64)> = Vec::new(); // (b0, b1, fill id)
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
                        Self::touch(&mut st, b);
                    } else {
                        match runs.last_mut() {
                            Some(r) if r.1 == b => r.1 = b + 1,
                            _ => runs.push((b, b + 1, 0)),
                        }
                    }
                }
                self.hits.fetch_add(hits, Relaxed);
                if runs.is_empty() {
                    return Ok(Reply::Data(out.freeze()));
                }
                if runs.iter().any(|r| Self::busy(&st, r.0, r.1)) {
                    wait = true;
                }
                for r in runs.iter_mut().filter(|_| !wait) {
                    st.ids += 1;
                    r.2 = st.ids;
                    st.fills.push(Fill {
                        id: r.2,
                        b0: r.0,
                        b1: r.1,
                        tainted: false,
                    });
                }
            }
            if wait {
                n.await;
                continue;
            }
            let mut results = Vec::with_capacity(runs.len());
            for r in &runs {
                let o = r.0 * bs;
                let l = (r.1 * bs).min(self.dev_size) - o;
                self.misses.fetch_add(r.1 - r.0, Relaxed);
                results.push(self.read_below(o, l).await);
            }
            let mut st = self.lock();
            let mut err = None;
            for (r, res) in runs.iter().zip(results) {
                let tainted = match st.fills.iter().position(|f| f.id == r.2) {
                    Some(p) => st.fills.swap_remove(p).tainted,
                    None => true,
                };
                let d = match res {
                    Ok(d) => d,
                    Err(e) => {
                        err = Some(e);
                        continue;
                    }
                };
                let base = r.0 * bs;
                let s = base.max(off);
                let t = (base + d.len() as u64).min(end);
                out[(s - off) as usize..(t - off) as usize]
                    .copy_from_slice(&d[(s - base) as usize..(t - base) as usize]);
                if !tainted {
                    for b in r.0..r.1 {
                        if !st.map.contains_key(&b) {
                            let p = ((b - r.0) * bs) as usize;
                            let v = d[p..p + self.blk_len(b) as usize].to_vec();
                            self.insert_clean(&mut st, b, v);
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

    /// Waits while dirty data is over the limit. While it waits, its
    /// length counts in `throttled`, so the flusher frees at least that
    /// much even when dirty data is not over `dirty_target` (a target equal
    /// to the limit would otherwise leave the writer to wait for max_age).
    async fn throttle(&self, len: u64) {
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

    /// Write-back mode: puts a write into the cache. Returns the touched
    /// blocks with their generations.
    async fn cache_write(&self, off: u64, data: &Bytes) -> Result<Vec<(u64, u64)>, Errno> {
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
            let mut fetch: Vec<(u64, u64)> = Vec::new(); // (block, fill id)
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
                let wait = missing.iter().any(|&b| Self::busy(&st, b, b + 1));
                for b in missing.into_iter().filter(|_| !wait) {
                    st.ids += 1;
                    let id = st.ids;
                    st.fills.push(Fill {
                        id,
                        b0: b,
                        b1: b + 1,
                        tainted: false,
                    });
                    fetch.push((b, id));
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
            for &(b, _) in &fetch {
                self.misses.fetch_add(1, Relaxed);
                got.push(self.read_below(b * bs, self.blk_len(b)).await);
            }
            let mut st = self.lock();
            let mut retry = false;
            let mut err = None;
            let mut fetched = Vec::new();
            for (&(b, id), r) in fetch.iter().zip(got) {
                let tainted = match st.fills.iter().position(|f| f.id == id) {
                    Some(p) => st.fills.swap_remove(p).tainted,
                    None => true,
                };
                match r {
                    Err(e) => err = Some(e),
                    Ok(_) if tainted => retry = true,
                    Ok(d) => fetched.push((b, d)),
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
                    self.insert_clean(&mut st, b, d.to_vec());
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

    fn apply(&self, st: &mut State, off: u64, data: &Bytes) -> Vec<(u64, u64)> {
        let bs = self.bs();
        let end = off + data.len() as u64;
        let (b0, b1) = self.blocks(off, data.len() as u64);
        let mut touched = Vec::with_capacity((b1 - b0) as usize);
        for b in b0..b1 {
            let bl = self.blk_len(b);
            let s = (b * bs).max(off);
            let t = (b * bs + bl).min(end);
            if !st.map.contains_key(&b) {
                // Whole block (partial ones were fetched by the caller):
                // built from the payload, no zero fill.
                debug_assert_eq!(t - s, bl);
                st.bytes += bl;
                st.map.insert(
                    b,
                    Entry {
                        data: data[(s - off) as usize..(t - off) as usize].to_vec(),
                        dirty: false,
                        gen: 0,
                        flushed_gen: 0,
                        dirty_since: Instant::now(),
                        dirty_seq: 0,
                        tick: None,
                    },
                );
            } else if let Some(e) = st.map.get_mut(&b) {
                e.data[(s - b * bs) as usize..(t - b * bs) as usize]
                    .copy_from_slice(&data[(s - off) as usize..(t - off) as usize]);
            }
            Self::mark_dirty(st, b);
            trace!("T apply b={b} gen={} d={:?}", st.gen, ids(&st.map[&b].data));
            touched.push((b, st.gen));
        }
        Self::taint(st, b0, b1);
        self.evict(st);
        touched
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
                    || Self::busy(&st, b, b + 1)
                {
                    continue;
                }
                let ok = |st: &State, x: u64, taken: &BTreeSet<u64>| {
                    !taken.contains(&x) && st.dirty.contains(&x) && !Self::busy(st, x, x + 1)
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
                    trace!("T wb_start b={x} g={} d={:?}", en.gen, ids(&en.data));
                    buf.extend_from_slice(&en.data);
                    gens.push(en.gen);
                    taken.insert(x);
                }
                st.ids += 1;
                let id = st.ids;
                st.busy.push((s, e, id));
                runs.push((s, e, id, buf.freeze(), gens));
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
                self.writeback_bytes.fetch_add(r.3.len() as u64, Relaxed);
                let fut = self.below.submit(Request::Write {
                    offset: r.0 * bs,
                    data: r.3.clone(),
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
        if let Some(p) = st.busy.iter().position(|x| x.2 == r.2) {
            st.busy.swap_remove(p);
        }
        if ok {
            for (x, &g) in (r.0..r.1).zip(&r.4) {
                let mut clean = false;
                if let Some(en) = st.map.get_mut(&x) {
                    en.flushed_gen = en.flushed_gen.max(g);
                    clean = en.dirty && en.gen == g;
                }
                trace!("T wb_done b={x} g={g} clean={clean}");
                if clean {
                    st.tick += 1;
                    let t = st.tick;
                    let en = st.map.get_mut(&x).expect("present");
                    en.dirty = false;
                    en.tick = Some(t);
                    let l = en.data.len() as u64;
                    let seq = en.dirty_seq;
                    st.dirty_fifo.remove(&seq);
                    st.lru.insert(t, x);
                    st.dirty.remove(&x);
                    st.dirty_bytes -= l;
                }
            }
        }
        self.evict(&mut st);
    }

    /// Writes back until every block of `set` has had a snapshot at least
    /// as new as the given generation written (or has left the cache).
    async fn write_back_set(self: &Arc<Self>, mut set: Vec<(u64, u64)>) -> Result<(), Errno> {
        loop {
            let n = notified_enabled(&self.changed);
            let todo: Vec<u64> = {
                let st = self.lock();
                set.retain(|(b, g)| st.map.get(b).is_some_and(|e| e.flushed_gen < *g));
                if set.is_empty() {
                    return Ok(());
                }
                set.iter()
                    .map(|x| x.0)
                    .filter(|&b| {
                        st.map.get(&b).is_some_and(|e| e.dirty) && !Self::busy(&st, b, b + 1)
                    })
                    .collect()
            };
            if todo.is_empty() || self.write_back(&todo).await? == 0 {
                n.await;
            }
        }
    }

    async fn flush(self: Arc<Self>) -> Completion {
        if self.cfg.mode == Mode::WriteBack {
            let set: Vec<(u64, u64)> = {
                let st = self.lock();
                st.dirty.iter().map(|b| (*b, st.map[b].gen)).collect()
            };
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

    async fn write(self: Arc<Self>, off: u64, data: Bytes, flags: Flags) -> Completion {
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
                    Self::remove(st, b);
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
                            me.insert_clean(&mut st, b, data[p..p + bl as usize].to_vec());
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

    /// Trim and write-zeroes.
    async fn discard(self: Arc<Self>, req: Request) -> Completion {
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
                            Self::mark_dirty(st, b);
                            touched.push((b, st.gen));
                        }
                        Some(_) => Self::remove(st, b),
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

    async fn block_status(self: Arc<Self>, off: u64, len: u32) -> Completion {
        if self.cfg.mode == Mode::WriteBack && len > 0 {
            // Dirty data must be below before the allocation map is read.
            let (b0, b1) = self.blocks(off, len as u64);
            let set: Vec<(u64, u64)> = {
                let st = self.lock();
                st.dirty
                    .range(b0..b1)
                    .map(|b| (*b, st.map[b].gen))
                    .collect()
            };
            self.write_back_set(set).await?;
        }
        self.below
            .submit(Request::BlockStatus { offset: off, len })
            .await
    }
}

impl MetricSource for Inner {
    fn render(&self, out: &mut String) {
        let n = &self.cfg.name;
        let (bytes, dirty) = {
            let st = self.lock();
            (st.bytes, st.dirty_bytes)
        };
        for (k, v) in [
            ("hits_total", self.hits.load(Relaxed)),
            ("misses_total", self.misses.load(Relaxed)),
            ("writebacks_total", self.writebacks.load(Relaxed)),
            ("writeback_bytes_total", self.writeback_bytes.load(Relaxed)),
            ("evictions_total", self.evictions.load(Relaxed)),
            ("bytes", bytes),
            ("dirty_bytes", dirty),
        ] {
            let _ = writeln!(out, "iolift_cache_{k}{{stage=\"{n}\"}} {v}");
        }
    }

    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[
            (
                "iolift_cache_hits_total",
                "counter",
                "Blocks read from the cache.",
            ),
            (
                "iolift_cache_misses_total",
                "counter",
                "Blocks read from below.",
            ),
            (
                "iolift_cache_writebacks_total",
                "counter",
                "Write-back requests sent below.",
            ),
            (
                "iolift_cache_writeback_bytes_total",
                "counter",
                "Bytes written back.",
            ),
            (
                "iolift_cache_evictions_total",
                "counter",
                "Clean blocks evicted.",
            ),
            ("iolift_cache_bytes", "gauge", "Bytes cached."),
            ("iolift_cache_dirty_bytes", "gauge", "Dirty bytes cached."),
        ]
    }
}

impl BlockDev for CacheDev {
    fn info(&self) -> DevInfo {
        let mut i = self.inner.below.info();
        if self.inner.cfg.mode == Mode::WriteBack {
            i.can_flush = true;
            i.can_fua = true;
        }
        i
    }

    fn submit(&self, req: Request) -> IoFuture {
        self.start_flusher();
        let i = self.inner.clone();
        match req {
            Request::Read { offset, len } => Box::pin(i.read(offset, len)),
            Request::Write {
                offset,
                data,
                flags,
            } => Box::pin(i.write(offset, data, flags)),
            Request::Flush => Box::pin(i.flush()),
            Request::Trim { .. } | Request::WriteZeroes { .. } => Box::pin(i.discard(req)),
            Request::Cache { offset, len } => {
                Box::pin(async move { i.read(offset, len).await.map(|_| Reply::Done(0)) })
            }
            Request::BlockStatus { offset, len } => Box::pin(i.block_status(offset, len)),
        }
    }

    fn name(&self) -> String {
        format!(
            "cache({},{})",
            crate::util::format_size(self.inner.cfg.size),
            self.inner.cfg.name
        )
    }

    fn close(&self) -> IoFuture {
        let i = self.inner.clone();
        let h = self
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        Box::pin(async move {
            let r = i.clone().flush().await;
            if let Some(h) = h {
                h.abort();
            }
            r?;
            i.below.close().await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDev;
    use crate::block::BlockDevExt;
    use tokio::sync::Semaphore;

    /// Memory whose writes each wait for a permit, so a test decides when
    /// each write-back completes.
    struct Gate {
        mem: Arc<MemoryDev>,
        permits: Arc<Semaphore>,
        started: Arc<AtomicU64>,
    }

    impl BlockDev for Gate {
        fn info(&self) -> DevInfo {
            // One block per write below: every dirty block is its own run.
            DevInfo {
                max_block: 4096,
                ..self.mem.info()
            }
        }
        fn submit(&self, req: Request) -> IoFuture {
            if !matches!(req, Request::Write { .. }) {
                return self.mem.submit(req);
            }
            self.started.fetch_add(1, Relaxed);
            let (p, mem) = (self.permits.clone(), self.mem.clone());
            Box::pin(async move {
                p.acquire().await.expect("open").forget();
                mem.submit(req).await
            })
        }
        fn name(&self) -> String {
            "gate".into()
        }
    }

    fn gate() -> (Arc<MemoryDev>, Arc<Semaphore>, Arc<AtomicU64>, Arc<Gate>) {
        let mem = Arc::new(MemoryDev::new(64 << 20));
        let permits = Arc::new(Semaphore::new(0));
        let started = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Gate {
            mem: mem.clone(),
            permits: permits.clone(),
            started: started.clone(),
        });
        (mem, permits, started, gate)
    }

    fn wb_config(limit: u64, target: u64) -> CacheConfig {
        CacheConfig {
            size: 4 << 20,
            block: 4096,
            mode: Mode::WriteBack,
            dirty_limit: limit,
            dirty_target: target,
            max_age: Duration::from_secs(3600),
            name: "wbtest".into(),
        }
    }

    async fn wait_started(started: &AtomicU64, n: u64) {
        for _ in 0..5000 {
            if started.load(Relaxed) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!(
            "write-backs started: {}, expected {n}",
            started.load(Relaxed)
        );
    }

    /// A writer held at the dirty limit resumes as soon as one write-back
    /// completes, not when the whole pass of write-backs has.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn throttled_writer_resumes_on_first_write_back() {
        let (mem, permits, started, gate) = gate();
        let cache = CacheDev::new(gate, wb_config(256 << 10, 128 << 10));
        // Up to the target with 32 scattered blocks: nothing over the
        // target yet, so the flusher has nothing to do.
        for i in 0..32u64 {
            let r = cache
                .write(i * 8192, Bytes::from(vec![i as u8 + 1; 4096]), Flags::NONE)
                .await;
            assert_eq!(r, Ok(Reply::Done(4096)));
        }
        // One 128K write takes dirty data from the target to the limit at
        // once, so any flusher pass from now on writes back exactly the 32
        // oldest (scattered) blocks, 32 runs.
        let r = cache
            .write(1 << 20, Bytes::from(vec![0x55; 128 << 10]), Flags::NONE)
            .await;
        assert_eq!(r, Ok(Reply::Done(128 << 10)));
        assert_eq!(cache.dirty_bytes(), 256 << 10);
        // Over the limit: this one waits for write-back.
        let held = tokio::spawn(cache.write(2 << 20, Bytes::from(vec![0xAA; 4096]), Flags::NONE));
        wait_started(&started, 32).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(started.load(Relaxed), 32, "one pass of 32 runs");
        assert!(!held.is_finished(), "writer went past the dirty limit");
        // One write-back completes: the writer must go on while the other
        // 31 are still held below.
        permits.add_permits(1);
        let r = tokio::time::timeout(Duration::from_secs(10), held)
            .await
            .expect("writer still held after a write-back completed")
            .expect("task");
        assert_eq!(r, Ok(Reply::Done(4096)));
        assert!(cache.dirty_bytes() > 128 << 10);
        // Let everything through; a flush leaves nothing dirty and the data
        // below is what was written.
        permits.add_permits(10_000);
        cache.flush().await.unwrap();
        assert_eq!(cache.dirty_bytes(), 0);
        for i in 0..32u64 {
            let d = mem.read(i * 8192, 4096).await.unwrap();
            assert!(d.iter().all(|&b| b == i as u8 + 1), "block {i}");
        }
        let d = mem.read(1 << 20, 128 << 10).await.unwrap();
        assert!(d.iter().all(|&b| b == 0x55));
        let d = mem.read(2 << 20, 4096).await.unwrap();
        assert!(d.iter().all(|&b| b == 0xAA));
    }

    /// dirty_target equal to dirty_limit: a writer at the limit still gets
    /// room (the flusher writes back what the waiting writer needs) instead
    /// of waiting for max_age.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn target_equal_to_limit_does_not_stall_writers() {
        let (mem, permits, started, gate) = gate();
        permits.add_permits(1 << 20);
        let cache = CacheDev::new(gate, wb_config(64 << 10, 64 << 10));
        for i in 0..32u64 {
            let w = cache.write(i * 8192, Bytes::from(vec![i as u8 + 1; 4096]), Flags::NONE);
            let r = tokio::time::timeout(Duration::from_secs(10), w)
                .await
                .expect("writer stalled at the dirty limit");
            assert_eq!(r, Ok(Reply::Done(4096)));
        }
        assert!(started.load(Relaxed) >= 16, "{started:?}");
        assert!(cache.dirty_bytes() <= 64 << 10);
        cache.flush().await.unwrap();
        for i in 0..32u64 {
            let d = mem.read(i * 8192, 4096).await.unwrap();
            assert!(d.iter().all(|&b| b == i as u8 + 1), "block {i}");
        }
    }
}
