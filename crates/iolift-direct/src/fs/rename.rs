//! Rename within a directory and truncation to zero, in the crash order
//! of the module above.
//!
//! Rename changes directory entries only. Without an existing target the
//! source entry's name is rewritten in place (one block write). Over an
//! existing file the target's entry is made to name the source's inode and
//! the source's entry is cleared: one block write when both entries are in
//! the same directory block, else two (target first). A process killed
//! between those two writes leaves the inode under both names, which
//! [`super::fsck`] reports as leaked-class (`twice_named`, not an error);
//! removing either name then keeps the inode for the other. Only after the
//! entries are written is the replaced file's inode freed, then its blocks.

use super::cache::Cache;
use super::layout::*;
use super::{File, Fs};
use std::io;

impl Fs {
    /// Renames `from` to `to` in the same directory, replacing a file
    /// named `to`. Directories can be renamed, not replaced.
    pub fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let (dir, name) = self.parent_of(from)?;
        let (dir2, name2) = self.parent_of(to)?;
        if dir != dir2 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("rename {from} to {to}: across directories is not supported"),
            ));
        }
        let entries = self.dir_entries(dir)?;
        let Some((src_slot, src)) = entries.iter().find(|(_, d)| d.name == name).cloned() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{from}: no such file or directory"),
            ));
        };
        if name == name2 {
            return Ok(());
        }
        let moved = Dirent {
            name: name2.to_string(),
            ..src.clone()
        };
        let target = entries.iter().find(|(_, d)| d.name == name2).cloned();
        let Some((t_slot, t)) = target else {
            return self.write_slots(dir, &[(src_slot, Some(&moved))]);
        };
        if t.kind == KIND_DIR || src.kind == KIND_DIR {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("rename {from} to {to}: only a file can replace a file"),
            ));
        }
        let per = (self.dev.bs / DIRENT_SIZE) as u64;
        if src_slot / per == t_slot / per {
            self.write_slots(dir, &[(t_slot, Some(&moved)), (src_slot, None)])?;
        } else {
            self.write_slots(dir, &[(t_slot, Some(&moved))])?;
            self.write_slots(dir, &[(src_slot, None)])?;
        }
        let still_named = entries.iter().any(|(s, d)| *s != t_slot && d.ino == t.ino);
        if t.ino != src.ino && !still_named {
            self.free_inode(t.ino)?;
        }
        Ok(())
    }

    /// Writes entries (None clears the slot) of directory `dir`, all in
    /// one directory block that already exists.
    fn write_slots(&mut self, dir: u32, slots: &[(u64, Option<&Dirent>)]) -> io::Result<()> {
        let dn = self.inode(dir)?;
        let per = (self.dev.bs / DIRENT_SIZE) as u64;
        let fb = slots[0].0 / per;
        debug_assert!(slots.iter().all(|(s, _)| s / per == fb));
        let phys = self
            .bmap(&dn, fb)?
            .ok_or_else(|| corrupt("directory slot without a block"))?;
        let mut b = self.dir_block(phys)?;
        for (slot, d) in slots {
            let at = (slot % per) as usize * DIRENT_SIZE;
            match d {
                Some(d) => b[at..at + DIRENT_SIZE].copy_from_slice(&d.encode()),
                None => b[at..at + DIRENT_SIZE].fill(0),
            }
        }
        self.put_dir_block(phys, b)
    }

    /// Frees an inode no entry names: the inode first, then its blocks
    /// (rule 4).
    pub(super) fn free_inode(&mut self, ino: u32) -> io::Result<()> {
        let n = self.inode(ino)?;
        let blocks = self.blocks_of(&n)?;
        self.put_inode(ino, &Inode::default())?;
        self.free_blocks(&blocks)
    }

    /// Truncates an open file to zero bytes, dropping its cached blocks:
    /// the inode without pointers is written first, then its blocks are
    /// freed (a crash in between leaks them only).
    pub fn truncate(&mut self, f: &mut File) -> io::Result<()> {
        let old = self.inode(f.ino)?;
        let blocks = self.blocks_of(&old)?;
        // Blocks written back since the open but not yet named by the
        // inode on disk are in f.inode only: they go too.
        let on_disk: std::collections::HashSet<u64> = blocks.iter().copied().collect();
        let mut since: Vec<u64> = self.blocks_of(&f.inode)?;
        since.retain(|b| !on_disk.contains(b));
        let empty = Inode {
            kind: old.kind,
            nlink: old.nlink,
            ..Inode::default()
        };
        self.put_inode(f.ino, &empty)?;
        let all: Vec<u64> = blocks.into_iter().chain(since).collect();
        self.free_blocks(&all)?;
        f.inode = empty;
        f.cache = Cache::counted(self.cache_blocks, self.cache_total.clone());
        f.inode_dirty = false;
        f.trusted = 0;
        f.written_past.clear();
        f.ra_next = u64::MAX;
        f.behind_next = 0;
        Ok(())
    }
}
