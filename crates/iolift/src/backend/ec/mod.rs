//! `ec:CHILDREN,k=4,m=2,chunk=64K`: an erasure-coded device over k+m child
//! devices. The data survives the loss of any m children; reads of a lost,
//! failing or corrupt chunk are decoded from the others, corrupt chunks
//! are repaired in place, replaced children are rebuilt (online, or with
//! `iolift ec rebuild`).
//!
//! Files, one job each: `children.rs` (the children list), `layout.rs`
//! (what each child holds, superblock and journal records), `open.rs`
//! (format or assemble, load, replay), `io.rs` (child I/O, failures),
//! `read.rs` (reads, decoding, repair), `write.rs` (the stripe update),
//! `wb.rs` (the write-back stripe buffer), `bitmap.rs` (the write-intent
//! bitmap and resync), `journal.rs` (replay after a crash), `rebuild.rs`
//! (rebuild and check), `gpu.rs` (encoding on the offload engine),
//! `meta.rs` (crc-table pages written at a flush), `encode.rs` (parity
//! and crcs in one pass), `run.rs` (runs of whole stripes as one update),
//! `pool.rs` (parity buffers reused), `metrics.rs`.
//! See docs/ec-device.md for the layout, the crash rule and the budgets.

use super::{BackendSpec, Kind, OptHelp};
use crate::block::{ready, BlockDev, DevInfo, DevRef, Errno, Extent, IoFuture, Reply, Request};
use anyhow::{bail, Context, Result};
use iolift_ec::{Codec, Profile};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

mod bitmap;
pub mod children;
mod encode;
mod gpu;
mod io;
mod join;
mod journal;
pub mod layout;
mod meta;
mod metrics;
mod open;
mod pool;
mod read;
pub mod rebuild;
mod run;
mod wb;
mod write;

use children::ChildSpec;
use layout::{Geometry, BLOCK, MAX_CHUNK};

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "k",
        kind: Kind::Count,
        default: "4",
        help: "data chunks per stripe",
    },
    OptHelp {
        name: "m",
        kind: Kind::Count,
        default: "2",
        help: "parity chunks per stripe (children that may be lost)",
    },
    OptHelp {
        name: "chunk",
        kind: Kind::Size,
        default: "64K",
        help: "bytes of one chunk (a multiple of 4K, at most 2M)",
    },
    OptHelp {
        name: "plugin",
        kind: Kind::Choice(&["isa", "jerasure"]),
        default: "isa",
        help: "the code's family, as Ceph's erasure-code plugins",
    },
    OptHelp {
        name: "technique",
        kind: Kind::Text("TECHNIQUE"),
        default: "reed_sol_van",
        help: "reed_sol_van, cauchy (isa); reed_sol_van, reed_sol_r6_op, cauchy_orig, cauchy_good (jerasure)",
    },
    OptHelp {
        name: "packetsize",
        kind: Kind::Count,
        default: "2048",
        help: "packet size of jerasure's cauchy techniques",
    },
    OptHelp {
        name: "size",
        kind: Kind::Size,
        default: "all",
        help: "logical size (default: as much as the smallest child holds)",
    },
    OptHelp {
        name: "slots",
        kind: Kind::Count,
        default: "64",
        help: "journal slots = stripes updated at once (memory: slots x (k+m) x chunk)",
    },
    OptHelp {
        name: "device",
        kind: Kind::Choice(&["cpu", "gpu"]),
        default: "cpu",
        help: "where full-stripe parity is computed (gpu: batched on the offload engine)",
    },
    OptHelp {
        name: "consistency",
        kind: Kind::Choice(&["bitmap", "journal"]),
        default: "bitmap",
        help: "crash safety of parity updates: a write-intent bitmap and resync (the journal while a child is failed), or always the journal",
    },
    OptHelp {
        name: "region",
        kind: Kind::Size,
        default: "4M",
        help: "logical bytes per write-intent bitmap bit (resynced after a crash if dirty)",
    },
    OptHelp {
        name: "wb",
        kind: Kind::Size,
        default: "16M",
        help: "write-back stripe buffer: most bytes of partial-stripe writes held until their stripe is whole (0: off)",
    },
    OptHelp {
        name: "wb_bg",
        kind: Kind::Count,
        default: "4",
        help: "stripes completed in the write-back buffer written at once on other threads (0: by the request that completes them)",
    },
    OptHelp {
        name: "run",
        kind: Kind::Count,
        default: "16",
        help: "most consecutive whole stripes written as one update, one write per child (memory: 2 x (k+m) x chunk per stripe; 1: stripe by stripe)",
    },
    OptHelp {
        name: "pool",
        kind: Kind::Size,
        default: "16M",
        help: "most bytes of free parity buffers kept for reuse (0: a new buffer per update)",
    },
    OptHelp {
        name: "barrier",
        kind: Kind::Flag,
        default: "off",
        help: "flush the journal before writing in place (power-loss safety, slower)",
    },
    OptHelp {
        name: "rebuild",
        kind: Kind::Choice(&["auto", "off"]),
        default: "auto",
        help: "rebuild replaced children in the background while serving",
    },
    OptHelp {
        name: "crc_mem",
        kind: Kind::Size,
        default: "256M",
        help: "most memory the crc table may take (4 bytes per 4K of every child)",
    },
    OptHelp {
        name: "crc_dirty",
        kind: Kind::Size,
        default: "1M",
        help: "with the bitmap: most bytes of crc-table pages changed in memory before they are written (else at a flush)",
    },
    OptHelp {
        name: "name",
        kind: Kind::Label,
        default: "number",
        help: "instance label in /metrics",
    },
];

/// The checked options of one `ec` device.
#[derive(Debug, Clone)]
pub struct Config {
    pub children: Vec<ChildSpec>,
    pub geo: Geometry,
    pub profile: Profile,
    /// The profile as text, stored in the superblocks.
    pub profile_text: String,
    pub size: Option<u64>,
    pub gpu: bool,
    pub barrier: bool,
    /// `consistency=journal`: never the bitmap.
    pub journal_only: bool,
    pub region: u64,
    pub wb: u64,
    pub wb_bg: usize,
    /// Most stripes per run of whole stripes (run.rs).
    pub run: usize,
    /// Most bytes of free parity buffers kept (pool.rs).
    pub pool: u64,
    pub auto_rebuild: bool,
    pub crc_mem: u64,
    pub crc_dirty: u64,
    pub name: Option<String>,
    /// Column ranges are multiples of this (4K, or the codec's block).
    pub unit: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Reads and checks the options and the children list, opening nothing.
pub fn parse(s: &BackendSpec) -> Result<Config> {
    let o = &s.opts;
    let children = children::parse(&s.arg).context("backend ec: CHILDREN")?;
    let k = o.u64("k", 4)?;
    let m = o.u64("m", 2)?;
    if k < 2 {
        return Err(o.err("k", format_args!("{k}: at least 2")));
    }
    if m < 1 {
        return Err(o.err("m", format_args!("{m}: at least 1")));
    }
    if k.saturating_add(m) > 64 {
        bail!(
            "backend ec: k+m = {} children, at most 64",
            k as u128 + m as u128
        );
    }
    if children.len() as u64 != k + m {
        bail!(
            "backend ec: CHILDREN lists {} children, k+m = {} are needed",
            children.len(),
            k + m
        );
    }
    for (i, c) in children.iter().enumerate() {
        c.check()
            .with_context(|| format!("backend ec: child {i} ({})", c.show()))?;
    }
    let plugin = o.choice("plugin", &["isa", "jerasure"], "isa")?;
    let technique = o.get("technique").unwrap_or("reed_sol_van");
    let mut text = format!("plugin={plugin} technique={technique} k={k} m={m}");
    if technique.starts_with("cauchy_") {
        text.push_str(&format!(" packetsize={}", o.u64("packetsize", 2048)?));
    }
    let profile = Profile::parse(&text).map_err(|e| anyhow::anyhow!("backend ec: {e}"))?;
    let chunk = o.size("chunk", 64 << 10)?;
    let mut unit = BLOCK;
    if profile.technique.is_bitmatrix() {
        let b = 8 * profile.packetsize as u64;
        unit = unit / gcd(unit, b) * b;
    }
    if chunk == 0 || chunk % unit != 0 || chunk > MAX_CHUNK {
        return Err(o.err(
            "chunk",
            format_args!("{chunk}: a multiple of {unit} up to {MAX_CHUNK} is needed"),
        ));
    }
    profile
        .check_stripe_unit(chunk as usize)
        .map_err(|e| o.err("chunk", e))?;
    let slots = o.u64("slots", 64)?;
    if !(1..=4096).contains(&slots) {
        return Err(o.err("slots", format_args!("{slots}: 1 to 4096")));
    }
    let size = match o.get("size") {
        None => None,
        Some(_) => match o.size("size", 0)? {
            0 => return Err(o.err("size", "0: a device needs at least one byte")),
            n => Some(n),
        },
    };
    Ok(Config {
        children,
        geo: Geometry {
            k: k as usize,
            m: m as usize,
            chunk,
            slots,
            stripes: 0,
        },
        profile,
        profile_text: text,
        size,
        gpu: o.choice("device", &["cpu", "gpu"], "cpu")? == "gpu",
        barrier: o.flag("barrier")?,
        journal_only: o.choice("consistency", &["bitmap", "journal"], "bitmap")? == "journal",
        region: match o.size("region", 4 << 20)? {
            0 => return Err(o.err("region", "0: at least one byte (one stripe)")),
            n => n,
        },
        wb: o.size("wb", 16 << 20)?,
        wb_bg: match o.u64("wb_bg", 4)? {
            n @ 0..=64 => n as usize,
            n => return Err(o.err("wb_bg", format_args!("{n}: 0 to 64"))),
        },
        run: match o.u64("run", 16)? {
            n @ 1..=64 => n as usize,
            n => return Err(o.err("run", format_args!("{n}: 1 to 64"))),
        },
        pool: o.size("pool", 16 << 20)?,
        auto_rebuild: o.choice("rebuild", &["auto", "off"], "auto")? == "auto",
        crc_mem: o.size("crc_mem", 256 << 20)?,
        crc_dirty: o.size("crc_dirty", 1 << 20)?,
        name: o.label("name")?,
        unit,
    })
}

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let cfg = parse(s)?;
    let auto = cfg.auto_rebuild;
    let inner = open::start(cfg)?;
    Ok(Arc::new(EcDev {
        inner,
        rebuild_started: AtomicBool::new(!auto),
        idle_started: AtomicBool::new(false),
    }))
}

/// Opens an `ec:` spec without starting a background rebuild (for
/// `iolift ec rebuild`): the device's state, to rebuild and check.
pub fn open_offline(spec: &str) -> Result<Arc<Inner>> {
    let s = BackendSpec::parse(spec)?;
    if s.kind != "ec" {
        bail!("{spec:?} is not an ec: backend spec");
    }
    s.opts.check(OPTIONS)?;
    open::start(parse(&s)?)
}

/// A child's state.
pub const HEALTHY: u8 = 0;
/// Lost, failing or replaced: not read, not written, needs a rebuild.
pub const FAILED: u8 = 1;
/// Being rebuilt: written by new writes, not read yet.
pub const REBUILDING: u8 = 2;

/// One child device.
pub struct Child {
    /// `None` when it could not be opened.
    pub dev: Option<DevRef>,
    pub state: AtomicU8,
    /// The spec, for messages.
    pub label: String,
    /// Takes a run of whole stripes as one gathered write (false for
    /// `memory:` children, whose requests cost little: one write per
    /// chunk from the requests' own buffers, no copy).
    pub gather: bool,
    /// A `memory:` child and chunks of exactly one of its pages: whole
    /// chunks of runs are written as buffers of their own, which it keeps
    /// as its pages (no copy in the child), and its old pages are taken
    /// back into the parity pool (run.rs).
    pub adopt: bool,
    /// A `file:` child opened with `inline_writes`: its writes run on the
    /// thread that gives them (io.rs, `Inner::child_writes`).
    pub on_caller: bool,
}

/// The shared state of one `ec` device.
pub struct Inner {
    pub geo: Geometry,
    pub size: u64,
    pub unit: u64,
    pub codec: Arc<Codec>,
    pub children: Vec<Child>,
    /// Stored crcs per child: `stripes x blocks_per_chunk`.
    pub crcs: Vec<Vec<AtomicU32>>,
    /// Stripe s is guarded by lock `s % slots` (readers shared, writers
    /// exclusive); writer j also owns journal slot j.
    pub locks: Vec<tokio::sync::RwLock<()>>,
    pub seq: AtomicU64,
    /// The superblock as last written (epoch, failed set), its writer lock.
    pub sb: tokio::sync::Mutex<layout::Super>,
    pub metrics: Arc<metrics::EcMetrics>,
    pub gpu: Option<gpu::Gpu>,
    pub barrier: bool,
    pub stop: AtomicBool,
    /// `consistency=journal`.
    pub journal_only: bool,
    /// The bitmap may be used: set once its floor is on disk with no child
    /// failed, cleared when a child fails.
    pub bitmap_ok: AtomicBool,
    pub intent: bitmap::Intent,
    pub wb: wb::Wb,
    /// crc-table pages set in memory, not yet on the children (bitmap mode).
    pub meta_dirty: meta::Dirty,
    /// Most stripes per run of whole stripes (`run`).
    pub run_max: usize,
    /// Parity buffers for reuse (`pool`).
    pub pool: Arc<pool::Pool>,
}

impl Inner {
    pub fn n(&self) -> usize {
        self.geo.n()
    }
    pub fn state(&self, c: usize) -> u8 {
        self.children[c].state.load(Ordering::Acquire)
    }
    /// Children that can be read.
    pub fn readable(&self, c: usize) -> bool {
        self.children[c].dev.is_some() && self.state(c) == HEALTHY
    }
    /// Children that take writes (healthy or being rebuilt).
    pub fn writable(&self, c: usize) -> bool {
        self.children[c].dev.is_some() && self.state(c) != FAILED
    }
    /// Children that are failed or being rebuilt.
    pub fn degraded(&self) -> usize {
        (0..self.n()).filter(|&c| !self.readable(c)).count()
    }
    pub fn crc(&self, c: usize, s: u64, blk: u64) -> u32 {
        self.crcs[c][(s * self.geo.blocks_per_chunk() + blk) as usize].load(Ordering::Relaxed)
    }
    /// Whether stripe updates go through the journal now.
    pub fn use_journal(&self) -> bool {
        self.journal_only || !self.bitmap_ok.load(Ordering::Acquire) || self.degraded() > 0
    }
    pub fn set_crcs(&self, c: usize, s: u64, lo: u64, crcs: &[u32]) {
        let base = (s * self.geo.blocks_per_chunk() + lo / BLOCK) as usize;
        for (i, v) in crcs.iter().enumerate() {
            self.crcs[c][base + i].store(*v, Ordering::Relaxed);
        }
    }
}

/// The device: [`Inner`] plus the start of the online rebuild.
pub struct EcDev {
    pub inner: Arc<Inner>,
    rebuild_started: AtomicBool,
    idle_started: AtomicBool,
}

impl EcDev {
    /// Starts the background rebuild once, from inside the runtime.
    fn kick_rebuild(&self) {
        if self.rebuild_started.load(Ordering::Relaxed)
            || self.rebuild_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let targets = rebuild::targets(&self.inner);
        if targets.is_empty() {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            match rebuild::rebuild(&inner, &targets, &|_| {}).await {
                Ok(r) => tracing::info!("ec: online rebuild done: {r}"),
                Err(e) => tracing::warn!("ec: online rebuild stopped: {e:#}"),
            }
        });
    }
}

impl EcDev {
    /// Starts, once, the task that writes out stripes idle in the
    /// write-back buffer; it ends with the device.
    fn kick_idle(&self) {
        if !self.inner.wb.enabled()
            || self.idle_started.load(Ordering::Relaxed)
            || self.idle_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(wb::IDLE).await;
                let Some(d) = weak.upgrade() else { return };
                if d.stop.load(Ordering::Acquire) {
                    return;
                }
                let idle = d.wb.idle(wb::IDLE);
                if let Err(e) = d.drain(idle).await {
                    tracing::warn!("ec: writing out idle buffered stripes: {e:?}");
                }
            }
        });
    }
}

impl BlockDev for EcDev {
    fn info(&self) -> DevInfo {
        DevInfo {
            can_trim: false,
            can_fast_zero: false,
            can_cache: false,
            ..DevInfo::full(self.inner.size)
        }
    }

    fn submit(&self, req: Request) -> IoFuture {
        if let Err(e) = req.check_range(self.inner.size) {
            return ready(Err(e));
        }
        self.kick_rebuild();
        if matches!(req, Request::Write { .. }) {
            self.kick_idle();
        }
        let inner = self.inner.clone();
        match req {
            Request::Read { offset, len } => {
                Box::pin(async move { inner.read(offset, len).await.map(Reply::Data) })
            }
            Request::Write {
                offset,
                data,
                flags,
            } => Box::pin(async move {
                let n = data.len() as u64;
                inner.write(offset, data, flags.fua).await?;
                Ok(Reply::Done(n))
            }),
            Request::WriteZeroes { offset, len, flags } => Box::pin(async move {
                inner.write_zeroes(offset, len as u64, flags.fua).await?;
                Ok(Reply::Done(0))
            }),
            Request::Flush => Box::pin(async move {
                inner.flush().await?;
                Ok(Reply::Done(0))
            }),
            Request::Trim { .. } => ready(Err(Errno::ENOTSUP)),
            Request::Cache { .. } => ready(Ok(Reply::Done(0))),
            Request::BlockStatus { len, .. } => ready(Ok(Reply::Extents(vec![Extent {
                len: len as u64,
                hole: false,
                zero: false,
            }]))),
        }
    }

    fn name(&self) -> String {
        let g = &self.inner.geo;
        format!("ec(k={},m={},chunk={})", g.k, g.m, g.chunk)
    }

    fn close(&self) -> IoFuture {
        self.inner.stop.store(true, Ordering::Release);
        self.submit(Request::Flush)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bitmap;
#[cfg(test)]
mod tests_run;
