//! The write-back stripe buffer (`wb=BYTES`, 0 = off): pieces of stripes
//! that partial, 4 KiB aligned writes leave, held until the stripe can be
//! written whole, so that sequential writes smaller than a stripe become
//! full-stripe writes (no reads, no old parity).
//!
//! A piece is acknowledged once it is here, as a disk's volatile write
//! cache does: it is stable after the next flush (which writes every
//! buffered stripe first). A stripe leaves the buffer through
//! `Inner::write_stripe`, under the stripe's exclusive lock, when it is
//! complete, when its pieces are too many, when the budget needs room
//! (the lowest ready stripe with the ready whole ones after it, as one
//! run, else the oldest one goes), at a flush, after `IDLE` without new pieces, or
//! before a read of it. The buffer holds the writes' own bytes (no copy);
//! at most `wb` bytes of pieces are held, in at most `wb / stripe bytes`
//! stripes.

use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::layout::BLOCK;

/// A data chunk's new bytes in one stripe: (chunk, first column, bytes).
pub type Piece = (usize, u64, Bytes);

/// Whether `pieces` cover columns `[lo, hi)` of chunk `c` (together).
pub(super) fn covers(pieces: &[Piece], c: usize, lo: u64, hi: u64) -> bool {
    // one piece over the whole range (a whole-chunk write's): no list
    let one = |p: &Piece| p.0 == c && p.1 <= lo && p.1 + p.2.len() as u64 >= hi;
    if lo >= hi || pieces.iter().any(one) {
        return true;
    }
    let mut iv: Vec<(u64, u64)> = pieces
        .iter()
        .filter(|p| p.0 == c)
        .map(|p| (p.1, p.1 + p.2.len() as u64))
        .collect();
    iv.sort_unstable();
    let mut at = lo;
    for (a, b) in iv {
        if a > at {
            return false;
        }
        at = at.max(b);
    }
    at >= hi
}

/// Pieces one stripe may gather before it is written (rewrites of the
/// same blocks add pieces).
const MAX_PIECES: usize = 64;
/// A stripe without a new piece for this long is written out.
pub const IDLE: Duration = Duration::from_millis(100);

struct Entry {
    pieces: Vec<Piece>,
    /// 4 KiB blocks of the stripe that some piece covers.
    filled: Vec<u64>,
    nfilled: u64,
    bytes: u64,
    touched: Instant,
    /// Every block of the stripe is covered.
    whole: bool,
}

#[derive(Default)]
struct State {
    map: HashMap<u64, Entry>,
    bytes: u64,
    /// Stripe-lock slots whose holder took buffered pieces out and has not
    /// written them yet (a flush waits for them), with how many.
    busy: HashMap<u64, u32>,
    /// Stripes ready to be written (whole, or too many pieces) that no
    /// writer has claimed yet.
    ready: BTreeSet<u64>,
    /// Background writers running (at most `background_max`).
    background: usize,
}

/// What [`Wb::put`] did.
pub enum Put {
    /// Held; `Some(s)`: stripe `s` is ready to be written now.
    Held(Option<u64>),
    /// Not held, the budget is full: `Some(s)` is the oldest stripe, to
    /// write out before trying again.
    Full(Option<u64>),
}

pub struct Wb {
    budget: u64,
    state: Mutex<State>,
    /// Stripes held (read without the lock, to skip it when empty).
    held: AtomicUsize,
    /// The most background writers (`wb_bg`). Each writes a run of at most
    /// `run` ready stripes at a time (holding their pieces, parity and
    /// one gathered copy of the data, at most 2 x (k+m) x chunk per stripe);
    /// while all run, completed stripes wait here for one of them (within
    /// the budget); with 0 the request that completes a stripe writes it.
    background_max: usize,
}

impl Wb {
    pub fn new(budget: u64, background_max: usize) -> Wb {
        Wb {
            budget,
            state: Mutex::new(State::default()),
            held: AtomicUsize::new(0),
            background_max,
        }
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Whether completed stripes are written by background writers.
    pub fn has_writers(&self) -> bool {
        self.background_max > 0
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `pieces` (4 KiB aligned) of stripe `s` of `k` chunks of `chunk`.
    pub fn put(&self, s: u64, pieces: &[Piece], chunk: u64, k: u64) -> Put {
        let add: u64 = pieces.iter().map(|p| p.2.len() as u64).sum();
        let mut st = self.st();
        // at most budget / stripe bytes stripes: scattered small writes
        // must not pile up more deferred read-modify-writes than that
        let most = (self.budget / (chunk * k)).max(1) as usize;
        let new = !st.map.contains_key(&s);
        if st.bytes + add > self.budget || (new && st.map.len() >= most) {
            let oldest = st
                .map
                .iter()
                .min_by_key(|(_, e)| e.touched)
                .map(|(s, _)| *s);
            return Put::Full(oldest);
        }
        let blocks = chunk * k / BLOCK;
        let e = st.map.entry(s).or_insert_with(|| Entry {
            pieces: Vec::new(),
            filled: vec![0; blocks.div_ceil(64) as usize],
            nfilled: 0,
            bytes: 0,
            touched: Instant::now(),
            whole: false,
        });
        for p in pieces {
            let first = (p.0 as u64 * chunk + p.1) / BLOCK;
            for b in first..first + p.2.len() as u64 / BLOCK {
                let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
                if e.filled[w] & bit == 0 {
                    e.filled[w] |= bit;
                    e.nfilled += 1;
                }
            }
            e.pieces.push(p.clone());
        }
        e.bytes += add;
        e.touched = Instant::now();
        e.whole = e.nfilled == blocks;
        let ready = e.whole || e.pieces.len() >= MAX_PIECES;
        st.bytes += add;
        if ready {
            st.ready.insert(s);
        }
        self.held.store(st.map.len(), Ordering::Release);
        Put::Held(ready.then_some(s))
    }

    /// Takes stripe `s`'s pieces out (oldest first); the caller holds the
    /// stripe's exclusive lock (`slot`), writes them, then calls
    /// [`Wb::written`] if there were any.
    pub fn take(&self, s: u64, slot: u64) -> Vec<Piece> {
        if self.held.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut st = self.st();
        let Some(e) = st.map.remove(&s) else {
            return Vec::new();
        };
        st.bytes -= e.bytes;
        st.ready.remove(&s);
        *st.busy.entry(slot).or_insert(0) += 1;
        self.held.store(st.map.len(), Ordering::Release);
        e.pieces
    }

    /// A stripe is ready: true if the caller is to start a background
    /// writer (fewer than `wb_bg` run), false if one that runs will
    /// take it. Decided under the same lock as [`Wb::next_ready`]'s
    /// exit, so a ready stripe is never left without a writer.
    pub fn start_writer(&self) -> bool {
        let mut st = self.st();
        if st.background < self.background_max {
            st.background += 1;
            true
        } else {
            false
        }
    }

    /// For a background writer: claims the lowest ready stripe, with
    /// whether it is whole; `None` (and the writer is counted out) when
    /// none is ready.
    pub fn next_ready(&self) -> Option<(u64, bool)> {
        let mut st = self.st();
        match st.ready.pop_first() {
            Some(s) => {
                let whole = st.map.get(&s).is_some_and(|e| e.whole);
                Some((s, whole))
            }
            None => {
                st.background -= 1;
                None
            }
        }
    }

    /// For a request that found the buffer full: claims the lowest ready
    /// stripe, with whether it is whole, to write it (and the ready whole
    /// stripes after it) itself, as a background writer would.
    pub fn claim_ready(&self) -> Option<(u64, bool)> {
        let mut st = self.st();
        let s = st.ready.pop_first()?;
        let whole = st.map.get(&s).is_some_and(|e| e.whole);
        Some((s, whole))
    }

    /// Claims stripe `s` if it is ready and whole (to extend a run).
    pub fn claim_whole(&self, s: u64) -> bool {
        let mut st = self.st();
        if st.map.get(&s).is_some_and(|e| e.whole) && st.ready.remove(&s) {
            return true;
        }
        false
    }

    /// The pieces taken from `slot` are written (or given up).
    pub fn written(&self, slot: u64) {
        let mut st = self.st();
        if let Some(n) = st.busy.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                st.busy.remove(&slot);
            }
        }
    }

    /// For a flush, at one instant: the stripes held, and the slots whose
    /// holders are writing buffered pieces taken out earlier.
    pub fn snapshot(&self) -> (Vec<u64>, Vec<u64>) {
        let st = self.st();
        (
            st.map.keys().copied().collect(),
            st.busy.keys().copied().collect(),
        )
    }

    /// Whether stripe `s` has pieces here.
    pub fn has(&self, s: u64) -> bool {
        self.held.load(Ordering::Acquire) != 0 && self.st().map.contains_key(&s)
    }

    /// Stripes without a new piece for `idle`.
    pub fn idle(&self, idle: Duration) -> Vec<u64> {
        if self.held.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        self.st()
            .map
            .iter()
            .filter(|(_, e)| now.duration_since(e.touched) >= idle)
            .map(|(s, _)| *s)
            .collect()
    }
}
