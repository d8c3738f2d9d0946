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
//!
//! This file: the options ([`build`]), the device ([`CacheDev`]) and its
//! dispatch of requests, the shared state ([`Inner`]) and the flusher
//! task's start and stop. The rest, one job per file:
//! - `map.rs`: the block map, LRU, dirty set, busy ranges and fills
//!   (synchronous bookkeeping under the mutex);
//! - `request.rs`: reads, writes, trims, write-zeroes and block status;
//! - `writeback.rs`: write-back runs, flush, the dirty limit and the
//!   background flusher's rounds;
//! - `metrics.rs`: the stage's /metrics lines.

mod map;
mod metrics;
mod request;
mod writeback;

#[cfg(test)]
mod tests;

use super::{Kind, OptHelp, Opts};
use crate::block::{BlockDev, DevInfo, DevRef, IoFuture, Reply, Request};
use crate::metrics::Instance;
use anyhow::Result;
use map::State;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
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
    /// The `name=` option: the instance label in /metrics (`None`: a number).
    pub name: Option<String>,
}

const MODES: &[&str] = &["writeback", "writethrough", "readonly", "wb", "wt", "ro"];

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "size",
        kind: Kind::Size,
        default: "32M",
        help: "bytes of blocks held (LRU eviction of clean blocks)",
    },
    OptHelp {
        name: "block",
        kind: Kind::Size,
        default: "4k",
        help: "block size, a power of two from 512 to 1M",
    },
    OptHelp {
        name: "mode",
        kind: Kind::Choice(MODES),
        default: "writeback",
        help: "writeback (wb), writethrough (wt) or readonly (ro)",
    },
    OptHelp {
        name: "dirty_limit",
        kind: Kind::Size,
        default: "min(24M,3/4 size)",
        help: "writers wait while dirty bytes would exceed it",
    },
    OptHelp {
        name: "dirty_target",
        kind: Kind::Size,
        default: "min(16M,size/2)",
        help: "the flusher writes back (oldest first) down to it",
    },
    OptHelp {
        name: "max_age",
        kind: Kind::Duration,
        default: "1s",
        help: "dirty blocks older than this are written back",
    },
    OptHelp {
        name: "name",
        kind: Kind::Label,
        default: "a number",
        help: "the `instance` label of its /metrics series",
    },
];

/// Checks the options and works out the defaults that depend on others.
pub fn parse(o: &Opts) -> Result<CacheConfig> {
    let size = o.size("size", 32 << 20)?;
    let block = o.size("block", 4096)?;
    if !block.is_power_of_two() || !(512..=(1 << 20)).contains(&block) {
        return Err(o.err(
            "block",
            format_args!("{block} must be a power of two from 512 to 1M"),
        ));
    }
    if size < 2 * block {
        return Err(o.err(
            "size",
            format_args!("{size} must hold at least two blocks of {block}"),
        ));
    }
    let mode = match o.choice("mode", MODES, "writeback")? {
        "writeback" | "wb" => Mode::WriteBack,
        "writethrough" | "wt" => Mode::WriteThrough,
        _ => Mode::ReadOnly,
    };
    let dirty_limit = o.size("dirty_limit", (24 << 20).min(size / 4 * 3))?;
    let dirty_target = o.size("dirty_target", (16 << 20).min(size / 2).min(dirty_limit))?;
    if dirty_limit > size || dirty_limit < block {
        return Err(o.err(
            "dirty_limit",
            format_args!("{dirty_limit} must be between one block and size ({size})"),
        ));
    }
    if dirty_target > dirty_limit {
        return Err(o.err(
            "dirty_target",
            format_args!("{dirty_target} is above dirty_limit ({dirty_limit})"),
        ));
    }
    Ok(CacheConfig {
        size,
        block,
        mode,
        dirty_limit,
        dirty_target,
        max_age: o.duration("max_age", Duration::from_secs(1))?,
        name: o.label("name")?,
    })
}

pub fn build(o: Opts, below: DevRef) -> Result<DevRef> {
    Ok(Arc::new(CacheDev::new(below, parse(&o)?)))
}

/// What the device, its in-flight requests and the flusher share.
struct Inner {
    below: DevRef,
    cfg: CacheConfig,
    /// Its labels in /metrics.
    id: Instance,
    dev_size: u64,
    /// Most blocks in one request below.
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
            id: Instance::new("cache", cfg.name.clone()),
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
        crate::metrics::register(inner.clone());
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
        *g = Some(rt.spawn(writeback::flusher(weak)));
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

/// A `notified()` future already registered, so a notification sent
/// between a check under the lock and the await is not missed.
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

    /// Length of block `b` (the last block may be short).
    fn blk_len(&self, b: u64) -> u64 {
        self.bs().min(self.dev_size - b * self.bs())
    }

    /// Blocks [b0, b1) covering a byte range (len > 0).
    fn blocks(&self, off: u64, len: u64) -> (u64, u64) {
        (off / self.bs(), (off + len).div_ceil(self.bs()))
    }

    /// Drops least recently used clean blocks while over size.
    fn evict(&self, st: &mut State) {
        let n = st.evict(self.cfg.size);
        self.evictions
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
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
            self.inner.id.name()
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
