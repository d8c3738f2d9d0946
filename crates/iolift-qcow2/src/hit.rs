//! Hits served by the caller's own I/O engine: [`DataPath::try_hit`]
//! finds, in this path's cache alone, where a request lives in the image
//! file and returns it pinned ([`HitIo`]), so the caller can read or
//! write the host range with asynchronous I/O (io_uring) and release the
//! pin when that I/O completes, on whatever thread completes it. The
//! control plane's invalidation waits for the pin as it waits for the
//! synchronous path's: an in-flight read or write on a mapping being
//! changed completes before the change.

use crate::cache::Entry;
use crate::control::ControlPlane;
use crate::datapath::DataPath;
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
        let c = off >> bits;
        let pin = cp.caches()[id].peek_pinned(c)?;
        let host = match pin.mapping() {
            Mapping::Data { host, writable } if writable || !write => {
                host + (off & ((1 << bits) - 1))
            }
            _ => {
                // Counted as a hit by the lookup; the slow path will count
                // its own lookup too. Take the hit back.
                cp.caches()[id]
                    .stats
                    .hits
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                return None;
            }
        };
        Some(HitIo {
            host,
            cp: cp.clone(),
            id,
            entry: pin.detach(),
        })
    }
}
