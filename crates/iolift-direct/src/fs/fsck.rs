//! The consistency check: every inode decodes (checksum, kind, size,
//! pointers in the data area); no block has two owners; every block a file
//! or directory uses is marked used in the bitmap, and so is all metadata;
//! every directory entry decodes, names an inode in use of the kind it
//! says, once; names are unique within a directory; the tree from the root
//! has no cycle. Each problem is one line in [`Report::errors`].
//!
//! Leaked space is reported apart, as the crash ordering (see
//! [`super`]) allows it: blocks marked used that nothing points to, inodes
//! in use that no entry names (orphans). [`repair`] frees them. A file
//! named twice in one directory (an interrupted rename) is listed apart
//! too and left as it is.

use super::layout::*;
use super::Fs;
use std::collections::{HashMap, HashSet};
use std::io;

/// What [`fsck`] found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub errors: Vec<String>,
    pub leaked_blocks: Vec<u64>,
    pub orphans: Vec<u32>,
    /// Files named by two entries of one directory (inode, directory):
    /// what a rename interrupted between its two entry writes leaves.
    pub twice_named: Vec<(u32, u32)>,
    pub files: u64,
    pub dirs: u64,
    pub used_blocks: u64,
}

impl Report {
    /// No errors (leaked space allowed).
    pub fn is_consistent(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Checks a mounted file system; see the module docs.
pub fn fsck(fs: &Fs) -> Report {
    let sb = &fs.sb;
    let mut r = Report::default();
    let mut inodes: HashMap<u32, Inode> = HashMap::new();
    for ino in 1..sb.inodes {
        match fs.inode(ino) {
            Ok(n) if n.kind == KIND_FREE => {}
            Ok(n) => {
                inodes.insert(ino, n);
            }
            Err(e) => r.errors.push(e.to_string()),
        }
    }
    // Block owners.
    let mut owner: HashMap<u64, u32> = HashMap::new();
    let mut sorted: Vec<u32> = inodes.keys().copied().collect();
    sorted.sort_unstable();
    for &ino in &sorted {
        let blocks = match fs.blocks_of(&inodes[&ino]) {
            Ok(b) => b,
            Err(e) => {
                r.errors.push(format!("inode {ino}: {e}"));
                continue;
            }
        };
        for b in blocks {
            if let Some(o) = owner.insert(b, ino) {
                r.errors
                    .push(format!("block {b} used by inode {o} and inode {ino}"));
            }
            if !fs.is_used(b) {
                r.errors
                    .push(format!("block {b} of inode {ino} is free in the bitmap"));
            }
        }
    }
    // The tree.
    let mut named: HashMap<u32, u32> = HashMap::new();
    let mut seen_dirs: HashSet<u32> = HashSet::new();
    let mut todo = vec![ROOT];
    match inodes.get(&ROOT) {
        Some(n) if n.kind == KIND_DIR => {}
        _ => r.errors.push("root inode is not a directory in use".into()),
    }
    while let Some(dir) = todo.pop() {
        if !seen_dirs.insert(dir) {
            continue;
        }
        r.dirs += 1;
        let entries = match fs.dir_entries(dir) {
            Ok(e) => e,
            Err(e) => {
                r.errors.push(format!("directory inode {dir}: {e}"));
                continue;
            }
        };
        let mut names = HashSet::new();
        for (_, d) in entries {
            if !names.insert(d.name.clone()) {
                r.errors
                    .push(format!("directory inode {dir}: name {:?} twice", d.name));
            }
            let Some(n) = inodes.get(&d.ino) else {
                r.errors.push(format!(
                    "directory inode {dir}: entry {:?} names inode {} which is not in use",
                    d.name, d.ino
                ));
                continue;
            };
            if n.kind != d.kind {
                r.errors.push(format!(
                    "directory inode {dir}: entry {:?} says kind {}, inode {} is kind {}",
                    d.name, d.kind, d.ino, n.kind
                ));
                continue;
            }
            if d.ino == ROOT {
                r.errors.push(format!(
                    "directory inode {dir}: entry {:?} names the root",
                    d.name
                ));
                continue;
            }
            if named.get(&d.ino) == Some(&dir) && n.kind == KIND_FILE {
                r.twice_named.push((d.ino, dir));
                continue;
            }
            if let Some(other) = named.insert(d.ino, dir) {
                r.errors.push(format!(
                    "inode {} has entries in directory inodes {other} and {dir}",
                    d.ino
                ));
                continue;
            }
            if n.kind == KIND_DIR {
                todo.push(d.ino);
            } else {
                r.files += 1;
            }
        }
    }
    for &ino in &sorted {
        if ino != ROOT && !named.contains_key(&ino) {
            r.orphans.push(ino);
        }
    }
    // The bitmap.
    for b in 0..sb.blocks {
        let used = fs.is_used(b);
        if b < sb.data_start as u64 {
            if !used {
                r.errors
                    .push(format!("metadata block {b} is free in the bitmap"));
            }
        } else if used && !owner.contains_key(&b) {
            r.leaked_blocks.push(b);
        }
        if used {
            r.used_blocks += 1;
        }
    }
    r
}

/// Frees the orphans and leaked blocks of a consistent file system (what
/// [`fsck`] reported); refuses when it found errors.
pub fn repair(fs: &mut Fs, r: &Report) -> io::Result<()> {
    if !r.is_consistent() {
        return Err(io::Error::other(format!(
            "{} errors: repair frees only leaked space",
            r.errors.len()
        )));
    }
    for &ino in &r.orphans {
        let n = fs.inode(ino)?;
        let blocks = fs.blocks_of(&n)?;
        fs.put_inode(ino, &Inode::default())?;
        for b in blocks {
            fs.put_bitmap_bit(b, false)?;
        }
    }
    for &b in &r.leaked_blocks {
        fs.put_bitmap_bit(b, false)?;
    }
    fs.dev.flush()
}
