//! Inodes, the block bitmap and block maps: reading and writing inodes,
//! allocating blocks, and following or setting a file's direct, indirect
//! and double-indirect pointers.

use super::layout::*;
use super::{Fs, IND_CACHE_BLOCKS};
use crate::buf::AlignedBuf;
use std::io;

impl Fs {
    pub(crate) fn inode(&self, ino: u32) -> io::Result<Inode> {
        if ino == 0 || ino >= self.sb.inodes {
            return Err(corrupt(format!("inode {ino} out of range")));
        }
        let at = ino as usize * INODE_SIZE;
        Inode::decode(&self.itable[at..at + INODE_SIZE], ino, &self.sb)
    }

    /// Writes inode `ino` (its inode-table block).
    pub(crate) fn put_inode(&mut self, ino: u32, n: &Inode) -> io::Result<()> {
        let at = ino as usize * INODE_SIZE;
        self.itable[at..at + INODE_SIZE].copy_from_slice(&n.encode());
        let blk = at / self.dev.bs;
        let data = &self.itable[blk * self.dev.bs..(blk + 1) * self.dev.bs];
        self.dev
            .write_bytes(self.sb.itable_start as u64 + blk as u64, data)
    }

    pub(crate) fn is_used(&self, b: u64) -> bool {
        self.bitmap[(b / 8) as usize] & (1 << (b % 8)) != 0
    }

    pub(crate) fn put_bitmap_bit(&mut self, b: u64, used: bool) -> io::Result<()> {
        let (i, m) = ((b / 8) as usize, 1u8 << (b % 8));
        if used {
            self.bitmap[i] |= m;
        } else {
            self.bitmap[i] &= !m;
            self.ind_cache.get_mut().remove(&b);
            self.dir_cache.get_mut().remove(&b);
        }
        let blk = i / self.dev.bs;
        let data = &self.bitmap[blk * self.dev.bs..(blk + 1) * self.dev.bs];
        self.dev
            .write_bytes(self.sb.bitmap_start as u64 + blk as u64, data)
    }

    /// Marks `blocks` free: in memory, then on disk with each bitmap block
    /// written once (one batch of requests), not once per block.
    pub(crate) fn free_blocks(&mut self, blocks: &[u64]) -> io::Result<()> {
        let per_bitmap_block = self.dev.bs as u64 * 8;
        let mut touched: Vec<u64> = Vec::new();
        for &b in blocks {
            self.bitmap[(b / 8) as usize] &= !(1u8 << (b % 8));
            self.ind_cache.get_mut().remove(&b);
            self.dir_cache.get_mut().remove(&b);
            let blk = b / per_bitmap_block;
            if !touched.contains(&blk) {
                touched.push(blk);
            }
        }
        let writes = touched
            .into_iter()
            .map(|blk| {
                let at = blk as usize * self.dev.bs;
                let a = AlignedBuf::copy_of(&self.bitmap[at..at + self.dev.bs]);
                (self.sb.bitmap_start as u64 + blk, a)
            })
            .collect();
        self.dev.write_many(writes)
    }

    /// Allocates a data block: marked used on disk before it is returned
    /// (rule 1).
    /// The search starts where the last one ended (next fit) and wraps
    /// around once.
    pub(super) fn alloc_block(&mut self) -> io::Result<u64> {
        let (start, end) = (self.sb.data_start as u64, self.sb.blocks);
        let from = self.alloc_next.clamp(start, end);
        let b = (from..end)
            .chain(start..from)
            .find(|&b| !self.is_used(b))
            .ok_or_else(|| io::Error::new(io::ErrorKind::StorageFull, "file system full"))?;
        self.put_bitmap_bit(b, true)?;
        self.alloc_next = b + 1;
        Ok(b)
    }

    /// The block that file block `fb` of `n` is stored in, if any.
    pub(crate) fn bmap(&self, n: &Inode, fb: u64) -> io::Result<Option<u64>> {
        let p = self.sb.per_block();
        let ptr = if fb < NDIRECT as u64 {
            n.direct[fb as usize]
        } else if fb < NDIRECT as u64 + p {
            self.ind_get(n.indirect, fb - NDIRECT as u64)?
        } else if fb < NDIRECT as u64 + p + p * p {
            let i = fb - NDIRECT as u64 - p;
            let mid = self.ind_get(n.dindirect, i / p)?;
            self.ind_get(mid, i % p)?
        } else {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "offset past the largest file",
            ));
        };
        Ok((ptr != 0).then_some(ptr))
    }

    /// Entry `i` of indirect block `blk` (0 for no block).
    pub(super) fn ind_get(&self, blk: u64, i: u64) -> io::Result<u64> {
        if blk == 0 {
            return Ok(0);
        }
        self.check_ptr(blk)?;
        let at = i as usize * 8;
        let mut cache = self.ind_cache.borrow_mut();
        if !cache.contains_key(&blk) {
            let b = self.dev.read(blk)?;
            if cache.len() >= IND_CACHE_BLOCKS {
                let pending = self.ind_defer.as_deref().unwrap_or(&[]);
                cache.retain(|b, _| pending.contains(b));
            }
            cache.insert(blk, b);
        }
        let b = &cache[&blk];
        let v = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        drop(cache);
        if v != 0 {
            self.check_ptr(v)?;
        }
        Ok(v)
    }

    pub(super) fn check_ptr(&self, b: u64) -> io::Result<()> {
        if self.sb.is_data(b) {
            Ok(())
        } else {
            Err(corrupt(format!("block pointer {b} outside the data area")))
        }
    }

    /// Points file block `fb` of `n` at `phys`, allocating indirect blocks
    /// as needed; each new indirect block is written (with the pointer in
    /// it) before the pointer to it (rule 2). The inode itself is changed
    /// in memory only.
    pub(super) fn set_ptr(&mut self, n: &mut Inode, fb: u64, phys: u64) -> io::Result<()> {
        let p = self.sb.per_block();
        if fb < NDIRECT as u64 {
            n.direct[fb as usize] = phys;
        } else if fb < NDIRECT as u64 + p {
            n.indirect = self.ind_set(n.indirect, fb - NDIRECT as u64, phys)?;
        } else if fb < NDIRECT as u64 + p + p * p {
            let i = fb - NDIRECT as u64 - p;
            let mid = self.ind_get(n.dindirect, i / p)?;
            let mid2 = self.ind_set(mid, i % p, phys)?;
            if mid2 != mid || n.dindirect == 0 {
                n.dindirect = self.ind_set(n.dindirect, i / p, mid2)?;
            }
        } else {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "offset past the largest file",
            ));
        }
        Ok(())
    }

    /// Sets entry `i` of indirect block `blk` (a new block when 0) and
    /// writes it; returns the block.
    pub(super) fn ind_set(&mut self, blk: u64, i: u64, v: u64) -> io::Result<u64> {
        let (blk, mut b) = if blk == 0 {
            (self.alloc_block()?, AlignedBuf::new(self.dev.bs))
        } else {
            self.check_ptr(blk)?;
            let cached = self.ind_cache.get_mut().remove(&blk);
            match cached {
                Some(b) => (blk, b),
                None => (blk, self.dev.read(blk)?),
            }
        };
        let at = i as usize * 8;
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        if let Some(pending) = &mut self.ind_defer {
            // Written at the end of the batch (writeback.rs).
            if !pending.contains(&blk) {
                pending.push(blk);
            }
            self.ind_cache_put(blk, b);
            return Ok(blk);
        }
        let copy = AlignedBuf::copy_of(&b);
        self.dev.write(blk, b)?;
        self.ind_cache_put(blk, copy);
        Ok(blk)
    }

    /// Every block of `n`: data and indirect (for removal and fsck).
    pub(crate) fn blocks_of(&self, n: &Inode) -> io::Result<Vec<u64>> {
        let mut out: Vec<u64> = n.direct.iter().copied().filter(|&b| b != 0).collect();
        let ind = |blk: u64, out: &mut Vec<u64>| -> io::Result<Vec<u64>> {
            if blk == 0 {
                return Ok(vec![]);
            }
            self.check_ptr(blk)?;
            out.push(blk);
            let b = self.dev.read(blk)?;
            let mut v = Vec::new();
            for c in b.chunks_exact(8) {
                let p = u64::from_le_bytes(c.try_into().unwrap());
                if p != 0 {
                    self.check_ptr(p)?;
                    v.push(p);
                }
            }
            Ok(v)
        };
        let l1 = ind(n.indirect, &mut out)?;
        out.extend(l1);
        for mid in ind(n.dindirect, &mut out)? {
            let l = ind(mid, &mut out)?;
            out.extend(l);
        }
        Ok(out)
    }
}
