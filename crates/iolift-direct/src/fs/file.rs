//! Open files: reads, writes through the per-file cache, soft and hard
//! syncs, close.

use super::cache::Cache;
use super::layout::*;
use super::{File, Fs, CACHE_SHARE_MIN, READ_AHEAD_MAX};
use crate::buf::AlignedBuf;
use std::io;

impl Fs {
    /// Opens a file.
    pub fn open(&self, path: &str) -> io::Result<File> {
        let ino = self.lookup(path)?;
        let inode = self.inode(ino)?;
        if inode.kind != KIND_FILE {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{path}: not a file"),
            ));
        }
        Ok(File {
            ino,
            trusted: inode.size,
            inode,
            cache: Cache::counted(self.cache_blocks, self.cache_total.clone()),
            inode_dirty: false,
            written_past: std::collections::HashSet::new(),
            ra_next: u64::MAX,
            behind: 0,
            behind_next: 0,
        })
    }

    /// Reads at `off` into `buf`; returns the bytes read (0 at the end).
    pub fn read(&mut self, f: &mut File, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        if off >= f.inode.size {
            return Ok(0);
        }
        let n = buf.len().min((f.inode.size - off) as usize);
        let bs = self.dev.bs as u64;
        let mut done = 0;
        while done < n {
            let pos = off + done as u64;
            let (fb, at) = (pos / bs, (pos % bs) as usize);
            let k = (bs as usize - at).min(n - done);
            let blk = self.cached_block(f, fb)?;
            buf[done..done + k].copy_from_slice(&blk[at..at + k]);
            done += k;
        }
        Ok(n)
    }

    /// Writes `data` at `off` into the file's cache (read-modify-write of
    /// partial blocks); it reaches the disk on eviction or sync.
    pub fn write(&mut self, f: &mut File, off: u64, data: &[u8]) -> io::Result<()> {
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= self.sb.max_file_size())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::FileTooLarge, "write past the largest file")
            })?;
        let bs = self.dev.bs as u64;
        let mut done = 0;
        while done < data.len() {
            let pos = off + done as u64;
            let (fb, at) = (pos / bs, (pos % bs) as usize);
            let k = (bs as usize - at).min(data.len() - done);
            let whole = at == 0 && k == bs as usize;
            if whole && !f.cache.contains(fb) {
                self.make_room(f)?;
                // Every byte is written below.
                f.cache.insert(fb, self.dev.buf(bs as usize));
            } else {
                self.cached_block(f, fb)?;
            }
            let blk = f.cache.get_mut(fb).expect("block just cached");
            blk[at..at + k].copy_from_slice(&data[done..done + k]);
            f.cache.mark_dirty(fb);
            done += k;
        }
        if end > f.inode.size {
            f.inode.size = end;
            f.inode_dirty = true;
        }
        if f.behind > 0 {
            self.write_behind(f, end)?;
        }
        Ok(())
    }

    /// The cached block `fb` of `f`, read in (or zero for a hole or past
    /// the end) when missing. Bytes past the size at open read as zero
    /// unless their block was written back since (see [`File`]).
    pub(super) fn cached_block<'f>(
        &mut self,
        f: &'f mut File,
        fb: u64,
    ) -> io::Result<&'f mut AlignedBuf> {
        if !f.cache.contains(fb) {
            let sequential = f.ra_next == fb;
            if sequential && self.read_ahead(f, fb)? {
                return Ok(f.cache.get_mut(fb).expect("block just cached"));
            }
            f.ra_next = fb + 1;
            self.make_room(f)?;
            let bs = self.dev.bs as u64;
            let ours = f.written_past.contains(&fb);
            // A block whose disk copy holds bytes that are not the file's
            // is cached zeroed there and dirty, so the zeroes reach the
            // disk before a larger size does.
            let (data, stale) = match self.bmap(&f.inode, fb)? {
                Some(_) if !ours && fb * bs >= f.trusted => (self.dev.zero_block(), true),
                Some(phys) => {
                    let mut b = self.dev.read(phys)?;
                    let stale = !ours && fb == f.trusted / bs;
                    if stale {
                        b[(f.trusted % bs) as usize..].fill(0);
                    }
                    (b, stale)
                }
                None => (self.dev.zero_block(), false),
            };
            f.cache.insert(fb, data);
            if stale {
                f.cache.mark_dirty(fb);
            }
        }
        Ok(f.cache.get_mut(fb).expect("block just cached"))
    }

    /// On a miss right after the previous one (a sequential reader): reads
    /// `fb` and the blocks after it that are stored right after it on the
    /// disk, up to half the cache (at most [`READ_AHEAD_MAX`]), with one
    /// request. Only blocks whose disk copy is the file's (below the size
    /// at open, or written back since) and not cached are read. Returns
    /// false (nothing done) when fewer than two blocks qualify.
    fn read_ahead(&mut self, f: &mut File, fb: u64) -> io::Result<bool> {
        let mut want = (f.cache.cap() / 2).min(READ_AHEAD_MAX) as u64;
        if self.over_budget(f) {
            // Every block read ahead would evict one of the file's own.
            want = want.min(f.cache.len() as u64 / 2);
        } else if self.cached_blocks() >= self.cache_budget {
            // Within its minimum share only.
            want = want.min((CACHE_SHARE_MIN - f.cache.len()) as u64);
        }
        if want < 2 {
            return Ok(false);
        }
        let bs = self.dev.bs as u64;
        let readable = |f: &File, b: u64| {
            !f.cache.contains(b) && ((b + 1) * bs <= f.trusted || f.written_past.contains(&b))
        };
        if !readable(f, fb) {
            return Ok(false);
        }
        let Some(first) = self.bmap(&f.inode, fb)? else {
            return Ok(false);
        };
        let mut n = 1;
        while n < want && readable(f, fb + n) && self.bmap(&f.inode, fb + n)? == Some(first + n) {
            n += 1;
        }
        if n < 2 {
            return Ok(false);
        }
        let run = self.dev.read_run(first, n as usize)?;
        // Last block first: `fb` ends up the most recently used, so no
        // eviction for a later one can take it.
        for (i, chunk) in run.chunks_exact(bs as usize).enumerate().rev() {
            self.make_room(f)?;
            let b = self.dev.concat([chunk], bs as usize);
            f.cache.insert(fb + i as u64, b);
        }
        self.dev.recycle(run);
        f.ra_next = fb + n;
        Ok(true)
    }

    /// Evicts one block when the cache is full, or when the file system's
    /// cache budget is spent and the file has a block. When that block is
    /// dirty, every dirty block of the file is written back first (started,
    /// not waited for) and stays cached, clean.
    pub(super) fn make_room(&mut self, f: &mut File) -> io::Result<()> {
        let victim = if self.over_budget(f) || f.cache.len() >= f.cache.cap() {
            f.cache.lru()
        } else {
            None
        };
        if let Some((fb, dirty)) = victim {
            if dirty {
                let batch = f.cache.dirty_blocks();
                self.write_back_batch(f, batch, false)?;
            }
            if let Some((data, _)) = f.cache.remove(fb) {
                self.dev.recycle(data);
            }
        }
        Ok(())
    }

    /// All caches together are at the budget and `f` holds at least its
    /// minimum share: it must evict one of its own blocks for a new one.
    fn over_budget(&self, f: &File) -> bool {
        self.cached_blocks() >= self.cache_budget && f.cache.len() >= CACHE_SHARE_MIN
    }

    /// Soft sync: writes back every dirty block, then the inode (rule 5).
    /// When the size grew, blocks between the old and the new size that
    /// hold bytes left by an unsynced write are zeroed on disk first.
    pub fn sync_soft(&mut self, f: &mut File) -> io::Result<()> {
        if f.inode.size > f.trusted {
            let bs = self.dev.bs as u64;
            for fb in f.trusted / bs..=(f.inode.size - 1) / bs {
                if !f.written_past.contains(&fb)
                    && !f.cache.contains(fb)
                    && self.bmap(&f.inode, fb)?.is_some()
                {
                    self.cached_block(f, fb)?;
                }
            }
        }
        let batch = f.cache.dirty_blocks();
        self.write_back_batch(f, batch, true)?;
        if f.inode_dirty {
            self.put_inode(f.ino, &f.inode)?;
            f.inode_dirty = false;
        }
        f.trusted = f.inode.size;
        f.written_past.clear();
        Ok(())
    }

    /// Hard sync: soft sync, then a device flush.
    pub fn sync_hard(&mut self, f: &mut File) -> io::Result<()> {
        self.sync_soft(f)?;
        self.dev.flush()
    }

    /// Closes a file: soft sync.
    pub fn close(&mut self, mut f: File) -> io::Result<()> {
        self.sync_soft(&mut f)
    }
}
