//! Directory blocks kept in memory: every path lookup walks directory
//! blocks, and the key-value store looks paths up on each open, stat,
//! exists, rename and removal. At most [`DIR_CACHE_BLOCKS`] blocks,
//! write-through (a change is written to the disk, then cached), so never
//! dirty; an entry goes when its block is freed.

use super::Fs;
use crate::buf::AlignedBuf;
use std::io;

/// Directory blocks the file system keeps in memory (shared by all
/// directories). At 8 KiB blocks: 256 KiB.
pub const DIR_CACHE_BLOCKS: usize = 32;

impl Fs {
    /// A copy of directory block `phys`, from memory or read from the disk.
    pub(super) fn dir_block(&self, phys: u64) -> io::Result<AlignedBuf> {
        if let Some(b) = self.dir_cache.borrow().get(&phys) {
            let c = AlignedBuf::copy_of(b);
            return Ok(c);
        }
        let b = self.dev.read(phys)?;
        self.dir_cache_put(phys, &b);
        Ok(b)
    }

    /// Writes directory block `phys` and keeps a copy.
    pub(super) fn put_dir_block(&mut self, phys: u64, b: AlignedBuf) -> io::Result<()> {
        let c = AlignedBuf::copy_of(&b);
        self.dev.write(phys, b)?;
        self.dir_cache_put(phys, &c);
        Ok(())
    }

    fn dir_cache_put(&self, phys: u64, b: &AlignedBuf) {
        let mut c = self.dir_cache.borrow_mut();
        if c.len() >= DIR_CACHE_BLOCKS && !c.contains_key(&phys) {
            // Directories here are few and small: start over.
            c.clear();
        }
        let copy = AlignedBuf::copy_of(b);
        c.insert(phys, copy);
    }
}
