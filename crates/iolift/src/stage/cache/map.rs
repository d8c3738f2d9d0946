//! The cache's block map: the blocks held, their dirty state, the LRU order
//! of clean blocks, the busy ranges (writes below in flight) and the fills
//! (read misses in flight).
//!
//! Contract: everything here is synchronous bookkeeping on a [`State`] that
//! the caller holds under the cache's one mutex; nothing here awaits, does
//! I/O or locks. The methods keep these invariants:
//! - `bytes` is the length of all held blocks, `dirty_bytes` that of the
//!   dirty ones;
//! - a clean block has an LRU tick and is in `lru`; a dirty block has none
//!   and is in `dirty` and, at its `dirty_seq`, in `dirty_fifo`;
//! - every change to a block's data sets its generation to a new value of
//!   the map-wide counter `gen`, so a snapshot's generation tells whether
//!   the block changed since;
//! - only clean blocks outside busy ranges are evicted.

use iolift_direct::blockhash::BlockHash;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// One cached block.
pub(super) struct Entry {
    pub(super) data: Vec<u8>,
    pub(super) dirty: bool,
    /// Generation of the last change.
    pub(super) gen: u64,
    /// Generation of the newest snapshot written back.
    pub(super) flushed_gen: u64,
    pub(super) dirty_since: Instant,
    /// Position in the dirty FIFO; dirty entries only.
    pub(super) dirty_seq: u64,
    /// LRU position; clean entries only.
    pub(super) tick: Option<u64>,
}

impl Entry {
    /// A clean entry at generation `gen` (also its flushed generation).
    fn new(data: Vec<u8>, gen: u64, tick: Option<u64>) -> Self {
        Entry {
            data,
            dirty: false,
            gen,
            flushed_gen: gen,
            dirty_since: Instant::now(),
            dirty_seq: 0,
            tick,
        }
    }
}

/// A block and the generation it had when a change was made to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BlockGen {
    pub(super) block: u64,
    pub(super) gen: u64,
}

/// Blocks `[b0, b1)` with a write below in flight, under id `id`.
pub(super) struct Busy {
    pub(super) b0: u64,
    pub(super) b1: u64,
    pub(super) id: u64,
}

/// A read miss in flight: blocks `[b0, b1)` are being read from below.
/// Any change to them meanwhile taints it, and a tainted fill is not
/// inserted.
pub(super) struct Fill {
    pub(super) id: u64,
    pub(super) b0: u64,
    pub(super) b1: u64,
    pub(super) tainted: bool,
}

/// The block map, guarded by the cache's mutex.
#[derive(Default)]
pub(super) struct State {
    pub(super) map: HashMap<u64, Entry, BlockHash>,
    /// Clean entries by last use.
    pub(super) lru: BTreeMap<u64, u64>,
    pub(super) dirty: BTreeSet<u64>,
    /// Dirty blocks, oldest first.
    pub(super) dirty_fifo: BTreeMap<u64, u64>,
    pub(super) bytes: u64,
    pub(super) dirty_bytes: u64,
    pub(super) tick: u64,
    pub(super) gen: u64,
    /// Block ranges with a write below in flight; they never overlap.
    pub(super) busy: Vec<Busy>,
    pub(super) fills: Vec<Fill>,
    pub(super) ids: u64,
}

impl State {
    /// A new id for a busy range or a fill.
    pub(super) fn next_id(&mut self) -> u64 {
        self.ids += 1;
        self.ids
    }

    /// Whether any block of `[b0, b1)` is in a busy range.
    pub(super) fn is_busy(&self, b0: u64, b1: u64) -> bool {
        self.busy.iter().any(|r| r.b0 < b1 && b0 < r.b1)
    }

    /// Marks `[b0, b1)` busy and returns the range's id.
    pub(super) fn push_busy(&mut self, b0: u64, b1: u64) -> u64 {
        let id = self.next_id();
        self.busy.push(Busy { b0, b1, id });
        id
    }

    /// Ends busy range `id`, returning it.
    pub(super) fn drop_busy(&mut self, id: u64) -> Option<Busy> {
        let p = self.busy.iter().position(|x| x.id == id)?;
        Some(self.busy.swap_remove(p))
    }

    /// Taints every fill overlapping `[b0, b1)`.
    pub(super) fn taint(&mut self, b0: u64, b1: u64) {
        for f in self.fills.iter_mut() {
            if f.b0 < b1 && b0 < f.b1 {
                f.tainted = true;
            }
        }
    }

    /// Registers a fill of `[b0, b1)` and returns its id.
    pub(super) fn push_fill(&mut self, b0: u64, b1: u64) -> u64 {
        let id = self.next_id();
        self.fills.push(Fill {
            id,
            b0,
            b1,
            tainted: false,
        });
        id
    }

    /// Ends fill `id`: whether it was tainted (a fill no longer registered
    /// counts as tainted).
    pub(super) fn take_fill(&mut self, id: u64) -> bool {
        match self.fills.iter().position(|f| f.id == id) {
            Some(p) => self.fills.swap_remove(p).tainted,
            None => true,
        }
    }

    /// Moves a clean block to the most recently used end of the LRU.
    pub(super) fn touch(&mut self, b: u64) {
        self.tick += 1;
        let t = self.tick;
        if let Some(e) = self.map.get_mut(&b) {
            if let Some(old) = e.tick {
                self.lru.remove(&old);
                e.tick = Some(t);
                self.lru.insert(t, b);
            }
        }
    }

    /// Drops a block, dirty or not.
    pub(super) fn remove(&mut self, b: u64) {
        if let Some(e) = self.map.remove(&b) {
            self.bytes -= e.data.len() as u64;
            if let Some(t) = e.tick {
                self.lru.remove(&t);
            }
            if e.dirty {
                self.dirty_fifo.remove(&e.dirty_seq);
                self.dirty.remove(&b);
                self.dirty_bytes -= e.data.len() as u64;
            }
        }
    }

    /// Inserts (or replaces) a block as clean data read from or written to
    /// the device below.
    pub(super) fn insert_clean(&mut self, b: u64, data: Vec<u8>) {
        self.remove(b);
        self.gen += 1;
        self.tick += 1;
        let (g, t) = (self.gen, self.tick);
        self.lru.insert(t, b);
        self.put(b, Entry::new(data, g, Some(t)));
    }

    /// Inserts a block that is not held yet as new dirty data.
    pub(super) fn insert_dirty(&mut self, b: u64, data: Vec<u8>) {
        debug_assert!(!self.map.contains_key(&b));
        self.put(b, Entry::new(data, 0, None));
        self.mark_dirty(b);
    }

    /// Adds an entry for a block not held and counts its bytes.
    fn put(&mut self, b: u64, e: Entry) {
        self.bytes += e.data.len() as u64;
        self.map.insert(b, e);
    }

    /// Records a change to a held block: a new generation, and dirty (out
    /// of the LRU, into the dirty FIFO) if it was clean.
    pub(super) fn mark_dirty(&mut self, b: u64) {
        self.gen += 1;
        let g = self.gen;
        let Some(e) = self.map.get_mut(&b) else {
            return;
        };
        e.gen = g;
        if !e.dirty {
            e.dirty = true;
            e.dirty_since = Instant::now();
            self.tick += 1;
            e.dirty_seq = self.tick;
            self.dirty_fifo.insert(self.tick, b);
            if let Some(t) = e.tick.take() {
                self.lru.remove(&t);
            }
            self.dirty.insert(b);
            self.dirty_bytes += e.data.len() as u64;
        }
    }

    /// Records that the snapshot of block `b` at generation `g` is on the
    /// device below: the block turns clean if it has not changed since.
    pub(super) fn written_back(&mut self, b: u64, g: u64) {
        let mut clean = false;
        if let Some(en) = self.map.get_mut(&b) {
            en.flushed_gen = en.flushed_gen.max(g);
            clean = en.dirty && en.gen == g;
        }
        if clean {
            self.tick += 1;
            let t = self.tick;
            let en = self.map.get_mut(&b).expect("present");
            en.dirty = false;
            en.tick = Some(t);
            let l = en.data.len() as u64;
            let seq = en.dirty_seq;
            self.dirty_fifo.remove(&seq);
            self.lru.insert(t, b);
            self.dirty.remove(&b);
            self.dirty_bytes -= l;
        }
    }

    /// Drops least recently used clean blocks outside busy ranges while
    /// more than `size` bytes are held. Returns how many were dropped.
    pub(super) fn evict(&mut self, size: u64) -> u64 {
        if self.bytes <= size {
            return 0;
        }
        let mut victims = Vec::new();
        let mut freed = 0;
        let need = self.bytes - size;
        for (_, &b) in self.lru.iter() {
            if freed >= need {
                break;
            }
            if !self.is_busy(b, b + 1) {
                freed += self.map.get(&b).map_or(0, |e| e.data.len() as u64);
                victims.push(b);
            }
        }
        let n = victims.len() as u64;
        for b in victims {
            self.remove(b);
        }
        n
    }

    /// Each dirty block of `[b0, b1)` (all dirty blocks without a range)
    /// with its current generation.
    pub(super) fn dirty_gens(&self, range: Option<(u64, u64)>) -> Vec<BlockGen> {
        let at = |b: &u64| BlockGen {
            block: *b,
            gen: self.map[b].gen,
        };
        match range {
            Some((b0, b1)) => self.dirty.range(b0..b1).map(at).collect(),
            None => self.dirty.iter().map(at).collect(),
        }
    }
}
