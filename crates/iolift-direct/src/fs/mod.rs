//! AccelFS: a small ext2-shaped file system on the direct I/O engine, with
//! a per-file hash-table buffer cache (HAYAGUI's shape).
//!
//! - [`layout`]: the on-disk format (superblock, block bitmap, inode table,
//!   direct / indirect / double-indirect pointers, directories);
//! - [`cache`]: the per-file buffer cache (a hash table of at most
//!   [`DEFAULT_CACHE_BLOCKS`] blocks per open file, dirty tracking);
//! - [`fsck`]: the consistency check.
//!
//! # Crash ordering
//!
//! There is no journal. Every metadata write waits for its completion
//! before a write that depends on it is issued, in this order:
//!
//! 1. a block is marked used in the bitmap (on disk) before anything points
//!    to it;
//! 2. a data, indirect or directory block's contents are written before the
//!    pointer to it (in an indirect block or the inode);
//! 3. an inode is written (in use) before a directory entry names it;
//! 4. on removal, the directory entry is cleared first, then the inode is
//!    freed, then its blocks are cleared in the bitmap;
//! 5. a file's size on disk grows only when its inode is written, after its
//!    dirty blocks are (soft or hard sync, close, and no other time).
//!
//! So after a process is killed at any point every pointer names a block
//! marked used that no other pointer names, and every entry names an inode
//! in use: [`fsck`] finds no error. What can be left is only leaked space:
//! blocks marked used that nothing points to, inodes in use that no entry
//! names (`fsck --repair` frees them). A hard sync ([`Fs::sync_hard`]) ends
//! with a device flush, so the bytes it wrote survive a power loss too;
//! between hard syncs the order above holds for a killed process (the
//! kernel keeps every completed write), not for a power loss.

pub mod cache;
pub mod fsck;
pub mod layout;

use crate::buf::{AlignedBuf, Buf};
use crate::engine::{Engine, Op};
use cache::Cache;
use layout::*;
use std::io;

/// Blocks the cache keeps per open file unless told otherwise.
pub const DEFAULT_CACHE_BLOCKS: usize = 16;

/// How to make a file system.
#[derive(Debug, Clone)]
pub struct Mkfs {
    pub block_size: u32,
    /// Inodes; 0: one per 16 blocks (at least 16).
    pub inodes: u32,
}

impl Default for Mkfs {
    fn default() -> Self {
        Mkfs {
            block_size: 8192,
            inodes: 0,
        }
    }
}

/// Block I/O on the engine, waiting for each request.
pub(crate) struct Dev {
    pub eng: Engine,
    pub bs: usize,
}

impl Dev {
    pub fn read(&self, b: u64) -> io::Result<AlignedBuf> {
        let d = self
            .eng
            .run(Op::Read {
                offset: b * self.bs as u64,
                buf: Buf::Aligned(AlignedBuf::new(self.bs)),
            })
            .wait();
        let n = d
            .result()
            .map_err(|e| io_ctx(e, &format!("read of block {b}")))?;
        if n != self.bs {
            return Err(corrupt(format!(
                "block {b}: short read ({n} of {} bytes)",
                self.bs
            )));
        }
        match d.buf {
            Some(Buf::Aligned(a)) => Ok(a),
            _ => unreachable!("the engine gives back the buffer it was given"),
        }
    }

    pub fn write(&self, b: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        let d = self
            .eng
            .run(Op::Write {
                offset: b * self.bs as u64,
                buf: Buf::Aligned(buf),
            })
            .wait();
        let n = d
            .result()
            .map_err(|e| io_ctx(e, &format!("write of block {b}")))?;
        if n != self.bs {
            return Err(io::Error::other(format!(
                "block {b}: short write ({n} bytes)"
            )));
        }
        match d.buf {
            Some(Buf::Aligned(a)) => Ok(a),
            _ => unreachable!("the engine gives back the buffer it was given"),
        }
    }

    pub fn write_bytes(&self, b: u64, data: &[u8]) -> io::Result<()> {
        let mut a = AlignedBuf::new(self.bs);
        a[..data.len()].copy_from_slice(data);
        self.write(b, a).map(drop)
    }

    pub fn flush(&self) -> io::Result<()> {
        self.eng.flush().wait().result().map(drop)
    }
}

fn io_ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Makes an empty file system (root directory only) on the engine's target.
pub fn mkfs(eng: &Engine, o: &Mkfs) -> io::Result<layout::Super> {
    let bs = o.block_size as u64;
    let blocks = eng.target().size() / bs;
    let inodes = if o.inodes == 0 {
        (blocks / 16).clamp(16, 1 << 20) as u32
    } else {
        o.inodes
    };
    let sb = Super::plan(o.block_size, blocks, inodes)?;
    if eng.target().align() > o.block_size as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "block size {bs} below the device's {}",
                eng.target().align()
            ),
        ));
    }
    let mut a = AlignedBuf::new(bs as usize);
    let run = |op| eng.run(op).wait().result();
    // Inode table (zero, then the root), bitmap, superblock last.
    for b in sb.itable_start..sb.data_start {
        a.fill(0);
        if b == sb.itable_start {
            let root = Inode {
                kind: KIND_DIR,
                nlink: 1,
                ..Inode::default()
            };
            let at = ROOT as usize * INODE_SIZE;
            a[at..at + INODE_SIZE].copy_from_slice(&root.encode());
        }
        a = write_owned(eng, b as u64 * bs, a)?;
    }
    let mut bitmap = vec![0u8; sb.bitmap_blocks as usize * bs as usize];
    for b in 0..sb.data_start as usize {
        bitmap[b / 8] |= 1 << (b % 8);
    }
    for i in 0..sb.bitmap_blocks as usize {
        a.copy_from_slice(&bitmap[i * bs as usize..(i + 1) * bs as usize]);
        a = write_owned(eng, (sb.bitmap_start as u64 + i as u64) * bs, a)?;
    }
    run(Op::Flush)?;
    a.fill(0);
    a[..SB_LEN].copy_from_slice(&sb.encode());
    write_owned(eng, 0, a)?;
    run(Op::Flush)?;
    Ok(sb)
}

fn write_owned(eng: &Engine, off: u64, a: AlignedBuf) -> io::Result<AlignedBuf> {
    let d = eng.write(off, Buf::Aligned(a)).wait();
    d.result()?;
    match d.buf {
        Some(Buf::Aligned(a)) => Ok(a),
        _ => unreachable!("the engine gives back the buffer it was given"),
    }
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub ino: u32,
    pub kind: u16,
    pub size: u64,
}

/// An open file: its inode as last written or changed, and its cache.
pub struct File {
    ino: u32,
    inode: Inode,
    cache: Cache,
    /// The inode differs from the one on disk.
    inode_dirty: bool,
    /// The size at open: what the disk holds past it (left by a write
    /// that a killed process did not sync) is not the file's and reads as
    /// zeroes, except in the blocks written back since the open.
    trusted: u64,
    written_past: std::collections::HashSet<u64>,
}

impl File {
    pub fn ino(&self) -> u32 {
        self.ino
    }

    /// The size, with writes not yet synced.
    pub fn size(&self) -> u64 {
        self.inode.size
    }

    /// Blocks in its cache now, and how many of them are dirty.
    pub fn cached(&self) -> (usize, usize) {
        (self.cache.len(), self.cache.dirty_count())
    }
}

/// A mounted file system.
pub struct Fs {
    pub(crate) dev: Dev,
    pub(crate) sb: Super,
    bitmap: Vec<u8>,
    itable: Vec<u8>,
    cache_blocks: usize,
}

impl Fs {
    /// Mounts the file system on the engine's target: checks the
    /// superblock, loads the bitmap and the inode table.
    pub fn mount(eng: Engine) -> io::Result<Fs> {
        let size = eng.target().size();
        let align = eng.target().align().max(512);
        let d = eng
            .run(Op::Read {
                offset: 0,
                buf: Buf::Aligned(AlignedBuf::new(4096.max(align))),
            })
            .wait();
        let n = d.result()?;
        let head = d.buf.unwrap();
        let sb = Super::decode(&head[..n.min(head.len())], size)?;
        let dev = Dev {
            eng,
            bs: sb.block_size as usize,
        };
        let mut bitmap = Vec::with_capacity(sb.bitmap_blocks as usize * dev.bs);
        for b in sb.bitmap_start..sb.bitmap_start + sb.bitmap_blocks {
            bitmap.extend_from_slice(&dev.read(b as u64)?);
        }
        let mut itable = Vec::with_capacity(sb.itable_blocks as usize * dev.bs);
        for b in sb.itable_start..sb.data_start {
            itable.extend_from_slice(&dev.read(b as u64)?);
        }
        let fs = Fs {
            dev,
            sb,
            bitmap,
            itable,
            cache_blocks: DEFAULT_CACHE_BLOCKS,
        };
        let root = fs.inode(ROOT)?;
        if root.kind != KIND_DIR {
            return Err(corrupt("root inode is not a directory"));
        }
        Ok(fs)
    }

    /// Flushes the device and gives the engine back.
    pub fn unmount(self) -> io::Result<Engine> {
        self.dev.flush()?;
        Ok(self.dev.eng)
    }

    pub fn superblock(&self) -> &Super {
        &self.sb
    }

    /// Blocks per open file's cache, for files opened from now on (>= 1).
    pub fn set_cache_blocks(&mut self, n: usize) {
        self.cache_blocks = n.max(1);
    }

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
        }
        let blk = i / self.dev.bs;
        let data = &self.bitmap[blk * self.dev.bs..(blk + 1) * self.dev.bs];
        self.dev
            .write_bytes(self.sb.bitmap_start as u64 + blk as u64, data)
    }

    /// Allocates a data block: marked used on disk before it is returned
    /// (rule 1).
    fn alloc_block(&mut self) -> io::Result<u64> {
        let b = (self.sb.data_start as u64..self.sb.blocks)
            .find(|&b| !self.is_used(b))
            .ok_or_else(|| io::Error::new(io::ErrorKind::StorageFull, "file system full"))?;
        self.put_bitmap_bit(b, true)?;
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
    fn ind_get(&self, blk: u64, i: u64) -> io::Result<u64> {
        if blk == 0 {
            return Ok(0);
        }
        self.check_ptr(blk)?;
        let b = self.dev.read(blk)?;
        let at = i as usize * 8;
        let v = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        if v != 0 {
            self.check_ptr(v)?;
        }
        Ok(v)
    }

    fn check_ptr(&self, b: u64) -> io::Result<()> {
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
    fn set_ptr(&mut self, n: &mut Inode, fb: u64, phys: u64) -> io::Result<()> {
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
    fn ind_set(&mut self, blk: u64, i: u64, v: u64) -> io::Result<u64> {
        let (blk, mut b) = if blk == 0 {
            (self.alloc_block()?, AlignedBuf::new(self.dev.bs))
        } else {
            self.check_ptr(blk)?;
            (blk, self.dev.read(blk)?)
        };
        let at = i as usize * 8;
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        self.dev.write(blk, b)?;
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

    // ---- paths and directories ----

    fn split(path: &str) -> io::Result<Vec<&str>> {
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
            let b = self.dev.read(phys)?;
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

    fn lookup_in(&self, dir: u32, name: &str) -> io::Result<Option<(u64, Dirent)>> {
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

    fn parent_of<'p>(&self, path: &'p str) -> io::Result<(u32, &'p str)> {
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
    fn make(&mut self, path: &str, kind: u16) -> io::Result<u32> {
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

    fn add_entry(&mut self, dir: u32, d: Dirent) -> io::Result<()> {
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
        match self.bmap(&n, fb)? {
            Some(phys) => {
                let mut b = self.dev.read(phys)?;
                b[at..at + DIRENT_SIZE].copy_from_slice(&d.encode());
                self.dev.write(phys, b)?;
            }
            None => {
                let phys = self.alloc_block()?;
                let mut b = AlignedBuf::new(self.dev.bs);
                b[at..at + DIRENT_SIZE].copy_from_slice(&d.encode());
                self.dev.write(phys, b)?;
                self.set_ptr(&mut n, fb, phys)?;
            }
        }
        if slot >= slots {
            n.size = (slot + 1) * DIRENT_SIZE as u64;
        }
        self.put_inode(dir, &n)
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
        let blocks = self.blocks_of(&n)?;
        let dn = self.inode(dir)?;
        let per = (self.dev.bs / DIRENT_SIZE) as u64;
        let phys = self
            .bmap(&dn, slot / per)?
            .ok_or_else(|| corrupt("directory slot without a block"))?;
        let mut b = self.dev.read(phys)?;
        let at = (slot % per) as usize * DIRENT_SIZE;
        b[at..at + DIRENT_SIZE].fill(0);
        self.dev.write(phys, b)?;
        self.put_inode(d.ino, &Inode::default())?;
        for blk in blocks {
            self.put_bitmap_bit(blk, false)?;
        }
        Ok(())
    }

    // ---- files ----

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
            cache: Cache::new(self.cache_blocks),
            inode_dirty: false,
            written_past: std::collections::HashSet::new(),
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
                f.cache.insert(fb, AlignedBuf::new(bs as usize));
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
        Ok(())
    }

    /// The cached block `fb` of `f`, read in (or zero for a hole or past
    /// the end) when missing. Bytes past the size at open read as zero
    /// unless their block was written back since (see [`File`]).
    fn cached_block<'f>(&mut self, f: &'f mut File, fb: u64) -> io::Result<&'f mut AlignedBuf> {
        if !f.cache.contains(fb) {
            self.make_room(f)?;
            let bs = self.dev.bs as u64;
            let ours = f.written_past.contains(&fb);
            // A block whose disk copy holds bytes that are not the file's
            // is cached zeroed there and dirty, so the zeroes reach the
            // disk before a larger size does.
            let (data, stale) = match self.bmap(&f.inode, fb)? {
                Some(_) if !ours && fb * bs >= f.trusted => (AlignedBuf::new(self.dev.bs), true),
                Some(phys) => {
                    let mut b = self.dev.read(phys)?;
                    let stale = !ours && fb == f.trusted / bs;
                    if stale {
                        b[(f.trusted % bs) as usize..].fill(0);
                    }
                    (b, stale)
                }
                None => (AlignedBuf::new(self.dev.bs), false),
            };
            f.cache.insert(fb, data);
            if stale {
                f.cache.mark_dirty(fb);
            }
        }
        Ok(f.cache.get_mut(fb).expect("block just cached"))
    }

    /// Evicts one block when the cache is full, writing it back if dirty.
    fn make_room(&mut self, f: &mut File) -> io::Result<()> {
        if let Some((fb, data, dirty)) = f.cache.evict_if_full() {
            if dirty {
                self.write_back(f, fb, data)?;
            }
        }
        Ok(())
    }

    /// Writes one dirty block: its data first, then (for a new block) the
    /// pointer to it (rules 1, 2).
    fn write_back(&mut self, f: &mut File, fb: u64, data: AlignedBuf) -> io::Result<()> {
        if (fb + 1) * self.dev.bs as u64 > f.trusted {
            f.written_past.insert(fb);
        }
        match self.bmap(&f.inode, fb)? {
            Some(phys) => {
                self.dev.write(phys, data)?;
            }
            None => {
                let phys = self.alloc_block()?;
                self.dev.write(phys, data)?;
                let mut n = f.inode.clone();
                self.set_ptr(&mut n, fb, phys)?;
                f.inode = n;
                f.inode_dirty = true;
            }
        }
        Ok(())
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
        for fb in f.cache.dirty_blocks() {
            let copy = f.cache.copy_and_clean(fb).expect("dirty block cached");
            self.write_back(f, fb, copy)?;
        }
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
