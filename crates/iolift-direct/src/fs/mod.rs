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

mod behind;
mod blocks;
pub mod cache;
mod dir;
mod dircache;
mod file;
pub mod fsck;
mod inflight;
pub mod layout;
mod mkfs;
mod recycle;
mod rename;
mod writeback;

pub use mkfs::mkfs;

use crate::buf::{AlignedBuf, Buf};
use crate::engine::{Engine, Op};
use cache::Cache;
use layout::*;
use std::io;

/// Blocks the cache keeps per open file unless told otherwise.
pub const DEFAULT_CACHE_BLOCKS: usize = 16;

/// Blocks all open files' caches keep together unless told otherwise
/// (64 MiB at 8 KiB blocks); see [`Fs::set_cache_budget`].
pub const DEFAULT_CACHE_BUDGET: usize = 8192;

/// Blocks every open file may hold (up to its own bound) even when all
/// caches together are at the budget: a file opened after the budget is
/// spent still gets a working cache and read-ahead, not one block that
/// each miss evicts. The caches together hold at most the budget plus
/// this many blocks per open file.
pub const CACHE_SHARE_MIN: usize = 16;

/// The most blocks one read-ahead brings in (at most half of a file's
/// cache is used for it): 1 MiB at 8 KiB blocks, the largest request
/// write-back makes too.
pub const READ_AHEAD_MAX: usize = 128;

/// Indirect blocks the file system keeps in memory (shared by all files;
/// write-through, so never dirty). At 8 KiB blocks: 512 KiB.
pub const IND_CACHE_BLOCKS: usize = 64;

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

/// Block I/O on the engine, waiting for each request, except a cache's
/// write-back (inflight.rs): every request first waits for that.
pub(crate) struct Dev {
    pub eng: Engine,
    pub bs: usize,
    inflight: std::cell::RefCell<Option<inflight::Inflight>>,
    /// Set when a write-back that nobody waited for failed.
    failed: std::cell::RefCell<Option<(io::ErrorKind, String)>>,
    /// Buffers kept for reuse (recycle.rs).
    recycle: std::cell::RefCell<recycle::Recycler>,
}

impl Dev {
    pub fn read(&self, b: u64) -> io::Result<AlignedBuf> {
        self.settle()?;
        let d = self
            .eng
            .run(Op::Read {
                offset: b * self.bs as u64,
                buf: Buf::Aligned(self.buf(self.bs)),
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

    /// Appends `n` consecutive blocks from `b` to `out`, in requests of
    /// at most 1 MiB (the bitmap and the inode table at mount: a few
    /// requests, not one per block).
    fn read_area(&self, b: u64, n: u64, out: &mut Vec<u8>) -> io::Result<()> {
        let per = ((1 << 20) / self.bs).max(1) as u64;
        let mut at = 0;
        while at < n {
            let k = per.min(n - at);
            let run = self.read_run(b + at, k as usize)?;
            out.extend_from_slice(&run);
            self.recycle(run);
            at += k;
        }
        Ok(())
    }

    /// Reads `n` consecutive blocks from `b` with one request.
    pub fn read_run(&self, b: u64, n: usize) -> io::Result<AlignedBuf> {
        self.settle()?;
        let len = n * self.bs;
        let d = self
            .eng
            .run(Op::Read {
                offset: b * self.bs as u64,
                buf: Buf::Aligned(self.buf(len)),
            })
            .wait();
        let got = d
            .result()
            .map_err(|e| io_ctx(e, &format!("read of blocks {b}..{}", b + n as u64)))?;
        if got != len {
            return Err(corrupt(format!(
                "blocks {b}..{}: short read ({got} of {len} bytes)",
                b + n as u64
            )));
        }
        match d.buf {
            Some(Buf::Aligned(a)) => Ok(a),
            _ => unreachable!("the engine gives back the buffer it was given"),
        }
    }

    pub fn write(&self, b: u64, buf: AlignedBuf) -> io::Result<AlignedBuf> {
        self.settle()?;
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
        let a = self.concat([data], self.bs);
        let back = self.write(b, a)?;
        self.recycle(back);
        Ok(())
    }

    pub fn flush(&self) -> io::Result<()> {
        self.settle()?;
        self.eng.flush().wait().result().map(drop)
    }
}

fn io_ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
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
    /// The file block after the last one a miss brought in: a miss there
    /// is sequential and reads ahead (file.rs).
    ra_next: u64,
    /// Write-behind (behind.rs): runs of this many whole dirty blocks
    /// behind the write point are started on the disk (0: off).
    behind: usize,
    /// The first file block write-behind has not looked at yet.
    behind_next: u64,
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
    /// The most blocks all open files' caches hold together (past it, a
    /// file makes room in its own cache before it adds a block).
    cache_budget: usize,
    /// Blocks in all open files' caches now.
    cache_total: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Where the next search for a free data block starts (next fit).
    alloc_next: u64,
    /// Indirect blocks as last read or written: physical block ->
    /// contents, at most [`IND_CACHE_BLOCKS`]; an entry goes when its
    /// block is freed.
    ind_cache: std::cell::RefCell<std::collections::HashMap<u64, AlignedBuf>>,
    /// While a batch sets pointers: the indirect blocks changed in the
    /// cache only, to write once at its end (see writeback.rs).
    ind_defer: Option<Vec<u64>>,
    /// Directory blocks as last read or written (see dircache.rs).
    dir_cache: std::cell::RefCell<std::collections::HashMap<u64, AlignedBuf>>,
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
            inflight: Default::default(),
            failed: Default::default(),
            recycle: Default::default(),
        };
        let mut bitmap = Vec::with_capacity(sb.bitmap_blocks as usize * dev.bs);
        dev.read_area(sb.bitmap_start as u64, sb.bitmap_blocks as u64, &mut bitmap)?;
        let mut itable = Vec::with_capacity(sb.itable_blocks as usize * dev.bs);
        dev.read_area(
            sb.itable_start as u64,
            (sb.data_start - sb.itable_start) as u64,
            &mut itable,
        )?;
        let fs = Fs {
            dev,
            sb,
            bitmap,
            itable,
            cache_blocks: DEFAULT_CACHE_BLOCKS,
            cache_budget: DEFAULT_CACHE_BUDGET,
            cache_total: Default::default(),
            alloc_next: 0,
            ind_cache: Default::default(),
            ind_defer: None,
            dir_cache: Default::default(),
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

    /// Blocks all open files' caches hold together (>= 1): once they hold
    /// that many, a file that needs a block and holds [`CACHE_SHARE_MIN`]
    /// or more first evicts one of its own. So the caches take at most
    /// this many blocks plus [`CACHE_SHARE_MIN`] per open file, each file
    /// at most its own bound.
    pub fn set_cache_budget(&mut self, n: usize) {
        self.cache_budget = n.max(1);
    }

    /// The engine under the file system (its request counters).
    pub fn engine(&self) -> &Engine {
        &self.dev.eng
    }

    /// The budget [`Self::set_cache_budget`] set.
    pub fn cache_budget(&self) -> usize {
        self.cache_budget
    }

    /// Blocks in all open files' caches now.
    pub fn cached_blocks(&self) -> usize {
        self.cache_total.load(std::sync::atomic::Ordering::Relaxed)
    }
}
