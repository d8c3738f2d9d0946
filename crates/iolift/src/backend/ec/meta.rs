//! crc-table pages changed in memory and not yet written to the children.
//!
//! With the write-intent bitmap a stripe update sets its crcs in the
//! in-memory table and marks the table pages (4 KiB of a child's crc
//! table, 1024 crcs) they lie in, instead of writing them to every child
//! at once (one small write per child per stripe). The marked pages are
//! written at the next flush, before the children are flushed and before
//! any bitmap bit is cleared, or at once when more than the budget
//! (`crc_dirty`) is marked. A crash before that leaves the crcs on disk
//! stale only in regions whose bitmap bit is still set on disk, which the
//! open resyncs (crcs recomputed from the chunks and rewritten): see
//! docs/ec-device.md. With the journal (a child failed or
//! `consistency=journal`) crcs are written with each update as before:
//! nothing would resync them.

use super::layout::BLOCK;
use super::Inner;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// crcs per table page.
const PER_PAGE: u64 = BLOCK / 4;

/// Marked pages, per child.
pub struct Dirty {
    /// One bit per table page, per child.
    pages: Vec<Mutex<Vec<u64>>>,
    /// Pages marked (all children), for the budget.
    count: AtomicU64,
    /// Most pages held marked before the update path writes them.
    limit: u64,
}

impl Dirty {
    /// `children` tables of `crcs` entries each; `budget` bytes of pages.
    pub fn new(children: usize, crcs: u64, budget: u64) -> Dirty {
        let pages = crcs.div_ceil(PER_PAGE);
        Dirty {
            pages: (0..children)
                .map(|_| Mutex::new(vec![0; pages.div_ceil(64) as usize]))
                .collect(),
            count: AtomicU64::new(0),
            limit: (budget / BLOCK).max(1),
        }
    }

    fn lock(&self, c: usize) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.pages[c].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the pages holding table entries `[first, first + n)` of child
    /// `c`; true when more than the budget is marked now.
    pub fn mark(&self, c: usize, first: u64, n: u64) -> bool {
        if n == 0 {
            return false;
        }
        let mut added = 0;
        {
            let mut v = self.lock(c);
            for p in first / PER_PAGE..=(first + n - 1) / PER_PAGE {
                let (w, bit) = ((p / 64) as usize, 1u64 << (p % 64));
                if v[w] & bit == 0 {
                    v[w] |= bit;
                    added += 1;
                }
            }
        }
        self.count.fetch_add(added, Ordering::AcqRel) + added > self.limit
    }

    /// Takes child `c`'s marked pages out: runs of consecutive pages
    /// `(first page, pages)`.
    fn take(&self, c: usize) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut taken = 0;
        {
            let mut v = self.lock(c);
            for (w, word) in v.iter_mut().enumerate() {
                let mut bits = std::mem::take(word);
                while bits != 0 {
                    let p = w as u64 * 64 + bits.trailing_zeros() as u64;
                    bits &= bits - 1;
                    taken += 1;
                    match runs.last_mut() {
                        Some((a, n)) if *a + *n == p => *n += 1,
                        _ => runs.push((p, 1)),
                    }
                }
            }
        }
        self.count.fetch_sub(taken, Ordering::AcqRel);
        runs
    }

    /// Pages marked now (all children).
    pub fn marked(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }
}

impl Inner {
    /// Sets the crcs of columns from `lo` of chunk `c` of stripe `s` in
    /// the table in memory and marks their pages for the next
    /// [`Inner::write_dirty_meta`]; writes the marked pages now if that
    /// passes the budget.
    pub async fn defer_meta(&self, c: usize, s: u64, lo: u64, sums: &[u32]) {
        self.set_crcs(c, s, lo, sums);
        let first = s * self.geo.blocks_per_chunk() + lo / BLOCK;
        if self.meta_dirty.mark(c, first, sums.len() as u64) {
            self.write_dirty_meta().await;
        }
    }

    /// Writes every marked table page, as it is in memory now, to its
    /// child (one write per run of pages); a child whose write fails is
    /// marked failed.
    pub async fn write_dirty_meta(&self) {
        if self.meta_dirty.marked() == 0 {
            return;
        }
        let per = self.crcs.first().map_or(0, |t| t.len() as u64);
        let mut writes = Vec::new();
        for c in 0..self.n() {
            let runs = self.meta_dirty.take(c);
            if !self.writable(c) {
                continue;
            }
            for (p, n) in runs {
                let mut b = Vec::with_capacity((n * BLOCK) as usize);
                for i in p * PER_PAGE..(p + n) * PER_PAGE {
                    let v = if i < per {
                        self.crcs[c][i as usize].load(Ordering::Relaxed)
                    } else {
                        0
                    };
                    b.extend_from_slice(&v.to_le_bytes());
                }
                let off = self.geo.meta_base() + p * BLOCK;
                writes.push((c, off, Bytes::from(b)));
            }
        }
        self.child_writes(writes).await;
    }
}
