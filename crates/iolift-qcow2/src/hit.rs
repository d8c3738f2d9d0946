//! Hits served by the caller's own I/O engine: [`DataPath::try_hit`]
//! finds, in this path's cache alone, where a request lives in the image
//! file and returns it pinned ([`HitIo`]), so the caller can read or
//! write the host range with asynchronous I/O (io_uring) and release the
//! pin when that I/O completes, on whatever thread completes it. The
//! control plane's invalidation waits for the pin as it waits for the
//! synchronous path's: an in-flight read or write on a mapping being
//! changed completes before the change.

use crate::cache::{Entry, Pinned};
use crate::control::ControlPlane;
use crate::datapath::{DataPath, Served};
use crate::error::Result;
use crate::mapping::Mapping;
use std::sync::Arc;

/// Host I/O alignment the fast path needs (O_DIRECT on 4 KiB sectors).
pub const HIT_ALIGN: u64 = 4096;

/// One request's host range, its mapping pinned until this is dropped.
pub struct HitIo {
    /// Where the request's first byte lives in the image file.
    pub host: u64,
    cp: Arc<ControlPlane>,
    id: usize,
    entry: Arc<Entry>,
}

impl Drop for HitIo {
    fn drop(&mut self) {
        self.cp.caches()[self.id].unpin(&self.entry);
    }
}

impl DataPath {
    /// A read, or with `write` an in-place write, of `len` bytes at `off`
    /// that this path's cache alone can place: the range lies in one guest
    /// cluster, the cache holds that cluster's mapping, the mapping is
    /// data (written in place only when the control plane said so), and
    /// host offset and length are [`HIT_ALIGN`]-aligned (O_DIRECT). `None`
    /// otherwise, with nothing pinned and no miss counted: serve the
    /// request with [`DataPath::read_served`] / [`DataPath::write_served`].
    /// A `Some` counts as a cache hit.
    pub fn try_hit(&self, off: u64, len: usize, write: bool) -> Option<HitIo> {
        let (id, c) = self.placeable(off, len, write)?;
        let cp = self.control();
        let pin = cp.caches()[id].peek_pinned(c)?;
        let Some(host) = host_of(pin.mapping(), off, cp.cluster_bits(), write) else {
            // Counted as a hit by the lookup; the slow path will count
            // its own lookup too. Take the hit back.
            cp.caches()[id]
                .stats
                .hits
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        };
        Some(self.hit_io(host, id, pin))
    }

    /// [`DataPath::try_hit`] that, where the cache does not hold the
    /// cluster, asks the control plane for its mapping (a miss: one
    /// translation, under the control plane's lock, which puts the mapping
    /// in this path's cache pinned) instead of giving up, so that a miss
    /// does its I/O the way a hit does. `Ok(None)` when the request is not
    /// one a hit could serve (the range, alignment or mapping; the
    /// mapping is then cached and the synchronous path finds it there,
    /// counted as a hit). Call it after `try_hit` returned `None`; the
    /// lookup here counts the miss. Says whether the mapping came from
    /// the cache after all (another thread of the path translated it
    /// meanwhile) or from the control plane.
    pub fn translate_hit(
        &self,
        off: u64,
        len: usize,
        write: bool,
    ) -> Result<Option<(HitIo, Served)>> {
        let Some((id, c)) = self.placeable(off, len, write) else {
            return Ok(None);
        };
        let cp = self.control();
        let (pin, how) = match cp.caches()[id].get_pinned(c) {
            Some(p) => (p, Served::Hit),
            None => (cp.translate(id, c)?, Served::Miss),
        };
        let host = host_of(pin.mapping(), off, cp.cluster_bits(), write);
        Ok(host.map(|h| (self.hit_io(h, id, pin), how)))
    }

    /// The cache and guest cluster of a request a hit could serve: the
    /// range lies in one guest cluster and is [`HIT_ALIGN`]-aligned, and
    /// a write has a writable image. `None` otherwise.
    fn placeable(&self, off: u64, len: usize, write: bool) -> Option<(usize, u64)> {
        let id = self.cache_id()?;
        let cp = self.control();
        if len == 0 || (write && cp.read_only()) {
            return None;
        }
        let end = off.checked_add(len as u64)?;
        let bits = cp.cluster_bits();
        if end > cp.size() || off >> bits != (end - 1) >> bits {
            return None;
        }
        if !off.is_multiple_of(HIT_ALIGN) || !(len as u64).is_multiple_of(HIT_ALIGN) {
            return None;
        }
        Some((id, off >> bits))
    }

    fn hit_io(&self, host: u64, id: usize, pin: Pinned<'_>) -> HitIo {
        HitIo {
            host,
            cp: self.control().clone(),
            id,
            entry: pin.detach(),
        }
    }
}

/// Where byte `off` of the guest lives under `map`, if a hit may do its
/// I/O there: data, and for a write one the control plane said may be
/// written in place.
fn host_of(map: Mapping, off: u64, bits: u32, write: bool) -> Option<u64> {
    match map {
        Mapping::Data { host, writable } if writable || !write => {
            Some(host + (off & ((1 << bits) - 1)))
        }
        _ => None,
    }
}
