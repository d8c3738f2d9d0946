//! Batched write-back: a file's dirty blocks reach the disk together, in
//! the crash order of the module above. New blocks are allocated in one
//! pass over the bitmap; each bitmap block that marks them used is written
//! once, in the same batch of requests as the data blocks, and that batch
//! is waited for (or, for a cache making room, started: inflight.rs)
//! before anything points to them (rules 1 and 2);
//! then the pointers: the indirect blocks they change are updated in
//! memory and each written once, the blocks a double-indirect block points
//! to before it (rule 2); the inode follows at the sync (rule 5).

use super::layout::*;
use super::{File, Fs, IND_CACHE_BLOCKS};
use crate::buf::{AlignedBuf, Buf};
use crate::engine::Op;
use std::io;

impl Fs {
    /// Writes the cached blocks `blocks` (file block numbers) of `f`,
    /// copied straight from its cache into the requests' buffers (one copy
    /// per block); they are clean from then on. With `wait` false (a cache
    /// making room) the data is only started and the pointer blocks
    /// written once it is on the disk (inflight.rs).
    pub(super) fn write_back_batch(
        &mut self,
        f: &mut File,
        blocks: Vec<u64>,
        wait: bool,
    ) -> io::Result<()> {
        let bs = self.dev.bs as u64;
        let mut writes = Vec::with_capacity(blocks.len());
        let mut new = Vec::new();
        for fb in blocks {
            if (fb + 1) * bs > f.trusted {
                f.written_past.insert(fb);
            }
            match self.bmap(&f.inode, fb)? {
                Some(phys) => writes.push((phys, fb)),
                None => new.push(fb),
            }
        }
        // The bitmap blocks marking them used go in the same batch as the
        // data: the pointers to them are written only once the whole
        // batch is on the disk (rule 1 holds), one wait fewer.
        let (phys, bitmap) = self.alloc_blocks_unwritten(new.len())?;
        let mut ptrs = Vec::with_capacity(new.len());
        for (fb, p) in new.into_iter().zip(phys) {
            writes.push((p, fb));
            ptrs.push((fb, p));
        }
        let mut runs = {
            let cache = &f.cache;
            let data = |fb: u64| &cache.peek(fb).expect("dirty block cached")[..];
            self.dev
                .runs_of(writes.iter().map(|&(p, fb)| (p, data(fb))).collect())
        };
        runs.extend(self.dev.runs(bitmap));
        for &(_, fb) in &writes {
            f.cache.mark_clean(fb);
        }
        if wait {
            self.dev.settle()?;
            self.dev.write_runs(runs)?;
        } else {
            self.dev.start_runs(runs)?;
        }
        if !ptrs.is_empty() {
            let mut n = f.inode.clone();
            self.ind_defer = Some(Vec::new());
            let r = ptrs
                .iter()
                .try_for_each(|&(fb, p)| self.set_ptr(&mut n, fb, p));
            let pending = self.ind_defer.take().unwrap_or_default();
            if let Err(e) = r {
                for b in &pending {
                    self.ind_cache.get_mut().remove(b);
                }
                return Err(e);
            }
            if wait {
                self.write_pending(&n, pending)?;
            } else {
                let groups = self.pending_copies(&n, pending);
                self.dev.after_started(groups)?;
            }
            f.inode = n;
            f.inode_dirty = true;
        }
        Ok(())
    }

    /// Copies of the indirect blocks changed in memory, in the order to
    /// write them: the double-indirect block of `n` in a second group,
    /// after the blocks it points to.
    fn pending_copies(&self, n: &Inode, pending: Vec<u64>) -> Vec<Vec<(u64, AlignedBuf)>> {
        let c = self.ind_cache.borrow();
        let copy = |b: u64| {
            let a = AlignedBuf::copy_of(&c[&b]);
            (b, a)
        };
        let (top, rest): (Vec<u64>, Vec<u64>) =
            pending.into_iter().partition(|&b| b == n.dindirect);
        vec![
            rest.into_iter().map(copy).collect(),
            top.into_iter().map(copy).collect(),
        ]
    }

    /// Writes the indirect blocks changed in memory: the double-indirect
    /// block of `n` last, after the blocks it points to.
    fn write_pending(&mut self, n: &Inode, pending: Vec<u64>) -> io::Result<()> {
        let copy = |fs: &Self, b: u64| {
            let c = fs.ind_cache.borrow();
            let a = AlignedBuf::copy_of(&c[&b]);
            (b, a)
        };
        let (top, rest): (Vec<u64>, Vec<u64>) =
            pending.into_iter().partition(|&b| b == n.dindirect);
        let first: Vec<_> = rest.iter().map(|&b| copy(self, b)).collect();
        let second: Vec<_> = top.iter().map(|&b| copy(self, b)).collect();
        let r = self
            .dev
            .write_many(first)
            .and_then(|_| self.dev.write_many(second));
        if r.is_err() {
            // What the disk holds is not known: read it again next time.
            let c = self.ind_cache.get_mut();
            for b in rest.iter().chain(&top) {
                c.remove(b);
            }
        }
        r
    }

    /// Allocates `n` data blocks in memory and returns them with copies of
    /// the bitmap blocks that mark them used, for the caller to write
    /// before anything points to them (rule 1). Next fit, as
    /// [`Fs::alloc_block`].
    fn alloc_blocks_unwritten(&mut self, n: usize) -> io::Result<(Vec<u64>, Vec<BlockWrite>)> {
        if n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let (start, end) = (self.sb.data_start as u64, self.sb.blocks);
        let from = self.alloc_next.clamp(start, end);
        let got: Vec<u64> = (from..end)
            .chain(start..from)
            .filter(|&b| !self.is_used(b))
            .take(n)
            .collect();
        if got.len() < n {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "file system full",
            ));
        }
        let per_bitmap_block = self.dev.bs as u64 * 8;
        let mut touched: Vec<u64> = Vec::new();
        for &b in &got {
            self.bitmap[(b / 8) as usize] |= 1 << (b % 8);
            let blk = b / per_bitmap_block;
            if !touched.contains(&blk) {
                touched.push(blk);
            }
        }
        let mut writes = Vec::with_capacity(touched.len());
        for blk in touched {
            let at = blk as usize * self.dev.bs;
            let a = AlignedBuf::copy_of(&self.bitmap[at..at + self.dev.bs]);
            writes.push((self.sb.bitmap_start as u64 + blk, a));
        }
        self.alloc_next = got.last().unwrap() + 1;
        Ok((got, writes))
    }

    /// Puts an indirect block into the cache, making room among the
    /// blocks that are not waiting to be written.
    pub(super) fn ind_cache_put(&mut self, blk: u64, data: AlignedBuf) {
        let pending = self.ind_defer.clone().unwrap_or_default();
        let c = self.ind_cache.get_mut();
        if c.len() >= IND_CACHE_BLOCKS && !c.contains_key(&blk) {
            c.retain(|b, _| pending.contains(b));
        }
        c.insert(blk, data);
    }
}

/// A whole block to write: disk block, contents.
type BlockWrite = (u64, AlignedBuf);

/// The most bytes one write-back request carries: blocks that follow each
/// other on the disk are copied into one buffer of up to this size and
/// written with one request (a table or log written back is a few large
/// sequential writes, not one request per block).
pub const WRITE_RUN_MAX: usize = 1 << 20;

/// A run's first block, its length in blocks, and where its write's
/// completion arrives.
pub(super) type RunWait = (u64, usize, crate::slot::Pending<crate::engine::Done>);

impl super::Dev {
    /// Writes whole blocks in one batch of requests and waits for all;
    /// blocks that are consecutive on the disk share a request of up to
    /// [`WRITE_RUN_MAX`] bytes.
    pub fn write_many(&self, blocks: Vec<(u64, AlignedBuf)>) -> io::Result<()> {
        self.settle()?;
        self.write_runs(self.runs(blocks))
    }

    /// Groups borrowed blocks (disk block, bytes) into runs of consecutive
    /// blocks, each copied into one buffer of at most [`WRITE_RUN_MAX`]
    /// bytes (first block, blocks, buffer).
    pub(super) fn runs_of(&self, mut blocks: Vec<(u64, &[u8])>) -> Vec<(u64, usize, AlignedBuf)> {
        blocks.sort_by_key(|(b, _)| *b);
        let per = (WRITE_RUN_MAX / self.bs).max(1);
        let mut runs = Vec::new();
        let mut at = 0;
        while at < blocks.len() {
            let first = blocks[at].0;
            let mut n = 1;
            while n < per && at + n < blocks.len() && blocks[at + n].0 == first + n as u64 {
                n += 1;
            }
            let parts = blocks[at..at + n].iter().map(|(_, d)| &d[..self.bs]);
            runs.push((first, n, self.concat(parts, n * self.bs)));
            at += n;
        }
        runs
    }

    /// Groups blocks into runs of consecutive blocks (first block, blocks,
    /// one buffer), each at most [`WRITE_RUN_MAX`] bytes.
    pub(super) fn runs(&self, mut blocks: Vec<(u64, AlignedBuf)>) -> Vec<(u64, usize, AlignedBuf)> {
        blocks.sort_by_key(|(b, _)| *b);
        let per = (WRITE_RUN_MAX / self.bs).max(1);
        let mut runs = Vec::new();
        let mut it = blocks.into_iter().peekable();
        while let Some((first, data)) = it.next() {
            let mut run = vec![data];
            while run.len() < per
                && it
                    .peek()
                    .is_some_and(|(b, _)| *b == first + run.len() as u64)
            {
                run.push(it.next().expect("peeked").1);
            }
            let n = run.len();
            let buf = if n == 1 {
                run.pop().expect("one block")
            } else {
                let b = self.concat(run.iter().map(|d| &d[..self.bs]), n * self.bs);
                run.into_iter().for_each(|d| self.recycle(d));
                b
            };
            runs.push((first, n, buf));
        }
        runs
    }

    /// One write request per run, and for each run (first block, blocks,
    /// where its completion arrives).
    pub(super) fn run_writes(
        &self,
        runs: Vec<(u64, usize, AlignedBuf)>,
    ) -> (Vec<(Op, crate::engine::Callback)>, Vec<RunWait>) {
        let mut waits = Vec::with_capacity(runs.len());
        let mut ops = Vec::with_capacity(runs.len());
        for (b, n, data) in runs {
            let (tx, rx) = crate::slot::pair::<crate::engine::Done>();
            ops.push((
                Op::Write {
                    offset: b * self.bs as u64,
                    buf: Buf::Aligned(data),
                },
                Box::new(move |d| tx.set(d)) as crate::engine::Callback,
            ));
            waits.push((b, n, rx));
        }
        (ops, waits)
    }

    /// Writes runs in one batch of requests and waits for all.
    pub(super) fn write_runs(&self, runs: Vec<(u64, usize, AlignedBuf)>) -> io::Result<()> {
        let (ops, waits) = self.run_writes(runs);
        self.eng.submit_batch(ops);
        self.check(waits)
    }
}
