//! Paths and directories: lookup, stat, listing, creating and removing
//! entries (in the crash order the module above describes).

use super::layout::*;
use super::{Fs, Stat};
use crate::buf::AlignedBuf;
use std::io;

impl Fs {
    pub(super) fn split(path: &str) -> io::Result<Vec<&str>> {
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        for p in &parts {
            check_name(p)?;
        }
        Ok(parts)
    }

    /// The entries of directory `ino`, with their slot numbers.
    pub(crate) fn dir_entries(&self, ino: u32) -> io::Result<Vec<(u64, Dirent)>> {
        let n = self.inode(ino)?;
        if n.kind != KIND_DIR {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("inode {ino} is not a directory"),
            ));
        }
        let per = (self.dev.bs / DIRENT_SIZE) as u64;
        let slots = n.size / DIRENT_SIZE as u64;
        let mut out = Vec::new();
        for fb in 0..slots.div_ceil(per) {
            let Some(phys) = self.bmap(&n, fb)? else {
                continue;
            };
            let b = self.dir_block(phys)?;
            for s in 0..per.min(slots - fb * per) {
                let at = (s as usize) * DIRENT_SIZE;
                let slot = fb * per + s;
                if let Some(d) = Dirent::decode(&b[at..at + DIRENT_SIZE], ino, slot, &self.sb)? {
                    out.push((slot, d));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn lookup_in(&self, dir: u32, name: &str) -> io::Result<Option<(u64, Dirent)>> {
        Ok(self
            .dir_entries(dir)?
            .into_iter()
            .find(|(_, d)| d.name == name))
    }

    /// The inode a path names.
    pub fn lookup(&self, path: &str) -> io::Result<u32> {
        let mut ino = ROOT;
        for (depth, p) in Self::split(path)?.into_iter().enumerate() {
            if depth > 256 {
                return Err(corrupt("path deeper than 256 directories"));
            }
            ino = self
                .lookup_in(ino, p)?
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{path}: no such file or directory"),
                    )
                })?
                .1
                .ino;
        }
        Ok(ino)
    }

    pub fn stat(&self, path: &str) -> io::Result<Stat> {
        let ino = self.lookup(path)?;
        let n = self.inode(ino)?;
        Ok(Stat {
            ino,
            kind: n.kind,
            size: n.size,
        })
    }

    /// The entries of a directory, sorted by name.
    pub fn list(&self, path: &str) -> io::Result<Vec<Dirent>> {
        let mut v: Vec<Dirent> = self
            .dir_entries(self.lookup(path)?)?
            .into_iter()
            .map(|e| e.1)
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    pub(super) fn parent_of<'p>(&self, path: &'p str) -> io::Result<(u32, &'p str)> {
        let parts = Self::split(path)?;
        let Some((last, dirs)) = parts.split_last() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the root has no name",
            ));
        };
        let dir = self.lookup(&dirs.join("/"))?;
        Ok((dir, last))
    }

    /// Creates an empty file or directory.
    pub(super) fn make(&mut self, path: &str, kind: u16) -> io::Result<u32> {
        let (dir, name) = self.parent_of(path)?;
        if self.lookup_in(dir, name)?.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{path}: exists"),
            ));
        }
        let ino = (2..self.sb.inodes)
            .find(|&i| {
                self.itable[i as usize * INODE_SIZE..(i as usize + 1) * INODE_SIZE]
                    .iter()
                    .all(|&b| b == 0)
            })
            .ok_or_else(|| io::Error::new(io::ErrorKind::StorageFull, "no free inode"))?;
        // Rule 3: the inode first, then the entry.
        self.put_inode(
            ino,
            &Inode {
                kind,
                nlink: 1,
                ..Inode::default()
            },
        )?;
        self.add_entry(
            dir,
            Dirent {
                ino,
                kind,
                name: name.to_string(),
            },
        )?;
        Ok(ino)
    }

    pub fn create(&mut self, path: &str) -> io::Result<u32> {
        self.make(path, KIND_FILE)
    }

    pub fn mkdir(&mut self, path: &str) -> io::Result<u32> {
        self.make(path, KIND_DIR)
    }

    pub(super) fn add_entry(&mut self, dir: u32, d: Dirent) -> io::Result<()> {
        let mut n = self.inode(dir)?;
        let per = (self.dev.bs / DIRENT_SIZE) as u64;
        let slots = n.size / DIRENT_SIZE as u64;
        let used: std::collections::HashSet<u64> =
            self.dir_entries(dir)?.into_iter().map(|e| e.0).collect();
        let slot = (0..slots).find(|s| !used.contains(s)).unwrap_or(slots);
        if (slot + 1) * DIRENT_SIZE as u64 > self.sb.max_dir_size() {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "directory full"));
        }
        let fb = slot / per;
        let at = (slot % per) as usize * DIRENT_SIZE;
        let mut changed = slot >= slots;
        match self.bmap(&n, fb)? {
            Some(phys) => {
                let mut b = self.dir_block(phys)?;
                b[at..at + DIRENT_SIZE].copy_from_slice(&d.encode());
                self.put_dir_block(phys, b)?;
            }
            None => {
                let phys = self.alloc_block()?;
                let mut b = AlignedBuf::new(self.dev.bs);
                b[at..at + DIRENT_SIZE].copy_from_slice(&d.encode());
                self.put_dir_block(phys, b)?;
                self.set_ptr(&mut n, fb, phys)?;
                changed = true;
            }
        }
        if slot >= slots {
            n.size = (slot + 1) * DIRENT_SIZE as u64;
        }
        // A free slot reused in a block the directory has: its inode is
        // as on the disk, no write.
        if changed {
            self.put_inode(dir, &n)?;
        }
        Ok(())
    }

    /// Removes a file or an empty directory (rule 4).
    pub fn remove(&mut self, path: &str) -> io::Result<()> {
        let (dir, name) = self.parent_of(path)?;
        let (slot, d) = self.lookup_in(dir, name)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{path}: no such file or directory"),
            )
        })?;
        let n = self.inode(d.ino)?;
        if n.kind == KIND_DIR && !self.dir_entries(d.ino)?.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{path}: directory not empty"),
            ));
        }
        let dn = self.inode(dir)?;
        let per = (self.dev.bs / DIRENT_SIZE) as u64;
        let phys = self
            .bmap(&dn, slot / per)?
            .ok_or_else(|| corrupt("directory slot without a block"))?;
        let mut b = self.dir_block(phys)?;
        let at = (slot % per) as usize * DIRENT_SIZE;
        b[at..at + DIRENT_SIZE].fill(0);
        self.put_dir_block(phys, b)?;
        // An interrupted rename can leave a second name for the inode
        // (see rename.rs): then the inode stays for that name.
        if n.kind == KIND_FILE
            && self
                .dir_entries(dir)?
                .iter()
                .any(|(s, e)| *s != slot && e.ino == d.ino)
        {
            return Ok(());
        }
        self.free_inode(d.ino)
    }
}
