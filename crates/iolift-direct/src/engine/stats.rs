//! Counters of the engine's work, kept with relaxed atomics (one add per
//! request or batch) and read as a [`Stats`] snapshot.

use super::{Callback, Op};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the engine's work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests completed.
    pub ops: u64,
    /// `io_uring_enter` calls (submit and/or wait) made by the engine thread.
    pub enters: u64,
    /// The most requests put into the ring by one submission.
    pub max_batch: u64,
    /// Device flushes asked for with [`super::Engine::flush`].
    pub flushes: u64,
    /// Read requests submitted, and the bytes they asked for.
    pub reads: u64,
    pub read_bytes: u64,
    /// Write requests submitted, and the bytes they carried.
    pub writes: u64,
    pub written_bytes: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub ops: AtomicU64,
    pub enters: AtomicU64,
    pub max_batch: AtomicU64,
    pub flushes: AtomicU64,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    written_bytes: AtomicU64,
}

impl Counters {
    /// Counts the reads and writes of a batch being submitted.
    pub fn submitted(&self, ops: &[(Op, Callback)]) {
        let (mut r, mut rb, mut w, mut wb) = (0, 0, 0, 0);
        for (op, _) in ops {
            match op {
                Op::Read { buf, .. } => (r, rb) = (r + 1, rb + buf.len() as u64),
                Op::Write { buf, .. } => (w, wb) = (w + 1, wb + buf.len() as u64),
                Op::Flush => {}
            }
        }
        for (c, v) in [
            (&self.reads, r),
            (&self.read_bytes, rb),
            (&self.writes, w),
            (&self.written_bytes, wb),
        ] {
            if v > 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    pub fn snapshot(&self) -> Stats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            ops: l(&self.ops),
            enters: l(&self.enters),
            max_batch: l(&self.max_batch),
            flushes: l(&self.flushes),
            reads: l(&self.reads),
            read_bytes: l(&self.read_bytes),
            writes: l(&self.writes),
            written_bytes: l(&self.written_bytes),
        }
    }
}
