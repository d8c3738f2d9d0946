//! Online compaction: moves clusters toward the start of the file, then
//! cuts the file after the last cluster in use.
//!
//! What moves: data clusters and L2 tables of the active layer whose
//! refcount is 1 (COPIED set), and refcount blocks, highest first, each
//! into the lowest free cluster. Clusters shared with a snapshot,
//! compressed clusters, preallocated zero clusters and the fixed metadata
//! (header, L1 tables, refcount table, snapshot table) stay where they
//! are, so the file can only shrink down to the highest of those.
//!
//! One round, under the control plane's lock (data paths keep serving
//! hits on other clusters; misses wait):
//!
//! 1. each move's target gets refcount 1, then fdatasync;
//! 2. every cached mapping of a data cluster to move is invalidated,
//!    which waits for the I/O in flight on it; then the cluster is copied;
//!    fdatasync (the copy is durable before anything points to it);
//! 3. the L2 entries point to the copies; then the L2 tables and
//!    refcount blocks to move are copied (with those entries) and
//!    fdatasync'ed, and the L1 and refcount table entries point to them;
//!    fdatasync;
//! 4. the old clusters are freed.
//!
//! A crash leaves the old mapping or the new one, both with durable
//! data, plus at most leaked clusters. The lock is released between
//! rounds, so writes keep going during a long compaction; each round
//! checks that its candidates still map where they did.

use crate::control::{ControlPlane, Meta};
use crate::error::{io_ctx, Result};
use crate::io::{read_exact, sync, write_all};
use crate::mapping::{COMPRESSED, COPIED, OFFSET_MASK, ZERO};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering::Relaxed;

/// Candidates one scan of the L2 tables collects (16 bytes each).
pub const SCAN_BUDGET: usize = 4096;
/// Clusters moved per round under the lock.
pub const ROUND: usize = 64;

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactStats {
    pub data_moved: u64,
    /// L2 tables and refcount blocks moved.
    pub tables_moved: u64,
    pub len_before: u64,
    pub len_after: u64,
}

/// A host cluster that may move: a data cluster (its guest cluster), an
/// L2 table (its L1 index) or a refcount block (its index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum What {
    Data(u64),
    Table(usize),
    Refblock(usize),
}

impl ControlPlane {
    /// Compacts the image while it is served (see the module comment).
    pub fn compact(&self) -> Result<CompactStats> {
        let mut st = CompactStats {
            len_before: self.writable_meta()?.file_len,
            ..CompactStats::default()
        };
        loop {
            let cands = self.candidates(&mut *self.writable_meta()?)?;
            if cands.is_empty() {
                break;
            }
            let mut moved_any = false;
            let mut stop = false;
            for round in cands.chunks(ROUND) {
                let mut m = self.writable_meta()?;
                let (moved, full) = self.move_round(&mut m, round, &mut st)?;
                moved_any |= moved > 0;
                if full {
                    stop = true;
                    break;
                }
            }
            if stop || !moved_any {
                break;
            }
        }
        let mut m = self.writable_meta()?;
        self.settle(&mut m)?;
        let cb = self.hdr.cluster_bits;
        let end = m.alloc_mut().used_end(&self.file)?;
        if end << cb < m.file_len {
            self.file
                .set_len(end << cb)
                .map_err(io_ctx("cutting the image file"))?;
            sync(&self.file).map_err(io_ctx("fdatasync after cutting the file"))?;
            m.alloc_mut().truncated(end);
            m.file_len = end << cb;
        }
        st.len_after = m.file_len;
        Ok(st)
    }

    /// Makes queued frees and reserved clusters free again.
    fn settle(&self, m: &mut Meta) -> Result<()> {
        sync(&self.file).map_err(io_ctx("fdatasync before compaction"))?;
        let a = m.alloc_mut();
        a.apply_pending(&self.file)?;
        if a.reserved() > 0 {
            a.release(&self.file)?;
            sync(&self.file).map_err(io_ctx("fdatasync before compaction"))?;
        }
        Ok(())
    }

    /// The highest movable host clusters (at most [`SCAN_BUDGET`]),
    /// highest first.
    fn candidates(&self, m: &mut Meta) -> Result<Vec<(u64, What)>> {
        self.settle(m)?;
        let cb = self.hdr.cluster_bits;
        let mut heap: BinaryHeap<Reverse<(u64, What)>> = BinaryHeap::new();
        let mut keep = |k: u64, w: What| {
            heap.push(Reverse((k, w)));
            if heap.len() > SCAN_BUDGET {
                heap.pop();
            }
        };
        for (b, &off) in m.alloc_mut().rc.table.iter().enumerate() {
            if off != 0 {
                keep(off >> cb, What::Refblock(b));
            }
        }
        let mut t = vec![0u8; self.cluster_size() as usize];
        for i in 0..m.l1.len() {
            let l2 = m.l1[i] & OFFSET_MASK;
            if l2 == 0 {
                continue;
            }
            if m.l1[i] & COPIED != 0 {
                keep(l2 >> cb, What::Table(i));
            }
            read_exact(&self.file, l2, &mut t).map_err(io_ctx(format!("reading L2 table {i}")))?;
            for (j, e) in t.chunks_exact(8).enumerate() {
                let v = u64::from_be_bytes(e.try_into().unwrap());
                if v & COPIED != 0 && v & (COMPRESSED | ZERO) == 0 && v & OFFSET_MASK != 0 {
                    let c = ((i as u64) << self.hdr.l2_bits()) | j as u64;
                    keep((v & OFFSET_MASK) >> cb, What::Data(c));
                }
            }
        }
        let mut v: Vec<(u64, What)> = heap.into_iter().map(|Reverse(x)| x).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        Ok(v)
    }

    /// Whether a candidate still maps where the scan saw it.
    fn still(&self, m: &Meta, k: u64, w: What) -> Result<bool> {
        let cb = self.hdr.cluster_bits;
        Ok(match w {
            What::Table(i) => m.l1[i] == (k << cb) | COPIED,
            What::Data(c) => self.l2_entry(m, c)? == (k << cb) | COPIED,
            What::Refblock(b) => m.alloc.as_ref().map(|a| a.rc.table[b]) == Some(k << cb),
        })
    }

    /// Moves one round of candidates; returns (moved, no free cluster
    /// left below the next candidate).
    fn move_round(
        &self,
        m: &mut Meta,
        round: &[(u64, What)],
        st: &mut CompactStats,
    ) -> Result<(usize, bool)> {
        let cb = self.hdr.cluster_bits;
        let mut plan = Vec::with_capacity(round.len());
        let mut full = false;
        for &(k, w) in round {
            if !self.still(m, k, w)? {
                continue;
            }
            match m.alloc_mut().take_free_below(&self.file, k)? {
                Some(t) => plan.push((k, t, w)),
                None => {
                    full = true;
                    break;
                }
            }
        }
        if plan.is_empty() {
            return Ok((0, full));
        }
        sync(&self.file).map_err(io_ctx("fdatasync of the compaction targets"))?;
        let mut buf = vec![0u8; self.cluster_size() as usize];
        let copy = |from: u64, to: u64, buf: &mut [u8]| -> Result<()> {
            read_exact(&self.file, from << cb, buf)
                .map_err(io_ctx(format!("reading cluster {from} to move it")))?;
            write_all(&self.file, to << cb, buf)
                .map_err(io_ctx(format!("writing cluster {from} to {to}")))
        };
        for &(k, t, w) in &plan {
            if let What::Data(c) = w {
                self.invalidate(m, c);
                copy(k, t, &mut buf)?;
            }
        }
        sync(&self.file).map_err(io_ctx("fdatasync of moved clusters"))?;
        for &(_, t, w) in &plan {
            if let What::Data(c) = w {
                self.set_l2(m, c, (t << cb) | COPIED)?;
                st.data_moved += 1;
            }
        }
        for &(k, t, w) in &plan {
            if let What::Table(_) | What::Refblock(_) = w {
                copy(k, t, &mut buf)?;
            }
        }
        sync(&self.file).map_err(io_ctx("fdatasync of moved L2 tables"))?;
        for &(_, t, w) in &plan {
            if let What::Table(i) = w {
                m.l1[i] = (t << cb) | COPIED;
                m.alloc_mut().note_table(t);
                let at = self.hdr.l1_table_offset + i as u64 * 8;
                write_all(&self.file, at, &m.l1[i].to_be_bytes())
                    .map_err(io_ctx(format!("writing L1 entry {i}")))?;
                st.tables_moved += 1;
            }
            if let What::Refblock(b) = w {
                let a = m.alloc_mut();
                a.rc.table[b] = t << cb;
                a.note_table(t);
                a.rc.write_entry(&self.file, b as u64)?;
                st.tables_moved += 1;
            }
        }
        sync(&self.file).map_err(io_ctx("fdatasync after moving clusters"))?;
        for &(k, _, _) in &plan {
            m.alloc_mut().free_later(k);
        }
        m.alloc_mut().apply_pending(&self.file)?;
        self.stats.moved.fetch_add(plan.len() as u64, Relaxed);
        Ok((plan.len(), full))
    }
}
