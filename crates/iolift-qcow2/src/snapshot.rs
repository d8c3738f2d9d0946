//! Internal snapshots: the snapshot table (read, written), and create,
//! list and delete by the control plane.
//!
//! Refcounts follow QEMU's rule: a data cluster counts one reference per
//! L1 table (the active one and each snapshot's) that reaches it, even
//! through a shared L2 table; an L2 table counts one per L1 table pointing
//! to it. So creating a snapshot adds one to every cluster the active L1
//! reaches (data and L2 tables) and clears their COPIED bits; a write then
//! copies a shared L2 table (`update.rs`) or data cluster before changing
//! it. Deleting one removes it from the table first, then drops its
//! references and sets COPIED again where a refcount fell to 1. Reverting
//! to one (`qemu-img snapshot -a`) adds the snapshot's references, points
//! the active L1 table to its L2 tables, then drops the old active
//! layer's references (each step durable before the next: a crash leaks
//! clusters at worst).

use crate::control::{ControlPlane, Meta};
use crate::error::{io_ctx, Error, Result};
use crate::io::{read_exact, sync, write_all};
use crate::mapping::{compressed_clusters, COMPRESSED, COPIED, OFFSET_MASK};
use crate::snaptable::{encode_table, Snapshot};

impl ControlPlane {
    /// The internal snapshots.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        self.lock().snapshots.clone()
    }

    fn read_l2(&self, off: u64) -> Result<Vec<u8>> {
        let mut t = vec![0u8; self.cluster_size() as usize];
        read_exact(&self.file, off, &mut t)
            .map_err(io_ctx(format!("reading the L2 table at {off:#x}")))?;
        Ok(t)
    }

    /// The host clusters one L2 entry references (data, preallocated
    /// zero, or the clusters of compressed data).
    fn entry_clusters(&self, e: u64) -> Vec<u64> {
        let cb = self.hdr.cluster_bits;
        if e & COMPRESSED != 0 {
            let x = 62 - (cb - 8);
            let host = e & ((1u64 << x) - 1);
            let sectors = ((e >> x) & ((1u64 << (cb - 8)) - 1)) + 1;
            let len = ((host & !511) + sectors * 512 - host) as u32;
            return compressed_clusters(host, len, cb).collect();
        }
        let host = e & OFFSET_MASK;
        if host == 0 {
            Vec::new()
        } else {
            vec![host >> cb]
        }
    }

    /// Creates snapshot `name` of the active layer (the disk, no VM
    /// state). Every cached mapping is invalidated first: none of them
    /// may be written in place afterwards.
    pub fn snapshot_create(&self, name: &str) -> Result<()> {
        let mut m = self.writable_meta()?;
        if name.is_empty() || name.len() > 1024 {
            return Err(Error::Invalid(format!(
                "snapshot name {name:?}: 1 to 1024 bytes"
            )));
        }
        if m.snapshots.iter().any(|s| s.name == name) {
            return Err(Error::Invalid(format!("a snapshot named {name:?} exists")));
        }
        let keys: Vec<u64> = m.held.keys().copied().collect();
        for c in keys {
            self.invalidate(&mut m, c);
        }
        let cb = self.hdr.cluster_bits;
        for i in 0..m.l1.len() {
            let l2 = m.l1[i] & OFFSET_MASK;
            if l2 == 0 {
                continue;
            }
            let mut t = self.read_l2(l2)?;
            for e in t.chunks_exact_mut(8) {
                let v = u64::from_be_bytes(e[..].try_into().unwrap());
                for k in self.entry_clusters(v) {
                    m.alloc_mut().incref(&self.file, k)?;
                }
                e.copy_from_slice(&(v & !COPIED).to_be_bytes());
            }
            write_all(&self.file, l2, &t).map_err(io_ctx("writing an L2 table"))?;
            m.alloc_mut().incref(&self.file, l2 >> cb)?;
            m.l1[i] &= !COPIED;
        }
        let raw: Vec<u8> = m.l1.iter().flat_map(|e| e.to_be_bytes()).collect();
        let n = (raw.len() as u64).div_ceil(self.cluster_size()).max(1);
        let at = m.alloc_mut().alloc_run(&self.file, n)?;
        write_all(&self.file, at << cb, &raw).map_err(io_ctx("writing the snapshot's L1 table"))?;
        write_all(&self.file, self.hdr.l1_table_offset, &raw)
            .map_err(io_ctx("writing the L1 table"))?;
        m.alloc_mut().note_fixed(at, at + n);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let id = m
            .snapshots
            .iter()
            .filter_map(|s| s.id.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        let mut extra = vec![0u8; 16];
        extra[8..].copy_from_slice(&self.hdr.size.to_be_bytes());
        let mut snaps = m.snapshots.clone();
        snaps.push(Snapshot {
            l1_offset: at << cb,
            l1_size: m.l1.len() as u32,
            id: id.to_string(),
            name: name.to_string(),
            date_sec: now.as_secs() as u32,
            date_nsec: now.subsec_nanos(),
            vm_clock_nsec: 0,
            vm_state_size: 0,
            extra,
        });
        self.write_snapshot_table(&mut m, snaps)
    }

    /// Writes a new snapshot table, points the header to it, frees the
    /// old one (in that order, each step durable before the next).
    fn write_snapshot_table(&self, m: &mut Meta, snaps: Vec<Snapshot>) -> Result<()> {
        sync(&self.file).map_err(io_ctx("fdatasync before the snapshot table"))?;
        let cb = self.hdr.cluster_bits;
        let raw = encode_table(&snaps);
        let (off, n) = if snaps.is_empty() {
            (0, 0)
        } else {
            let n = (raw.len() as u64).div_ceil(self.cluster_size());
            let at = m.alloc_mut().alloc_run(&self.file, n)?;
            write_all(&self.file, at << cb, &raw).map_err(io_ctx("writing the snapshot table"))?;
            sync(&self.file).map_err(io_ctx("fdatasync of the snapshot table"))?;
            m.alloc_mut().note_fixed(at, at + n);
            (at << cb, n)
        };
        let mut h = [0u8; 12];
        h[..4].copy_from_slice(&(snaps.len() as u32).to_be_bytes());
        h[4..].copy_from_slice(&off.to_be_bytes());
        write_all(&self.file, 60, &h).map_err(io_ctx("writing the header's snapshot fields"))?;
        sync(&self.file).map_err(io_ctx("fdatasync of the header"))?;
        let (old, old_n) = (m.snap_offset >> cb, m.snap_clusters);
        if m.snap_offset != 0 {
            m.alloc_mut().forget_fixed(old);
            for k in old..old + old_n {
                m.alloc_mut().decref_now(&self.file, k)?;
            }
        }
        m.snap_offset = off;
        m.snap_clusters = n;
        m.snapshots = snaps;
        Ok(())
    }

    /// Deletes snapshot `name` (or id): out of the table first, then its
    /// references dropped, then COPIED set again where a cluster of the
    /// active layer is no longer shared.
    pub fn snapshot_delete(&self, name: &str) -> Result<()> {
        let mut m = self.writable_meta()?;
        let Some(i) = m
            .snapshots
            .iter()
            .position(|s| s.name == name || s.id == name)
        else {
            return Err(Error::Invalid(format!("no snapshot named {name:?}")));
        };
        let keys: Vec<u64> = m.held.keys().copied().collect();
        for c in keys {
            self.invalidate(&mut m, c);
        }
        let mut snaps = m.snapshots.clone();
        let gone = snaps.remove(i);
        self.write_snapshot_table(&mut m, snaps)?;
        let cb = self.hdr.cluster_bits;
        let mut raw = vec![0u8; gone.l1_size as usize * 8];
        read_exact(&self.file, gone.l1_offset, &mut raw)
            .map_err(io_ctx("reading the snapshot's L1 table"))?;
        for e in raw.chunks_exact(8) {
            let l2 = u64::from_be_bytes(e.try_into().unwrap()) & OFFSET_MASK;
            if l2 == 0 {
                continue;
            }
            for e in self.read_l2(l2)?.chunks_exact(8) {
                for k in self.entry_clusters(u64::from_be_bytes(e.try_into().unwrap())) {
                    m.alloc_mut().decref_now(&self.file, k)?;
                }
            }
            m.alloc_mut().decref_now(&self.file, l2 >> cb)?;
        }
        let l1_start = gone.l1_offset >> cb;
        m.alloc_mut().forget_fixed(l1_start);
        let n = (raw.len() as u64).div_ceil(self.cluster_size()).max(1);
        for k in l1_start..l1_start + n {
            m.alloc_mut().decref_now(&self.file, k)?;
        }
        self.restore_copied(&mut m)?;
        sync(&self.file).map_err(io_ctx("fdatasync after deleting a snapshot"))
    }

    /// Sets COPIED on active L1 and L2 entries whose cluster's refcount
    /// is 1 again.
    fn restore_copied(&self, m: &mut Meta) -> Result<()> {
        let cb = self.hdr.cluster_bits;
        for i in 0..m.l1.len() {
            let l2 = m.l1[i] & OFFSET_MASK;
            if l2 == 0 || m.alloc_mut().rc.get(&self.file, l2 >> cb)? != 1 {
                continue;
            }
            let mut t = self.read_l2(l2)?;
            for e in t.chunks_exact_mut(8) {
                let v = u64::from_be_bytes(e[..].try_into().unwrap());
                if v & COMPRESSED != 0 || v & OFFSET_MASK == 0 {
                    continue;
                }
                if m.alloc_mut().rc.get(&self.file, (v & OFFSET_MASK) >> cb)? == 1 {
                    e.copy_from_slice(&(v | COPIED).to_be_bytes());
                }
            }
            write_all(&self.file, l2, &t).map_err(io_ctx("writing an L2 table"))?;
            m.l1[i] |= COPIED;
            let at = self.hdr.l1_table_offset + i as u64 * 8;
            write_all(&self.file, at, &m.l1[i].to_be_bytes())
                .map_err(io_ctx("writing the L1 table"))?;
        }
        Ok(())
    }
}

impl ControlPlane {
    /// Reverts the active layer to snapshot `name` (or id): the disk
    /// reads as it did when the snapshot was taken; the snapshot stays.
    /// Every cached mapping is invalidated first. The snapshot must have
    /// the image's current virtual size (no resize here).
    pub fn snapshot_revert(&self, name: &str) -> Result<()> {
        let mut m = self.writable_meta()?;
        let Some(s) = m
            .snapshots
            .iter()
            .find(|s| s.name == name || s.id == name)
            .cloned()
        else {
            return Err(Error::Invalid(format!("no snapshot named {name:?}")));
        };
        if s.extra.len() >= 16 {
            let size = u64::from_be_bytes(s.extra[8..16].try_into().unwrap());
            if size != self.hdr.size {
                return Err(Error::Invalid(format!(
                    "snapshot {name:?} has a virtual size of {size} bytes, the image {}: \
                     reverting across a resize is not supported",
                    self.hdr.size
                )));
            }
        }
        if s.l1_size as usize > m.l1.len() {
            return Err(Error::Invalid(format!(
                "snapshot {name:?}: its L1 table has {} entries, the image's {}",
                s.l1_size,
                m.l1.len()
            )));
        }
        let keys: Vec<u64> = m.held.keys().copied().collect();
        for c in keys {
            self.invalidate(&mut m, c);
        }
        let cb = self.hdr.cluster_bits;
        let mut raw = vec![0u8; s.l1_size as usize * 8];
        read_exact(&self.file, s.l1_offset, &mut raw)
            .map_err(io_ctx("reading the snapshot's L1 table"))?;
        let mut new_l1 = vec![0u64; m.l1.len()];
        // 1. The snapshot's clusters get the active layer's reference
        //    (COPIED cleared: they are shared with the snapshot).
        for (i, e) in raw.chunks_exact(8).enumerate() {
            let l2 = u64::from_be_bytes(e.try_into().unwrap()) & OFFSET_MASK;
            if l2 == 0 {
                continue;
            }
            let mut t = self.read_l2(l2)?;
            let mut changed = false;
            for e in t.chunks_exact_mut(8) {
                let v = u64::from_be_bytes(e[..].try_into().unwrap());
                for k in self.entry_clusters(v) {
                    m.alloc_mut().incref(&self.file, k)?;
                }
                if v & COPIED != 0 {
                    e.copy_from_slice(&(v & !COPIED).to_be_bytes());
                    changed = true;
                }
            }
            if changed {
                write_all(&self.file, l2, &t).map_err(io_ctx("writing an L2 table"))?;
            }
            m.alloc_mut().incref(&self.file, l2 >> cb)?;
            new_l1[i] = l2;
        }
        sync(&self.file).map_err(io_ctx("fdatasync before reverting the L1 table"))?;
        // 2. The active L1 table points to the snapshot's L2 tables.
        let bytes: Vec<u8> = new_l1.iter().flat_map(|e| e.to_be_bytes()).collect();
        write_all(&self.file, self.hdr.l1_table_offset, &bytes)
            .map_err(io_ctx("writing the L1 table"))?;
        sync(&self.file).map_err(io_ctx("fdatasync of the reverted L1 table"))?;
        let old_l1 = std::mem::replace(&mut m.l1, new_l1);
        // 3. The old active layer's references are dropped.
        for e in old_l1 {
            let l2 = e & OFFSET_MASK;
            if l2 == 0 {
                continue;
            }
            for e in self.read_l2(l2)?.chunks_exact(8) {
                for k in self.entry_clusters(u64::from_be_bytes(e.try_into().unwrap())) {
                    m.alloc_mut().decref_now(&self.file, k)?;
                }
            }
            m.alloc_mut().decref_now(&self.file, l2 >> cb)?;
        }
        self.restore_copied(&mut m)?;
        sync(&self.file).map_err(io_ctx("fdatasync after reverting to a snapshot"))
    }
}
