//! The control plane's changes: writes that need a new cluster
//! (allocation, copy-on-write from a backing file, a compressed cluster
//! or a zero cluster), discard, write-zeroes, flush and close.
//!
//! Order of one allocating write (see `alloc.rs` for the refcount side):
//! the new cluster's refcount is durable before it is handed out; the
//! whole cluster (old content with the new bytes over it) is written; the
//! data paths' cached copies of the old mapping are invalidated (waiting
//! for their I/O in flight); then the L2 entry is written. The clusters
//! the old entry used are freed only after the next fdatasync. A crash at
//! any point leaves either the old mapping or the new one, plus at most
//! leaked clusters.

use crate::control::{ControlPlane, Meta};
use crate::error::{io_ctx, Error, Result};
use crate::io::{sync, write_all};
use crate::mapping::{compressed_clusters, Mapping, COPIED, OFFSET_MASK, ZERO};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::MutexGuard;

impl ControlPlane {
    pub(crate) fn writable_meta(&self) -> Result<MutexGuard<'_, crate::control::Meta>> {
        if self.read_only {
            return Err(Error::ReadOnly("opened read-only".into()));
        }
        let m = self.lock();
        if m.closed {
            return Err(Error::Invalid("the image is closed".into()));
        }
        Ok(m)
    }

    /// Makes sure guest cluster `c` has an L2 table: a new one is zeroed
    /// and durable before the L1 entry points to it.
    fn ensure_l2(&self, m: &mut Meta, c: u64) -> Result<()> {
        let i = (c >> self.hdr.l2_bits()) as usize;
        let e = m.l1[i];
        let old = e & OFFSET_MASK;
        if old != 0 && e & COPIED != 0 {
            return Ok(());
        }
        // A new table: zeroes; a shared one (a snapshot's too): a copy.
        // Its data clusters keep their refcounts (they count L1 tables,
        // and the same two L1 tables still reach them).
        let mut table = vec![0u8; self.cluster_size() as usize];
        if old != 0 {
            crate::io::read_exact(&self.file, old, &mut table)
                .map_err(io_ctx(format!("reading shared L2 table {i}")))?;
        }
        let k = self.alloc_cluster(m)?;
        let off = k << self.hdr.cluster_bits;
        write_all(&self.file, off, &table).map_err(io_ctx(format!("writing new L2 table {i}")))?;
        sync(&self.file).map_err(io_ctx("fdatasync after a new L2 table"))?;
        if old != 0 {
            // Cached mappings of this table's clusters stay right (same
            // entries), and the old table is freed after the next sync.
            m.alloc_mut().free_later(old >> self.hdr.cluster_bits);
        }
        m.file_len = m.file_len.max(off + self.cluster_size());
        m.l1[i] = off | COPIED;
        m.alloc.as_mut().expect("writable").note_table(k);
        let at = self.hdr.l1_table_offset + i as u64 * 8;
        write_all(&self.file, at, &m.l1[i].to_be_bytes())
            .map_err(io_ctx(format!("writing L1 entry {i}")))
    }

    fn alloc_cluster(&self, m: &mut Meta) -> Result<u64> {
        m.alloc.as_mut().expect("writable").alloc(&self.file)
    }

    /// Queues the host clusters an old mapping used for freeing.
    fn free_old(&self, m: &mut Meta, old: Mapping) -> Result<()> {
        let cb = self.hdr.cluster_bits;
        let a = m.alloc.as_mut().expect("writable");
        match old {
            Mapping::Data { host, .. } | Mapping::Zero { host: Some(host) } => {
                a.free_later(host >> cb)
            }
            Mapping::Compressed { host, len } => {
                for k in compressed_clusters(host, len, cb) {
                    a.free_later(k);
                }
            }
            Mapping::Zero { host: None } | Mapping::Unallocated => {}
        }
        if a.pending() >= crate::alloc::MAX_PENDING {
            sync(&self.file).map_err(io_ctx("fdatasync before freeing clusters"))?;
            m.alloc
                .as_mut()
                .expect("writable")
                .apply_pending(&self.file)?;
        }
        Ok(())
    }

    /// Writes `data` at byte `at` of guest cluster `c` under the lock:
    /// in place where the cluster is allocated and not shared, otherwise
    /// into a new cluster.
    pub fn write_cluster(&self, c: u64, at: u64, data: &[u8]) -> Result<()> {
        let mut m = self.writable_meta()?;
        self.stats.locked_requests.fetch_add(1, Relaxed);
        self.write_cluster_locked(&mut m, c, at, data)
    }

    fn write_cluster_locked(&self, m: &mut Meta, c: u64, at: u64, data: &[u8]) -> Result<()> {
        let old = self.lookup(m, c)?;
        if let Mapping::Data {
            host,
            writable: true,
        } = old
        {
            return write_all(&self.file, host + at, data)
                .map_err(io_ctx(format!("writing guest cluster {c}")));
        }
        let cs = self.cluster_size() as usize;
        let mut buf = vec![0u8; cs];
        if data.len() < cs {
            self.read_mapped(old, c, 0, &mut buf)?;
        }
        buf[at as usize..at as usize + data.len()].copy_from_slice(data);
        self.ensure_l2(m, c)?;
        let k = self.alloc_cluster(m)?;
        let host = k << self.hdr.cluster_bits;
        write_all(&self.file, host, &buf).map_err(io_ctx(format!("writing guest cluster {c}")))?;
        m.file_len = m.file_len.max(host + cs as u64);
        self.stats.allocations.fetch_add(1, Relaxed);
        self.set_l2(m, c, host | COPIED)?;
        self.free_old(m, old)
    }

    /// Discards the whole clusters inside `[off, off + len)`: they read
    /// as zeroes afterwards (version 3 with a backing file: the zero flag,
    /// so the backing file does not show through) or from the backing
    /// file (version 2). Partial clusters are left as they are.
    pub fn discard(&self, off: u64, len: u64) -> Result<()> {
        let mut m = self.writable_meta()?;
        let cb = self.hdr.cluster_bits;
        let first = off.div_ceil(1 << cb);
        let end = (off + len) >> cb;
        for c in first..end {
            let old = self.lookup(&m, c)?;
            let zero_flag = self.hdr.version >= 3 && self.backing.is_some();
            let new = if zero_flag { ZERO } else { 0 };
            let same = match old {
                Mapping::Unallocated => !zero_flag,
                Mapping::Zero { host: None } => zero_flag,
                _ => false,
            };
            if same || self.l2_slot(&m, c) == 0 {
                continue;
            }
            self.ensure_l2(&mut m, c)?;
            self.set_l2(&mut m, c, new)?;
            self.free_old(&mut m, old)?;
        }
        Ok(())
    }

    /// Makes `[off, off + len)` read as zeroes. Whole clusters get the
    /// zero flag (version 3; with `keep` an allocated, unshared cluster
    /// stays allocated) or are unallocated (version 2 with no backing
    /// file); the rest is written with zeroes.
    pub fn write_zeroes(&self, off: u64, len: u64, keep: bool) -> Result<()> {
        let mut m = self.writable_meta()?;
        self.stats.locked_requests.fetch_add(1, Relaxed);
        let cs = self.cluster_size();
        for (c, at, r) in crate::pieces(off, len as usize, self.hdr.cluster_bits) {
            let old = self.lookup(&m, c)?;
            let reads_zero = match old {
                Mapping::Zero { .. } => true,
                Mapping::Unallocated => self.backing.is_none(),
                _ => false,
            };
            if reads_zero {
                continue;
            }
            let whole = r.len() as u64 == cs;
            if whole && self.hdr.version >= 3 {
                self.ensure_l2(&mut m, c)?;
                match old {
                    Mapping::Data {
                        host,
                        writable: true,
                    } if keep => {
                        self.set_l2(&mut m, c, host | COPIED | ZERO)?;
                    }
                    _ => {
                        self.set_l2(&mut m, c, ZERO)?;
                        self.free_old(&mut m, old)?;
                    }
                }
            } else if whole && self.backing.is_none() && !keep {
                self.ensure_l2(&mut m, c)?;
                self.set_l2(&mut m, c, 0)?;
                self.free_old(&mut m, old)?;
            } else {
                let zero = vec![0u8; r.len()];
                self.write_cluster_locked(&mut m, c, at, &zero)?;
            }
        }
        Ok(())
    }

    /// Makes every completed write durable, then applies queued frees.
    pub fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let mut m = self.lock();
        sync(&self.file).map_err(io_ctx("fdatasync"))?;
        if let Some(a) = m.alloc.as_mut() {
            a.apply_pending(&self.file)?;
        }
        Ok(())
    }

    /// Flushes, frees what is queued, gives back reserved clusters and
    /// flushes again; later writes fail. Idempotent.
    pub fn close(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let mut m = self.lock();
        if m.closed {
            return Ok(());
        }
        sync(&self.file).map_err(io_ctx("fdatasync at close"))?;
        if let Some(a) = m.alloc.as_mut() {
            a.apply_pending(&self.file)?;
            a.release(&self.file)?;
        }
        sync(&self.file).map_err(io_ctx("fdatasync at close"))?;
        m.closed = true;
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Best effort: an explicit close reports errors; here they can
        // only leave leaked clusters.
        let _ = self.close();
    }
}
