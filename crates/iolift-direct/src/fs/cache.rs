//! The per-file buffer cache: a hash table from file block number to a
//! block buffer, bounded to a fixed number of blocks per open file (16 by
//! default, as in HAYAGUI). A block is dirty from a write until it is
//! written back (on eviction or sync). When the table is full, the least
//! recently used block is evicted (written back first if dirty).
//!
//! The caches of one file system also count their blocks in one shared
//! counter, so that the file system can hold all of them to a total
//! budget as well (see `Fs::set_cache_budget`).

use crate::blockhash::BlockHash;
use crate::buf::AlignedBuf;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

type BlockMap<V> = HashMap<u64, V, BlockHash>;

struct Slot {
    data: AlignedBuf,
    dirty: bool,
    used: u64,
}

/// One open file's cached blocks.
pub struct Cache {
    map: BlockMap<Slot>,
    cap: usize,
    tick: u64,
    /// Blocks in every cache sharing this counter.
    total: Arc<AtomicUsize>,
}

impl Cache {
    /// A cache of at most `cap` (>= 1) blocks, counting alone.
    pub fn new(cap: usize) -> Cache {
        Cache::counted(cap, Arc::default())
    }

    /// A cache of at most `cap` (>= 1) blocks whose blocks are also counted
    /// in `total`.
    pub fn counted(cap: usize, total: Arc<AtomicUsize>) -> Cache {
        Cache {
            // Grows as blocks come: a large cap costs nothing unused.
            map: BlockMap::with_capacity_and_hasher(cap.clamp(1, 16), Default::default()),
            cap: cap.max(1),
            tick: 0,
            total,
        }
    }

    /// The most blocks it holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn dirty_count(&self) -> usize {
        self.map.values().filter(|s| s.dirty).count()
    }

    /// The block is cached and dirty.
    pub fn is_dirty(&self, fb: u64) -> bool {
        self.map.get(&fb).is_some_and(|s| s.dirty)
    }

    pub fn contains(&self, fb: u64) -> bool {
        self.map.contains_key(&fb)
    }

    /// The block, marked as just used.
    pub fn get_mut(&mut self, fb: u64) -> Option<&mut AlignedBuf> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(&fb).map(|s| {
            s.used = t;
            &mut s.data
        })
    }

    /// Adds a clean block (the caller made room: see [`Self::evict_if_full`]).
    pub fn insert(&mut self, fb: u64, data: AlignedBuf) {
        debug_assert!(self.map.len() < self.cap || self.map.contains_key(&fb));
        self.tick += 1;
        if !self.map.contains_key(&fb) {
            self.total.fetch_add(1, Ordering::Relaxed);
        }
        self.map.insert(
            fb,
            Slot {
                data,
                dirty: false,
                used: self.tick,
            },
        );
    }

    pub fn mark_dirty(&mut self, fb: u64) {
        if let Some(s) = self.map.get_mut(&fb) {
            s.dirty = true;
        }
    }

    /// When full, removes the least recently used block and returns it
    /// with its dirty flag.
    pub fn evict_if_full(&mut self) -> Option<(u64, AlignedBuf, bool)> {
        if self.map.len() < self.cap {
            return None;
        }
        self.evict_lru()
    }

    /// Removes the least recently used block (if any) and returns it with
    /// its dirty flag.
    pub fn evict_lru(&mut self) -> Option<(u64, AlignedBuf, bool)> {
        let fb = *self.map.iter().min_by_key(|(_, s)| s.used)?.0;
        let s = self.map.remove(&fb)?;
        self.total.fetch_sub(1, Ordering::Relaxed);
        Some((fb, s.data, s.dirty))
    }

    /// The dirty blocks, in file order.
    pub fn dirty_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .map
            .iter()
            .filter(|(_, s)| s.dirty)
            .map(|(k, _)| *k)
            .collect();
        v.sort_unstable();
        v
    }

    /// The block, not marked as used.
    pub fn peek(&self, fb: u64) -> Option<&AlignedBuf> {
        self.map.get(&fb).map(|s| &s.data)
    }

    /// The block is clean from now on (its write-back has its bytes).
    pub fn mark_clean(&mut self, fb: u64) {
        if let Some(s) = self.map.get_mut(&fb) {
            s.dirty = false;
        }
    }

    /// The least recently used block and whether it is dirty (left in).
    pub fn lru(&self) -> Option<(u64, bool)> {
        self.map
            .iter()
            .min_by_key(|(_, s)| s.used)
            .map(|(k, s)| (*k, s.dirty))
    }

    /// Removes a block; returns its data and dirty flag.
    pub fn remove(&mut self, fb: u64) -> Option<(AlignedBuf, bool)> {
        let s = self.map.remove(&fb)?;
        self.total.fetch_sub(1, Ordering::Relaxed);
        Some((s.data, s.dirty))
    }

    /// A copy of a block to write back; the block is clean from now on.
    pub fn copy_and_clean(&mut self, fb: u64) -> Option<AlignedBuf> {
        let s = self.map.get_mut(&fb)?;
        s.dirty = false;
        let c = AlignedBuf::copy_of(&s.data);
        Some(c)
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.total.fetch_sub(self.map.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(v: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(4096);
        b.fill(v);
        b
    }

    #[test]
    fn bounded_lru_with_dirty_tracking() {
        let mut c = Cache::new(3);
        for fb in 0..3 {
            assert!(c.evict_if_full().is_none());
            c.insert(fb, blk(fb as u8));
        }
        c.mark_dirty(1);
        assert_eq!(c.dirty_blocks(), vec![1]);
        c.get_mut(0).unwrap()[0] = 9; // 0 used last; 1 is now the oldest
        let (fb, data, dirty) = c.evict_if_full().unwrap();
        assert_eq!((fb, data[0], dirty), (1, 1, true));
        assert_eq!(c.len(), 2);
        c.insert(7, blk(7));
        c.mark_dirty(7);
        c.mark_dirty(0);
        assert_eq!(c.dirty_blocks(), vec![0, 7]);
        let copy = c.copy_and_clean(0).unwrap();
        assert_eq!(copy[0], 9);
        assert_eq!(c.dirty_count(), 1);
        let (fb, _, dirty) = c.evict_if_full().unwrap();
        assert_eq!((fb, dirty), (2, false), "the least recently used");
    }

    #[test]
    fn caches_count_their_blocks_in_the_shared_total() {
        let total = Arc::new(AtomicUsize::new(0));
        let mut a = Cache::counted(4, total.clone());
        let mut b = Cache::counted(4, total.clone());
        a.insert(0, blk(0));
        a.insert(1, blk(1));
        a.insert(1, blk(2)); // the same block again: still two
        b.insert(9, blk(9));
        assert_eq!(total.load(Ordering::Relaxed), 3);
        assert_eq!(a.evict_lru().unwrap().0, 0);
        assert_eq!(total.load(Ordering::Relaxed), 2);
        drop(a);
        assert_eq!(total.load(Ordering::Relaxed), 1);
        drop(b);
        assert_eq!(total.load(Ordering::Relaxed), 0);
    }
}
