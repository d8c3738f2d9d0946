//! Recycled buffers: the block buffers a cache lets go (evicted, or back
//! from a write) and the run buffers of write-back and read-ahead are kept
//! for the next one instead of going back to the allocator. An aligned
//! allocation costs the allocator a split and a merge of its free chunks,
//! and a fresh one page faults on its first touch (the kernel zeroes each
//! page); a sequential writer takes one block buffer per block and gives
//! one back per eviction, so a few warm buffers serve it.
//!
//! Memory: at most [`RECYCLE_BLOCKS`] block buffers and [`RECYCLE_RUNS`]
//! run buffers of [`super::writeback::WRITE_RUN_MAX`] bytes per mounted
//! file system (1 MiB + 4 MiB at 8 KiB blocks); past that a buffer given
//! back is freed.

use super::writeback::WRITE_RUN_MAX;
use super::Dev;
use crate::buf::{AlignedBuf, ALIGN};

/// Block buffers kept for reuse.
pub const RECYCLE_BLOCKS: usize = 128;

/// Run buffers (up to [`WRITE_RUN_MAX`] bytes) kept for reuse.
pub const RECYCLE_RUNS: usize = 4;

#[derive(Default)]
pub(crate) struct Recycler {
    blocks: Vec<AlignedBuf>,
    runs: Vec<AlignedBuf>,
}

fn cap_of(len: usize) -> usize {
    len.max(1).div_ceil(ALIGN) * ALIGN
}

impl Recycler {
    /// A buffer of `len` bytes for a file system of `bs`-byte blocks: a
    /// kept one (its old bytes in it) or a new one (zeroes). A new run
    /// buffer gets a whole run's room, so that it can be reused for any
    /// run.
    fn take(&mut self, len: usize, bs: usize) -> AlignedBuf {
        let run = len > bs && len <= WRITE_RUN_MAX;
        let kept = if cap_of(len) == cap_of(bs) {
            self.blocks.pop()
        } else if run {
            self.runs.pop()
        } else {
            None
        };
        let mut b = match kept {
            Some(b) => b,
            None if run => AlignedBuf::new(WRITE_RUN_MAX),
            None => return AlignedBuf::new(len),
        };
        b.set_len(len);
        b
    }

    /// Keeps `b` when there is room for one of its size, frees it otherwise.
    fn put(&mut self, b: AlignedBuf, bs: usize) {
        if b.capacity() == cap_of(bs) {
            if self.blocks.len() < RECYCLE_BLOCKS {
                self.blocks.push(b);
            }
        } else if b.capacity() == cap_of(WRITE_RUN_MAX) && self.runs.len() < RECYCLE_RUNS {
            self.runs.push(b);
        }
    }
}

impl Dev {
    /// A buffer of `len` bytes whose contents are left from its last use
    /// (zeroes when new): for a caller that writes every byte of it.
    pub(crate) fn buf(&self, len: usize) -> AlignedBuf {
        self.recycle.borrow_mut().take(len, self.bs)
    }

    /// A zeroed block buffer.
    pub(crate) fn zero_block(&self) -> AlignedBuf {
        let mut b = self.buf(self.bs);
        b.fill(0);
        b
    }

    /// A buffer holding `parts` one after the other (`len` bytes in all,
    /// zeroes after them).
    pub(crate) fn concat<'a>(
        &self,
        parts: impl IntoIterator<Item = &'a [u8]>,
        len: usize,
    ) -> AlignedBuf {
        let mut b = self.buf(len);
        let mut at = 0;
        for p in parts {
            let n = p.len().min(len - at);
            b[at..at + n].copy_from_slice(&p[..n]);
            at += n;
        }
        b[at..].fill(0);
        b
    }

    /// Gives a buffer back for reuse (freed when the pool is full or the
    /// buffer is of another size).
    pub(crate) fn recycle(&self, b: AlignedBuf) {
        self.recycle.borrow_mut().put(b, self.bs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_within_the_bound() {
        let bs = 8192;
        let mut r = Recycler::default();
        let mut b = r.take(bs, bs);
        assert!(b.iter().all(|&x| x == 0), "a new buffer is zeroed");
        b.fill(7);
        let p = b.as_ptr();
        r.put(b, bs);
        let again = r.take(bs, bs);
        assert_eq!(
            again.as_ptr(),
            p,
            "the buffer given back is the next one taken"
        );
        assert_eq!(again[0], 7, "with its old bytes");
        // A run buffer has a whole run's room and serves any run length.
        let run = r.take(3 * bs, bs);
        assert_eq!((run.len(), run.capacity()), (3 * bs, WRITE_RUN_MAX));
        let p = run.as_ptr();
        r.put(run, bs);
        let run2 = r.take(5 * bs, bs);
        assert_eq!((run2.as_ptr(), run2.len()), (p, 5 * bs));
        // Bounded: past the bound, buffers given back are freed.
        for _ in 0..RECYCLE_BLOCKS + 10 {
            r.put(AlignedBuf::new(bs), bs);
        }
        for _ in 0..RECYCLE_RUNS + 3 {
            r.put(AlignedBuf::new(WRITE_RUN_MAX), bs);
        }
        assert_eq!(
            (r.blocks.len(), r.runs.len()),
            (RECYCLE_BLOCKS, RECYCLE_RUNS)
        );
        // Other sizes are not kept.
        r.blocks.clear();
        r.put(AlignedBuf::new(3 * bs), bs);
        r.put(AlignedBuf::new(bs / 2), bs);
        assert_eq!(r.blocks.len(), 0);
    }
}
