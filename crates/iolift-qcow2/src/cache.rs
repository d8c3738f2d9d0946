//! One data path's mapping cache: guest cluster -> [`Mapping`], bounded
//! by an entry budget, least recently used out first, with counters.
//!
//! Entries are pinned while a request does I/O with their mapping. The
//! rules that make a stale read impossible:
//!
//! - Only the control plane inserts ([`MappingCache::insert_pinned`]),
//!   under its own lock, and the entry comes back already pinned, so no
//!   change can slip between the translation and the I/O.
//! - A hit pins under this cache's lock ([`MappingCache::get_pinned`]).
//! - [`MappingCache::invalidate`] removes the entry (no new pin can then
//!   find it) and waits until its pins are gone (the I/O in flight on the
//!   old mapping has completed) before it returns; the control plane
//!   changes the mapping only after that.
//! - Eviction takes only unpinned entries, so the control plane's record
//!   of who holds what never forgets an entry with I/O in flight. While
//!   every entry is pinned the cache may exceed its budget by the number
//!   of requests in flight.

use crate::mapping::Mapping;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

const NIL: usize = usize::MAX;

pub struct Entry {
    pub mapping: Mapping,
    pins: AtomicU32,
    revoked: AtomicBool,
}

/// A pinned mapping; dropping it unpins (and wakes an invalidation
/// waiting for it).
pub struct Pinned<'a> {
    entry: Arc<Entry>,
    cache: &'a MappingCache,
}

impl Pinned<'_> {
    pub fn mapping(&self) -> Mapping {
        self.entry.mapping
    }

    /// Ends the borrow of the cache but keeps the pin: the entry, to be
    /// released with [`MappingCache::unpin`] on the same cache (for I/O
    /// that completes on another thread).
    pub(crate) fn detach(self) -> Arc<Entry> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so its `entry` is moved out once.
        unsafe { std::ptr::read(&me.entry) }
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.cache.unpin(&self.entry);
    }
}

struct Node {
    key: u64,
    entry: Arc<Entry>,
    prev: usize,
    next: usize,
}

/// Slab-backed LRU list: `head` most recent.
#[derive(Default)]
struct Lru {
    map: HashMap<u64, usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
}

impl Lru {
    fn new() -> Lru {
        Lru {
            head: NIL,
            tail: NIL,
            ..Default::default()
        }
    }

    fn unlink(&mut self, i: usize) {
        let (p, n) = (self.nodes[i].prev, self.nodes[i].next);
        if p == NIL {
            self.head = n;
        } else {
            self.nodes[p].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.nodes[n].prev = p;
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn remove(&mut self, key: u64) -> Option<Arc<Entry>> {
        let i = self.map.remove(&key)?;
        self.unlink(i);
        self.free.push(i);
        // The slot keeps its Arc until reused: the slab is bounded by the
        // most entries ever held at once.
        Some(self.nodes[i].entry.clone())
    }
}

#[derive(Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub inserts: AtomicU64,
    pub evictions: AtomicU64,
    pub invalidations: AtomicU64,
}

pub struct MappingCache {
    lru: Mutex<Lru>,
    budget: AtomicU64,
    pub stats: CacheStats,
    drain: Mutex<()>,
    drained: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these structures half-changed in a
    // way that matters more than stopping would; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MappingCache {
    pub fn new(budget: u64) -> MappingCache {
        MappingCache {
            lru: Mutex::new(Lru::new()),
            budget: AtomicU64::new(budget.max(1)),
            stats: CacheStats::default(),
            drain: Mutex::new(()),
            drained: Condvar::new(),
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.lru).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn budget(&self) -> u64 {
        self.budget.load(Relaxed)
    }

    /// A hit: the mapping, pinned. Counts a hit or a miss.
    pub fn get_pinned(&self, key: u64) -> Option<Pinned<'_>> {
        self.lookup(key, true)
    }

    /// [`Self::get_pinned`] that counts no miss when `key` is absent
    /// (the caller then looks again through a path that counts it).
    pub(crate) fn peek_pinned(&self, key: u64) -> Option<Pinned<'_>> {
        self.lookup(key, false)
    }

    /// Releases a pin taken by [`Pinned::detach`], waking an invalidation
    /// waiting for it.
    pub(crate) fn unpin(&self, entry: &Entry) {
        if entry.pins.fetch_sub(1, SeqCst) == 1 && entry.revoked.load(SeqCst) {
            let _g = lock(&self.drain);
            self.drained.notify_all();
        }
    }

    fn lookup(&self, key: u64, count_miss: bool) -> Option<Pinned<'_>> {
        let mut l = lock(&self.lru);
        let Some(&i) = l.map.get(&key) else {
            if count_miss {
                self.stats.misses.fetch_add(1, Relaxed);
            }
            return None;
        };
        l.unlink(i);
        l.push_front(i);
        let entry = l.nodes[i].entry.clone();
        entry.pins.fetch_add(1, SeqCst);
        self.stats.hits.fetch_add(1, Relaxed);
        Some(Pinned { entry, cache: self })
    }

    /// Inserts (or finds: the control plane's mappings for one key are
    /// the same until it invalidates) and pins; returns the keys evicted
    /// to stay within the budget. Call only from the control plane, under
    /// its lock.
    pub fn insert_pinned(&self, key: u64, mapping: Mapping) -> (Pinned<'_>, Vec<u64>) {
        let mut l = lock(&self.lru);
        if let Some(&i) = l.map.get(&key) {
            let entry = l.nodes[i].entry.clone();
            entry.pins.fetch_add(1, SeqCst);
            return (Pinned { entry, cache: self }, Vec::new());
        }
        let entry = Arc::new(Entry {
            mapping,
            pins: AtomicU32::new(1),
            revoked: AtomicBool::new(false),
        });
        let node = Node {
            key,
            entry: entry.clone(),
            prev: NIL,
            next: NIL,
        };
        let i = match l.free.pop() {
            Some(i) => {
                l.nodes[i] = node;
                i
            }
            None => {
                l.nodes.push(node);
                l.nodes.len() - 1
            }
        };
        l.map.insert(key, i);
        l.push_front(i);
        self.stats.inserts.fetch_add(1, Relaxed);
        let evicted = self.evict(&mut l);
        (Pinned { entry, cache: self }, evicted)
    }

    /// Evicts unpinned entries from the cold end until within budget.
    fn evict(&self, l: &mut Lru) -> Vec<u64> {
        let budget = self.budget() as usize;
        let mut out = Vec::new();
        let mut i = l.tail;
        while l.map.len() > budget && i != NIL {
            let prev = l.nodes[i].prev;
            if l.nodes[i].entry.pins.load(SeqCst) == 0 {
                let key = l.nodes[i].key;
                l.remove(key);
                out.push(key);
            }
            i = prev;
        }
        self.stats.evictions.fetch_add(out.len() as u64, Relaxed);
        out
    }

    /// Changes the budget; returns the keys evicted.
    pub fn resize(&self, budget: u64) -> Vec<u64> {
        self.budget.store(budget.max(1), Relaxed);
        let mut l = lock(&self.lru);
        self.evict(&mut l)
    }

    /// Drops `key` and waits until no I/O uses its old mapping. Call
    /// only from the control plane, never while holding a pin.
    pub fn invalidate(&self, key: u64) {
        let Some(entry) = lock(&self.lru).remove(key) else {
            return;
        };
        self.stats.invalidations.fetch_add(1, Relaxed);
        entry.revoked.store(true, SeqCst);
        let mut g = lock(&self.drain);
        while entry.pins.load(SeqCst) > 0 {
            g = self
                .drained
                .wait_timeout(g, Duration::from_millis(10))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(h: u64) -> Mapping {
        Mapping::Data {
            host: h,
            writable: true,
        }
    }

    #[test]
    fn lru_order_budget_and_counters() {
        let c = MappingCache::new(2);
        drop(c.insert_pinned(1, data(10)).0);
        drop(c.insert_pinned(2, data(20)).0);
        assert!(c.get_pinned(1).is_some()); // 1 is now the most recent
        let (p, ev) = c.insert_pinned(3, data(30));
        drop(p);
        assert_eq!(ev, vec![2]);
        assert!(c.get_pinned(2).is_none());
        assert_eq!(c.get_pinned(3).unwrap().mapping(), data(30));
        assert_eq!(c.stats.hits.load(Relaxed), 2);
        assert_eq!(c.stats.misses.load(Relaxed), 1);
        assert_eq!(c.stats.evictions.load(Relaxed), 1);
        assert_eq!(c.resize(1), vec![1]);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn pinned_entries_are_not_evicted() {
        let c = MappingCache::new(1);
        let (p1, _) = c.insert_pinned(1, data(10));
        let (p2, ev) = c.insert_pinned(2, data(20));
        assert!(ev.is_empty(), "evicted a pinned entry: {ev:?}");
        assert_eq!(c.len(), 2);
        drop(p1);
        drop(p2);
        let (_p3, ev) = c.insert_pinned(3, data(30));
        assert_eq!(ev.len(), 2);
    }

    #[test]
    fn invalidate_waits_for_the_pin() {
        let c = Arc::new(MappingCache::new(4));
        let (p, _) = c.insert_pinned(5, data(50));
        let entry = p.entry.clone();
        std::mem::forget(p);
        let c2 = c.clone();
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let t = std::thread::spawn(move || {
            c2.invalidate(5);
            d2.store(true, SeqCst);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(SeqCst), "invalidate returned with a pin held");
        assert!(c.get_pinned(5).is_none(), "a new pin found a revoked entry");
        drop(Pinned { entry, cache: &c });
        t.join().unwrap();
        assert!(done.load(SeqCst));
        assert_eq!(c.stats.invalidations.load(Relaxed), 1);
    }

    #[test]
    fn a_detached_pin_holds_until_unpinned() {
        let c = Arc::new(MappingCache::new(4));
        drop(c.insert_pinned(7, data(70)).0);
        let before = c.stats.misses.load(Relaxed);
        assert!(c.peek_pinned(8).is_none());
        assert_eq!(c.stats.misses.load(Relaxed), before, "peek counted a miss");
        let entry = c.peek_pinned(7).unwrap().detach();
        let c2 = c.clone();
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let t = std::thread::spawn(move || {
            c2.invalidate(7);
            d2.store(true, SeqCst);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !done.load(SeqCst),
            "invalidate returned with a detached pin held"
        );
        c.unpin(&entry);
        t.join().unwrap();
        assert!(done.load(SeqCst));
    }
}
