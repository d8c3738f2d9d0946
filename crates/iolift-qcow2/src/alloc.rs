//! Cluster allocation and freeing, in the order that keeps a crash
//! harmless (at worst a leaked cluster, which `qemu-img check` reports as a
//! leak, never a cluster in use with refcount 0):
//!
//! - Allocation: clusters are reserved in batches. A batch's refcounts are
//!   written (1 each) and made durable (fdatasync) before any of its
//!   clusters is handed out, so no L2 or L1 entry can ever point to a
//!   cluster whose refcount is not already on disk.
//! - Freeing: the caller first rewrites the entry that pointed to the
//!   cluster; the refcount is decremented only after the next fdatasync
//!   ([`Alloc::apply_pending`]), so no durable entry can point to a cluster
//!   that is free.
//! - A new refcount block is written and made durable before the refcount
//!   table entry points to it; a grown refcount table is written and made
//!   durable before the header points to it, and the old table's clusters
//!   are freed only after that.
//!
//! Unused reserved clusters are given back at close ([`Alloc::release`]);
//! a crash leaks them.

use crate::error::{corrupt, io_ctx, Result};
use crate::header::field;
use crate::io::{read_zero_fill, sync, write_all};
use crate::refcount::Refcounts;
use std::collections::{HashSet, VecDeque};
use std::fs::File;

/// Clusters reserved per batch (one fdatasync each batch).
pub const BATCH: usize = 64;
/// Frees waiting for an fdatasync; past this the control plane syncs.
pub const MAX_PENDING: usize = 4096;

pub struct Alloc {
    pub rc: Refcounts,
    cluster_bits: u32,
    /// First cluster index past everything in the file or allocated.
    pub end: u64,
    /// No free cluster lies below this index.
    free_hint: u64,
    reserved: VecDeque<u64>,
    pending: Vec<u64>,
    /// Cluster ranges [start, end) the header, the L1 table and the
    /// refcount table occupy.
    fixed: Vec<(u64, u64)>,
    /// L2 tables and refcount blocks, by cluster index.
    pub tables: HashSet<u64>,
}

impl Alloc {
    pub fn new(rc: Refcounts, cluster_bits: u32, file_len: u64, fixed: Vec<(u64, u64)>) -> Alloc {
        let cs = 1u64 << cluster_bits;
        let mut tables = HashSet::new();
        for &b in &rc.table {
            if b != 0 {
                tables.insert(b >> cluster_bits);
            }
        }
        Alloc {
            rc,
            cluster_bits,
            end: file_len.div_ceil(cs),
            free_hint: 0,
            reserved: VecDeque::new(),
            pending: Vec::new(),
            fixed,
            tables,
        }
    }

    fn cs(&self) -> u64 {
        1 << self.cluster_bits
    }

    fn what(&self, k: u64) -> Option<&'static str> {
        if self.tables.contains(&k) {
            return Some("an L2 table or refcount block");
        }
        self.fixed
            .iter()
            .any(|&(s, e)| k >= s && k < e)
            .then_some("the header, L1 table or refcount table")
    }

    /// One cluster whose refcount (1) is already durable.
    pub fn alloc(&mut self, file: &File) -> Result<u64> {
        if self.reserved.is_empty() {
            self.reserve(file)?;
        }
        Ok(self.reserved.pop_front().expect("reserve fills the batch"))
    }

    /// Reserves a batch: free clusters inside the file first, then new
    /// ones at its end; writes their refcounts, then fdatasync.
    fn reserve(&mut self, file: &File) -> Result<()> {
        let mut got = Vec::with_capacity(BATCH);
        let bb = self.rc.block_bits();
        let mut k = self.free_hint;
        let mut block = vec![0u8; self.cs() as usize];
        while got.len() < BATCH && k < self.end {
            let b = k >> bb;
            let first = b << bb;
            let last = ((b + 1) << bb).min(self.end);
            let off = self.rc.table.get(b as usize).copied().unwrap_or(0);
            if off == 0 {
                block.fill(0);
            } else {
                read_zero_fill(file, off, &mut block)
                    .map_err(io_ctx(format!("reading refcount block {b}")))?;
            }
            while k < last && got.len() < BATCH {
                if self.rc.decode(&block, k - first) == 0 {
                    if let Some(w) = self.what(k) {
                        return corrupt(format!("cluster {k} holds {w} but its refcount is 0"));
                    }
                    got.push(k);
                }
                k += 1;
            }
        }
        self.free_hint = k;
        while got.len() < BATCH {
            got.push(self.end);
            self.end += 1;
        }
        for &c in &got {
            self.set(file, c, 1)?;
        }
        sync(file).map_err(io_ctx("fdatasync after reserving clusters"))?;
        self.reserved.extend(got);
        Ok(())
    }

    /// Sets a refcount, making its block (and table room) first.
    fn set(&mut self, file: &File, k: u64, v: u64) -> Result<()> {
        self.ensure_block(file, k >> self.rc.block_bits())?;
        self.rc.set(file, k, v)
    }

    /// Makes refcount block `b` exist: a new zeroed block at the end of
    /// the file, durable before the table entry points to it.
    fn ensure_block(&mut self, file: &File, b: u64) -> Result<()> {
        if b as usize >= self.rc.table.len() {
            self.grow_table(file, b + 1)?;
        }
        if self.rc.table[b as usize] != 0 {
            return Ok(());
        }
        let at = self.end;
        self.end += 1;
        let bb = self.rc.block_bits();
        let mut block = vec![0u8; self.cs() as usize];
        if at >> bb == b {
            self.rc.encode(&mut block, at - (b << bb), 1);
        } else {
            self.set(file, at, 1)?;
        }
        write_all(file, at << self.cluster_bits, &block)
            .map_err(io_ctx(format!("writing new refcount block {b}")))?;
        sync(file).map_err(io_ctx("fdatasync after a new refcount block"))?;
        self.rc.table[b as usize] = at << self.cluster_bits;
        self.tables.insert(at);
        self.rc.write_entry(file, b)
    }

    /// Moves the refcount table to a bigger place at the end of the file.
    fn grow_table(&mut self, file: &File, need: u64) -> Result<()> {
        let per = self.cs() / 8;
        let bb = self.rc.block_bits();
        let at = self.end;
        let mut n = (self.rc.table_clusters * 2).max(need.div_ceil(per));
        while n * per < need.max(((at + n + 8) >> bb) + 1) {
            n *= 2;
        }
        let (old_off, old_n) = (self.rc.table_offset, self.rc.table_clusters);
        self.end += n;
        self.rc.table.resize((n * per) as usize, 0);
        self.rc.table_offset = at << self.cluster_bits;
        self.rc.table_clusters = n;
        for i in 0..n {
            self.set(file, at + i, 1)?;
        }
        let mut raw = Vec::with_capacity(self.rc.table.len() * 8);
        for e in &self.rc.table {
            raw.extend_from_slice(&e.to_be_bytes());
        }
        write_all(file, self.rc.table_offset, &raw)
            .map_err(io_ctx("writing the grown refcount table"))?;
        sync(file).map_err(io_ctx("fdatasync after growing the refcount table"))?;
        let mut hdr = [0u8; 12];
        hdr[..8].copy_from_slice(&self.rc.table_offset.to_be_bytes());
        hdr[8..].copy_from_slice(&(n as u32).to_be_bytes());
        write_all(file, field::REFCOUNT_TABLE_OFFSET, &hdr)
            .map_err(io_ctx("writing the header's refcount table fields"))?;
        debug_assert_eq!(
            field::REFCOUNT_TABLE_CLUSTERS,
            field::REFCOUNT_TABLE_OFFSET + 8
        );
        sync(file).map_err(io_ctx("fdatasync after moving the refcount table"))?;
        let old = old_off >> self.cluster_bits;
        self.fixed.retain(|&(s, _)| s != old);
        self.fixed.push((at, at + n));
        for i in 0..old_n {
            self.decref(file, old + i)?;
        }
        Ok(())
    }

    /// Decrements a refcount now (the caller has made sure no durable
    /// entry points to the cluster any more).
    fn decref(&mut self, file: &File, k: u64) -> Result<()> {
        let v = self.rc.get(file, k)?;
        if v == 0 {
            return corrupt(format!(
                "refcount of cluster {k} is already 0 when freeing it"
            ));
        }
        self.rc.set(file, k, v - 1)?;
        if v == 1 && k < self.free_hint {
            self.free_hint = k;
        }
        Ok(())
    }

    /// Queues a free, applied after the next fdatasync.
    pub fn free_later(&mut self, k: u64) {
        self.tables.remove(&k);
        self.pending.push(k);
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Applies queued frees; call only right after an fdatasync.
    pub fn apply_pending(&mut self, file: &File) -> Result<()> {
        for k in std::mem::take(&mut self.pending) {
            self.decref(file, k)?;
        }
        Ok(())
    }

    /// Gives back the reserved clusters (at close).
    pub fn release(&mut self, file: &File) -> Result<()> {
        while let Some(k) = self.reserved.pop_front() {
            self.decref(file, k)?;
        }
        Ok(())
    }

    /// `n` contiguous new clusters at the end of the file, refcounts
    /// durable (tables that must be contiguous: L1 copies, the snapshot
    /// table).
    pub fn alloc_run(&mut self, file: &File, n: u64) -> Result<u64> {
        let at = self.end;
        self.end += n;
        for k in at..at + n {
            self.set(file, k, 1)?;
        }
        sync(file).map_err(io_ctx("fdatasync after allocating a table"))?;
        Ok(at)
    }

    /// Adds one reference to an allocated cluster.
    pub fn incref(&mut self, file: &File, k: u64) -> Result<()> {
        let v = self.rc.get(file, k)?;
        if v == 0 {
            return corrupt(format!("cluster {k} is referenced but its refcount is 0"));
        }
        self.rc.set(file, k, v + 1)
    }

    /// Drops one reference now (the caller made sure nothing durable
    /// needs it); returns the new refcount.
    pub fn decref_now(&mut self, file: &File, k: u64) -> Result<u64> {
        self.decref(file, k)?;
        let v = self.rc.get(file, k)?;
        if v == 0 {
            self.tables.remove(&k);
        }
        Ok(v)
    }

    /// Adds a cluster range [start, end) that holds metadata.
    pub fn note_fixed(&mut self, start: u64, end: u64) {
        self.fixed.push((start, end));
    }

    /// Forgets a metadata range starting at `start` (it was freed).
    pub fn forget_fixed(&mut self, start: u64) {
        self.fixed.retain(|&(s, _)| s != start);
    }

    /// Marks a cluster as an L2 table (the allocator then never hands it
    /// out even if its refcount reads 0).
    pub fn note_table(&mut self, k: u64) {
        self.tables.insert(k);
    }

    /// Whether cluster `k` is free: refcount 0 and no metadata there.
    fn is_free(&self, file: &File, k: u64) -> Result<bool> {
        Ok(self.what(k).is_none() && self.rc.get(file, k)? == 0)
    }

    /// The lowest free cluster below `limit`, given refcount 1 (not yet
    /// durable: the caller syncs before pointing anything to it), or
    /// `None` (compaction). Call with no clusters reserved.
    pub fn take_free_below(&mut self, file: &File, limit: u64) -> Result<Option<u64>> {
        let mut k = self.free_hint;
        while k < limit.min(self.end) {
            if self.is_free(file, k)? {
                self.set(file, k, 1)?;
                self.free_hint = k + 1;
                return Ok(Some(k));
            }
            k += 1;
        }
        self.free_hint = self.free_hint.max(k);
        Ok(None)
    }

    /// One past the highest cluster in use (the length, in clusters, the
    /// file may be cut to). Call with no clusters reserved.
    pub fn used_end(&self, file: &File) -> Result<u64> {
        let mut k = self.end;
        while k > 0 && self.is_free(file, k - 1)? {
            k -= 1;
        }
        Ok(k)
    }

    /// The file was cut to `end` clusters (all free past it).
    pub fn truncated(&mut self, end: u64) {
        self.end = end;
        self.free_hint = self.free_hint.min(end);
    }

    /// Clusters reserved and not handed out yet.
    pub fn reserved(&self) -> usize {
        self.reserved.len()
    }
}
