//! The control plane: the only code that changes an image's metadata
//! (L1 and L2 entries, refcounts, the header). It translates guest
//! clusters for the data paths, remembers which data path's cache holds
//! which mapping, and before it changes a mapping it invalidates every
//! cached copy and waits for the I/O in flight on it
//! ([`ControlPlane::set_l2`]). All of this happens under one lock,
//! [`ControlPlane::meta`]; a data path takes it only on a miss.
//!
//! Opening is in `open.rs`, the changes (writes that allocate, discard,
//! write-zeroes, flush, close) in `update.rs`.

use crate::alloc::Alloc;
use crate::backing::Backing;
use crate::cache::{MappingCache, Pinned};
use crate::error::{io_ctx, Error, Result};
use crate::header::Header;
use crate::io::{read_exact, read_zero_fill, write_all};
use crate::mapping::{decode, Mapping, OFFSET_MASK};
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// How an image is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub read_only: bool,
    /// Entries of each data path's mapping cache; 0: no cache, every
    /// request is served by the control plane under its lock.
    pub cache_entries: u64,
    /// Data paths (each with its own cache), at most 64.
    pub data_paths: usize,
    /// Data I/O of the data paths (reads, in-place writes) with O_DIRECT,
    /// past the page cache, where offset and length are 4 KiB aligned.
    pub direct: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            read_only: false,
            cache_entries: 65536,
            data_paths: 4,
            direct: false,
        }
    }
}

/// Counters of the control plane (the caches keep their own).
#[derive(Default)]
pub struct CpStats {
    /// Translations answered to a data path (its cache missed).
    pub translations: AtomicU64,
    /// Requests served entirely under the lock (no cache, or a write
    /// that needed allocation or copy-on-write).
    pub locked_requests: AtomicU64,
    /// Data clusters allocated.
    pub allocations: AtomicU64,
    /// Mapping changes that had to invalidate at least one cache.
    pub invalidating_changes: AtomicU64,
    /// Clusters (data and L2 tables) moved by compaction.
    pub moved: AtomicU64,
}

/// Metadata state, under the control plane's lock.
pub(crate) struct Meta {
    /// Raw L1 entries (offset | COPIED), checked at open.
    pub l1: Vec<u64>,
    /// Refcounts and allocation; `None` when read-only.
    pub alloc: Option<Alloc>,
    /// Guest cluster -> bitmask of the data paths whose cache holds it.
    pub held: HashMap<u64, u64>,
    pub file_len: u64,
    pub closed: bool,
    /// Internal snapshots, and where their table is (offset, clusters).
    pub snapshots: Vec<crate::snaptable::Snapshot>,
    pub snap_offset: u64,
    pub snap_clusters: u64,
}

impl Meta {
    /// The allocator (writable opens only; callers checked).
    pub fn alloc_mut(&mut self) -> &mut Alloc {
        self.alloc.as_mut().expect("writable")
    }
}

pub struct ControlPlane {
    pub(crate) file: File,
    pub(crate) hdr: Header,
    pub(crate) meta: Mutex<Meta>,
    pub(crate) backing: Option<Backing>,
    /// The image file opened again with O_DIRECT (option `direct`).
    pub(crate) direct: Option<File>,
    pub(crate) caches: Vec<MappingCache>,
    pub(crate) read_only: bool,
    pub stats: CpStats,
}

impl ControlPlane {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn size(&self) -> u64 {
        self.hdr.size
    }

    pub fn header(&self) -> &Header {
        &self.hdr
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    pub fn cluster_bits(&self) -> u32 {
        self.hdr.cluster_bits
    }

    pub fn cluster_size(&self) -> u64 {
        1 << self.hdr.cluster_bits
    }

    /// The data paths' caches (empty when opened with no cache).
    pub fn caches(&self) -> &[MappingCache] {
        &self.caches
    }

    /// Where guest cluster `c`'s L2 entry lives (0: no L2 table).
    pub(crate) fn l2_slot(&self, m: &Meta, c: u64) -> u64 {
        let l2_bits = self.hdr.l2_bits();
        let l2 = m.l1[(c >> l2_bits) as usize] & OFFSET_MASK;
        if l2 == 0 {
            return 0;
        }
        l2 + (c & ((1 << l2_bits) - 1)) * 8
    }

    /// The raw L2 entry of guest cluster `c` (0 where no L2 table).
    pub(crate) fn l2_entry(&self, m: &Meta, c: u64) -> Result<u64> {
        let slot = self.l2_slot(m, c);
        if slot == 0 {
            return Ok(0);
        }
        let mut b = [0u8; 8];
        read_exact(&self.file, slot, &mut b)
            .map_err(io_ctx(format!("reading the L2 entry of guest cluster {c}")))?;
        Ok(u64::from_be_bytes(b))
    }

    /// Guest cluster `c`'s mapping, read from the image and checked.
    pub(crate) fn lookup(&self, m: &Meta, c: u64) -> Result<Mapping> {
        let e = self.l2_entry(m, c)?;
        decode(c, e, self.hdr.version, self.hdr.cluster_bits, m.file_len)
    }

    /// A data path's miss: translates `c`, puts the mapping in cache `id`
    /// already pinned, and records that `id` holds it.
    pub fn translate(&self, id: usize, c: u64) -> Result<Pinned<'_>> {
        let mut m = self.lock();
        let map = self.lookup(&m, c)?;
        let (pin, evicted) = self.caches[id].insert_pinned(c, map);
        *m.held.entry(c).or_insert(0) |= 1 << id;
        for k in evicted {
            self.forget(&mut m, k, id);
        }
        self.stats.translations.fetch_add(1, Relaxed);
        Ok(pin)
    }

    fn forget(&self, m: &mut Meta, k: u64, id: usize) {
        if let Some(mask) = m.held.get_mut(&k) {
            *mask &= !(1 << id);
            if *mask == 0 {
                m.held.remove(&k);
            }
        }
    }

    /// Removes every cached copy of `c`'s mapping, waiting for the I/O in
    /// flight on each; afterwards no data path can use the old mapping.
    pub(crate) fn invalidate(&self, m: &mut Meta, c: u64) {
        let Some(mask) = m.held.remove(&c) else {
            return;
        };
        for (id, cache) in self.caches.iter().enumerate() {
            if mask & (1 << id) != 0 {
                cache.invalidate(c);
            }
        }
        self.stats.invalidating_changes.fetch_add(1, Relaxed);
    }

    /// Changes `c`'s L2 entry: invalidation first, then the write.
    pub(crate) fn set_l2(&self, m: &mut Meta, c: u64, e: u64) -> Result<()> {
        let slot = self.l2_slot(m, c);
        if slot == 0 {
            return Err(Error::Invalid(format!(
                "internal: guest cluster {c} has no L2 table"
            )));
        }
        self.invalidate(m, c);
        write_all(&self.file, slot, &e.to_be_bytes())
            .map_err(io_ctx(format!("writing the L2 entry of guest cluster {c}")))
    }

    /// Writes in place through a writable mapping (a data path's hit).
    pub(crate) fn write_mapped(&self, host: u64, data: &[u8]) -> std::io::Result<()> {
        match &self.direct {
            Some(f) if crate::io::direct_ok(host, data.len()) => {
                crate::io::write_direct(f, host, data)
            }
            _ => write_all(&self.file, host, data),
        }
    }

    /// Changes cache `id`'s budget (online resize).
    pub fn resize_cache(&self, id: usize, entries: u64) {
        let mut m = self.lock();
        for k in self.caches[id].resize(entries) {
            self.forget(&mut m, k, id);
        }
    }

    /// Reads through `map` (the data path's I/O on a hit or after a
    /// translation): `buf` at byte `at` of guest cluster `c`.
    pub fn read_mapped(&self, map: Mapping, c: u64, at: u64, buf: &mut [u8]) -> Result<()> {
        match map {
            Mapping::Zero { .. } => buf.fill(0),
            Mapping::Unallocated => match &self.backing {
                Some(b) => b.read((c << self.hdr.cluster_bits) + at, buf)?,
                None => buf.fill(0),
            },
            Mapping::Data { host, .. } => match &self.direct {
                Some(f) if crate::io::direct_ok(host + at, buf.len()) => {
                    crate::io::read_direct(f, host + at, buf)
                }
                _ => read_zero_fill(&self.file, host + at, buf),
            }
            .map_err(io_ctx(format!("reading guest cluster {c} at {host:#x}")))?,
            Mapping::Compressed { host, len } => {
                let data = self.inflate(c, host, len)?;
                buf.copy_from_slice(&data[at as usize..at as usize + buf.len()]);
            }
        }
        Ok(())
    }

    /// Decompresses a compressed cluster (raw deflate) to a whole cluster.
    fn inflate(&self, c: u64, host: u64, len: u32) -> Result<Vec<u8>> {
        let mut raw = vec![0u8; len as usize];
        read_zero_fill(&self.file, host, &mut raw)
            .map_err(io_ctx(format!("reading compressed guest cluster {c}")))?;
        let mut out = vec![0u8; self.cluster_size() as usize];
        let mut d = flate2::Decompress::new(false);
        let bad = |what: String| {
            Error::Corrupt(format!("compressed guest cluster {c} at {host:#x}: {what}"))
        };
        d.decompress(&raw, &mut out, flate2::FlushDecompress::Finish)
            .map_err(|e| bad(format!("bad deflate data ({e})")))?;
        if d.total_out() != out.len() as u64 {
            return Err(bad(format!(
                "decompresses to {} bytes, not a cluster ({})",
                d.total_out(),
                out.len()
            )));
        }
        Ok(out)
    }

    /// Reads under the lock, with no cache (the no-cache data path and
    /// backing files).
    pub fn read_locked(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let m = self.lock();
        self.stats.locked_requests.fetch_add(1, Relaxed);
        for (c, at, r) in crate::pieces(off, buf.len(), self.hdr.cluster_bits) {
            let map = self.lookup(&m, c)?;
            self.read_mapped(map, c, at, &mut buf[r])?;
        }
        Ok(())
    }

    /// Allocation status of `[off, off + len)`: runs of (bytes, mapping
    /// kind) where the kind is 0 data, 1 zero, 2 unallocated.
    pub fn block_status(&self, off: u64, len: u64) -> Result<Vec<(u64, u8)>> {
        let m = self.lock();
        let mut out: Vec<(u64, u8)> = Vec::new();
        for (c, _, r) in crate::pieces(off, len as usize, self.hdr.cluster_bits) {
            let kind = match self.lookup(&m, c)? {
                Mapping::Data { .. } | Mapping::Compressed { .. } => 0,
                Mapping::Zero { .. } => 1,
                Mapping::Unallocated if self.backing.is_some() => 0,
                Mapping::Unallocated => 2,
            };
            let n = r.len() as u64;
            match out.last_mut() {
                Some(last) if last.1 == kind => last.0 += n,
                _ => out.push((n, kind)),
            }
        }
        Ok(out)
    }
}
