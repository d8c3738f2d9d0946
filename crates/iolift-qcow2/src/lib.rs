//! qcow2 images (versions 2 and 3) for iolift, built around a split
//! between a control plane and data paths:
//!
//! - [`ControlPlane`] alone changes metadata: cluster allocation with
//!   refcounts, copy-on-write from backing files and compressed clusters,
//!   discard, zero clusters, flush. It translates guest clusters for the
//!   data paths, remembers which cache holds which mapping, and
//!   invalidates every cached copy (waiting for the I/O in flight on it)
//!   before it changes a mapping.
//! - [`DataPath`] serves reads and in-place writes through its own
//!   bounded [`MappingCache`] (LRU, entry budget, counters), directly to
//!   the image file on a hit.
//!
//! The control plane also works while the image is served: snapshot
//! create, delete and revert, discard, cache resize, and compaction
//! (`compact.rs`), each invalidating cached mappings before it changes
//! them.
//!
//! All I/O is synchronous positioned I/O on the image file; callers run it
//! on threads of their own. `docs/qcow2.md` describes the format coverage
//! and the crash rules.

mod alloc;
mod backing;
mod cache;
mod compact;
mod control;
mod datapath;
mod error;
mod header;
mod hit;
mod io;
mod mapping;
mod open;
mod refcount;
mod snapshot;
mod snaptable;
mod update;

pub use cache::{CacheStats, MappingCache, Pinned};
pub use compact::CompactStats;
pub use control::{ControlPlane, CpStats, Options};
pub use datapath::{DataPath, Served};
pub use error::{Error, Result};
pub use header::Header;
pub use hit::{HitIo, HIT_ALIGN};
pub use mapping::Mapping;
pub use open::{MAX_BACKING_DEPTH, MAX_DATA_PATHS};
pub use snaptable::Snapshot;

/// Splits `[off, off + len)` into pieces of one cluster each: (guest
/// cluster, offset in the cluster, range in the caller's buffer).
pub(crate) fn pieces(
    off: u64,
    len: usize,
    cluster_bits: u32,
) -> impl Iterator<Item = (u64, u64, std::ops::Range<usize>)> {
    let cs = 1u64 << cluster_bits;
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let pos = off + done as u64;
        let at = pos & (cs - 1);
        let n = ((cs - at) as usize).min(len - done);
        let r = done..done + n;
        done += n;
        Some((pos >> cluster_bits, at, r))
    })
}
