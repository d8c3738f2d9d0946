//! Opening: children opened, superblocks read, then either a fresh format
//! (no child has a superblock) or assembly (the newest superblock names
//! the geometry and the failed children; children without a matching one
//! are replaced and need a rebuild), crc tables loaded, journal replayed.

use super::layout::{Found, Geometry, Super};
use super::wb::Wb;
use super::{bitmap, meta, metrics, Child, Config, Inner, FAILED, HEALTHY};
use crate::backend::memory::PAGE_BYTES;
use crate::block::{BlockDevExt, Errno, Flags, Request};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use iolift_ec::Codec;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Crc table bytes read per child request at open.
const META_PIECE: u64 = 8 << 20;
/// Bytes zeroed per request when formatting.
const ZERO_PIECE: u64 = 1 << 30;

/// Opens the device: runs [`assemble`] on a thread of its own with its own
/// runtime, so it works both inside and outside a tokio runtime.
pub fn start(cfg: Config) -> Result<Arc<Inner>> {
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("backend ec: runtime")?;
            rt.block_on(assemble(cfg))
        })
        .join()
        .unwrap_or_else(|_| bail!("backend ec: open panicked"))
    })
}

fn errno(e: Errno) -> anyhow::Error {
    anyhow::anyhow!("{e:?}")
}

async fn assemble(cfg: Config) -> Result<Arc<Inner>> {
    let n = cfg.children.len();
    let mut children = Vec::with_capacity(n);
    for (i, c) in cfg.children.iter().enumerate() {
        let dev = match c.open() {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!("ec: child {i} ({}) cannot be opened: {e:#}", c.show());
                None
            }
        };
        let state = if dev.is_some() { HEALTHY } else { FAILED };
        let memory = c.stages.is_empty() && c.backend.starts_with("memory:");
        children.push(Child {
            dev,
            state: AtomicU8::new(state),
            label: c.show(),
            gather: !memory,
            adopt: memory && cfg.geo.chunk == PAGE_BYTES,
            on_caller: c.on_caller(),
        });
    }
    let codec = Arc::new(
        Codec::new(&cfg.profile)
            .map_err(|e| anyhow::anyhow!("backend ec: {e}"))?
            .with_plan_cache(64),
    );
    let gpu = if cfg.gpu {
        Some(super::gpu::Gpu::open(
            codec.clone(),
            cfg.geo.chunk as usize,
        )?)
    } else {
        None
    };
    let mut inner = Inner {
        geo: cfg.geo,
        size: 0,
        unit: cfg.unit,
        codec,
        children,
        crcs: Vec::new(),
        locks: (0..cfg.geo.slots)
            .map(|_| tokio::sync::RwLock::new(()))
            .collect(),
        seq: AtomicU64::new(1),
        sb: tokio::sync::Mutex::new(Super {
            geo: cfg.geo,
            size: 0,
            uuid: 0,
            epoch: 0,
            index: 0,
            failed: 0,
            profile: cfg.profile_text.clone(),
        }),
        metrics: metrics::EcMetrics::new(cfg.name.clone()),
        gpu,
        barrier: cfg.barrier,
        stop: AtomicBool::new(false),
        journal_only: cfg.journal_only,
        bitmap_ok: AtomicBool::new(false),
        intent: bitmap::Intent::new(1, 1, 1),
        wb: Wb::new(cfg.wb, cfg.wb_bg),
        run_max: cfg.run,
        pool: super::pool::Pool::new(cfg.pool as usize),
        meta_dirty: meta::Dirty::new(0, 0, cfg.crc_dirty),
    };
    let mut found = Vec::with_capacity(n);
    for c in 0..n {
        found.push(inner.read_super(c).await);
    }
    let newest = found
        .iter()
        .filter_map(|f| match f {
            Some(Found::Super(s)) => Some(s.clone()),
            _ => None,
        })
        .max_by_key(|s| s.epoch);
    let fresh = newest.is_none();
    match newest {
        None => {
            if let Some((c, why)) = found.iter().enumerate().find_map(|(c, f)| match f {
                Some(Found::Damaged(why)) => Some((c, why)),
                _ => None,
            }) {
                bail!(
                    "backend ec: child {c} ({}): {why}; no child has an intact superblock, and formatting over it would lose its data",
                    inner.children[c].label
                );
            }
            format(&mut inner, &cfg).await?
        }
        Some(sb) => join(&mut inner, &cfg, sb, &found)?,
    }
    inner.intent = bitmap::Intent::new(inner.geo.stripes, inner.geo.stripe_bytes(), cfg.region);
    let bad = inner.degraded_failed();
    if bad > cfg.geo.m {
        let lost: Vec<String> = (0..n)
            .filter(|&c| !inner.readable(c))
            .map(|c| format!("{c} ({})", inner.children[c].label))
            .collect();
        bail!(
            "backend ec: {bad} children lost or not members ({}), at most m={} may be: the data cannot be read",
            lost.join(", "),
            cfg.geo.m
        );
    }
    load_crcs(&mut inner, cfg.crc_mem).await?;
    inner.meta_dirty = meta::Dirty::new(
        n,
        inner.geo.stripes * inner.geo.blocks_per_chunk(),
        cfg.crc_dirty,
    );
    let inner = Arc::new(inner);
    // the failed set as found (a child that failed to open, a new child)
    inner.persist_super().await;
    let dirty = if fresh {
        Vec::new()
    } else {
        match inner.intent_load().await {
            Some((dirty, floor)) => {
                inner.intent.floor.store(floor, Ordering::Release);
                dirty
            }
            None => {
                tracing::warn!("ec: no intact write-intent bitmap: every stripe is resynced");
                vec![(0, inner.geo.stripes)]
            }
        }
    };
    let r = inner.replay().await;
    if r.replayed + r.dropped > 0 {
        tracing::info!(
            "ec: journal: {} updates written again, {} incomplete ones dropped",
            r.replayed,
            r.dropped
        );
    }
    resync(&inner, &dirty).await?;
    inner.intent_set_floor().await;
    if !inner.journal_only && inner.degraded() == 0 {
        inner.bitmap_ok.store(true, Ordering::Release);
    }
    inner.metrics.attach(&inner);
    Ok(inner)
}

/// Resyncs the stripes of the dirty bitmap regions, then flushes the
/// children (the bitmap is cleared after this).
async fn resync(inner: &Inner, dirty: &[(u64, u64)]) -> Result<()> {
    if dirty.is_empty() {
        return Ok(());
    }
    let n: u64 = dirty.iter().map(|(a, b)| b - a).sum();
    let (mut fixed, mut lost) = (0, 0);
    for &(a, b) in dirty {
        let (f, l) = inner.resync(a, b).await;
        fixed += f;
        lost += l;
    }
    for c in 0..inner.n() {
        if inner.writable(c) {
            let _ = inner.child_flush(c).await;
        }
    }
    inner.metrics.resynced.fetch_add(fixed, Ordering::Relaxed);
    tracing::info!(
        "ec: write-intent bitmap: {n} stripes of dirty regions resynced, {fixed} of them had parity or crcs rewritten, {lost} could not be checked"
    );
    if lost > 0 {
        tracing::error!(
            "ec: {lost} stripes written at the unclean stop have a data chunk on a lost child: their parity could not be checked and a decode of that chunk may be wrong"
        );
    }
    Ok(())
}

/// Stripes and logical size from the options and the smallest child.
fn geometry(inner: &Inner, cfg: &Config) -> Result<(Geometry, u64)> {
    let smallest = inner
        .children
        .iter()
        .filter_map(|c| c.dev.as_ref().map(|d| d.info().size))
        .min()
        .unwrap_or(0);
    let fit = cfg.geo.fit(smallest);
    let mut geo = cfg.geo;
    let size = match cfg.size {
        Some(size) => {
            geo.stripes = size.div_ceil(geo.stripe_bytes());
            if geo.stripes > fit {
                bail!(
                    "backend ec: size={size} needs children of {} bytes, the smallest has {smallest}",
                    geo.child_size()
                );
            }
            size
        }
        None => {
            geo.stripes = fit;
            fit * geo.stripe_bytes()
        }
    };
    if geo.stripes == 0 {
        bail!(
            "backend ec: children of {smallest} bytes hold no stripe (journal and one chunk need {})",
            Geometry { stripes: 1, ..geo }.child_size()
        );
    }
    Ok((geo, size))
}

/// A fresh device: every child zeroed and given a superblock.
async fn format(inner: &mut Inner, cfg: &Config) -> Result<()> {
    if let Some(c) = (0..inner.n()).find(|&c| inner.children[c].dev.is_none()) {
        bail!(
            "backend ec: child {c} ({}) cannot be opened, and a new device needs all children",
            inner.children[c].label
        );
    }
    let (geo, size) = geometry(inner, cfg)?;
    inner.geo = geo;
    inner.size = size;
    let uuid = {
        let mut b = [0u8; 8];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
            .context("backend ec: /dev/urandom")?;
        u64::from_le_bytes(b) | 1
    };
    *inner.sb.get_mut() = Super {
        geo,
        size,
        uuid,
        epoch: 0,
        index: 0,
        failed: 0,
        profile: cfg.profile_text.clone(),
    };
    for (c, ch) in inner.children.iter().enumerate() {
        let dev = ch.dev.as_ref().expect("opened");
        let mut at = 0;
        while at < geo.child_size() {
            let len = (geo.child_size() - at).min(ZERO_PIECE);
            let r = dev
                .submit(Request::WriteZeroes {
                    offset: at,
                    len: len as u32,
                    flags: Flags::NONE,
                })
                .await;
            if r.is_err() {
                // a device without write-zeroes: zeroes written
                dev.write(
                    at,
                    Bytes::from(vec![0u8; len.min(8 << 20) as usize]),
                    Flags::NONE,
                )
                .await
                .map_err(errno)
                .with_context(|| format!("backend ec: child {c}: zeroing"))?;
                at += len.min(8 << 20);
                continue;
            }
            at += len;
        }
    }
    tracing::info!(
        "ec: formatted {} children: k={} m={} chunk={} stripes={} size={size}",
        inner.n(),
        geo.k,
        geo.m,
        geo.chunk,
        geo.stripes
    );
    Ok(())
}

/// An existing device: members are the children whose superblock has the
/// newest one's uuid and their own index and is not marked failed.
fn join(inner: &mut Inner, cfg: &Config, sb: Super, found: &[Option<Found>]) -> Result<()> {
    sb.matches(&cfg.geo, &cfg.profile_text)
        .context("backend ec: the children's superblock does not match the options")?;
    if let Some(size) = cfg.size {
        if size != sb.size {
            bail!(
                "backend ec: option size={size}, but the device was formatted with {}",
                sb.size
            );
        }
    }
    for (c, f) in found.iter().enumerate() {
        let member = match f {
            Some(Found::Super(s)) => {
                s.uuid == sb.uuid && s.index as usize == c && sb.failed & (1 << c) == 0
            }
            _ => false,
        };
        if let Some(Found::Damaged(why)) = f {
            tracing::warn!("ec: child {c}: {why}");
        }
        if !member && inner.children[c].dev.is_some() {
            tracing::warn!(
                "ec: child {c} ({}) is not an up-to-date member: it needs a rebuild",
                inner.children[c].label
            );
        }
        if !member {
            inner.children[c].state.store(FAILED, Ordering::Release);
        }
    }
    inner.geo = sb.geo;
    inner.size = sb.size;
    let need = sb.geo.child_size();
    for (c, ch) in inner.children.iter().enumerate() {
        if let Some(d) = &ch.dev {
            if d.info().size < need {
                bail!(
                    "backend ec: child {c} ({}) has {} bytes, the device needs {need}",
                    ch.label,
                    d.info().size
                );
            }
        }
    }
    *inner.sb.get_mut() = sb;
    Ok(())
}

/// Reads every readable child's crc table.
async fn load_crcs(inner: &mut Inner, budget: u64) -> Result<()> {
    let geo = inner.geo;
    let per = geo.stripes * geo.blocks_per_chunk();
    let total = per * 4 * inner.n() as u64;
    if total > budget {
        bail!(
            "backend ec: the crc table needs {total} bytes, more than crc_mem={budget}: 4 bytes per 4 KiB of each child; raise crc_mem or give a smaller size="
        );
    }
    let mut tables = Vec::with_capacity(inner.n());
    for c in 0..inner.n() {
        let t: Vec<AtomicU32> = (0..per).map(|_| AtomicU32::new(0)).collect();
        if inner.readable(c) {
            let mut at = 0u64;
            while at < per * 4 {
                let len = (per * 4 - at).min(META_PIECE);
                match inner.child_read(c, geo.meta_base() + at, len).await {
                    Ok(b) => {
                        for (i, w) in b.chunks_exact(4).enumerate() {
                            let v = u32::from_le_bytes(w.try_into().expect("4 bytes"));
                            t[(at / 4) as usize + i].store(v, Ordering::Relaxed);
                        }
                    }
                    Err(_) => break,
                }
                at += len;
            }
        }
        tables.push(t);
    }
    inner.crcs = tables;
    Ok(())
}
