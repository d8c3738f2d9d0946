//! [`AccelEnv`]: rusty-leveldb's storage environment on AccelFS.
//!
//! Each path the engine names (`DB/000005.ldb`, `DB/CURRENT`, ...) is an
//! AccelFS path. Files go through AccelFS's per-file buffer cache: one
//! cache per open file, shared by every handle on it. The engine's sync
//! (`Write::flush` of a log, table or manifest file it writes) is
//! AccelFS's hard sync: the file's dirty blocks, then its inode, then a
//! device flush. A closed file stays in memory (handle.rs) and is
//! soft-synced when dropped or renamed.
//!
//! [`SyncMode`] says what the engine's sync is: a hard sync (the default:
//! the bytes survive a power loss, as after fdatasync(2)) or a soft sync
//! (the bytes are on the device when the call returns and survive the
//! process being killed, not a power loss: the durability of
//! rusty-leveldb's own POSIX environment, whose sync leaves them in the
//! kernel's page cache). Renames stay within one
//! directory (the engine renames only there). Locks are held in this
//! process; the image itself is locked with flock(2) against a second
//! process.
//!
//! Memory: every open file holds at most `cache_blocks` blocks, and all of
//! them together at most `cache_budget` blocks plus one per open file
//! (AccelFS's budget); the engine keeps at most its `max_open_files` table
//! files open.

use crate::handle::{unmounted, Handle, Inner};
pub use crate::sync::SyncMode;
use iolift_direct::fs::{layout, Fs};
use rusty_leveldb::env::{Env, FileLock, Logger, RandomAccess};
use rusty_leveldb::{Status, StatusCode};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Blocks of each open file's cache by default here: 512 (4 MiB at 8 KiB
/// blocks: a level-0 table, which holds a whole 4 MiB memtable, and the
/// log; compacted tables are 2 MiB), so that a table read at random or
/// scanned is read from the disk once, not once per cache's worth.
pub const KV_CACHE_BLOCKS: usize = 512;

/// Write-behind run of table files, in blocks (1 MiB at 8 KiB blocks):
/// see [`EnvConfig::write_behind`].
pub const KV_WRITE_BEHIND: usize = 128;

/// Settings of an [`AccelEnv`].
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// Blocks of each open file's cache ([`KV_CACHE_BLOCKS`] by default;
    /// AccelFS's own default is 16).
    pub cache_blocks: usize,
    /// Blocks all open files' caches hold together
    /// (`Fs::set_cache_budget`; AccelFS's default, 8192, is 64 MiB at 8 KiB
    /// blocks).
    pub cache_budget: usize,
    /// What the engine's sync does ([`SyncMode::Hard`] by default).
    pub sync: SyncMode,
    /// Write-behind for table files (AccelFS's `Fs::set_write_behind`):
    /// runs of this many whole blocks are started on the disk while the
    /// engine is still writing the table, so its sync waits only for the
    /// end ([`KV_WRITE_BEHIND`] by default, at most 1 MiB's worth; 0: off).
    pub write_behind: usize,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            cache_blocks: KV_CACHE_BLOCKS,
            cache_budget: iolift_direct::fs::DEFAULT_CACHE_BUDGET,
            sync: SyncMode::Hard,
            write_behind: KV_WRITE_BEHIND,
        }
    }
}

/// rusty-leveldb's `Env` on a mounted AccelFS. Clones share the file
/// system.
#[derive(Clone)]
pub struct AccelEnv {
    inner: Rc<Inner>,
}

/// Locks `image` (an image file or block device) with flock(2) against a
/// second process; the lock lasts as long as the returned file.
pub fn lock_image(image: &Path) -> io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new().read(true).open(image)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("{}: in use by another process ({e})", image.display()),
        ));
    }
    Ok(f)
}

fn path_str(p: &Path) -> io::Result<&str> {
    p.to_str().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not UTF-8", p.display()),
        )
    })
}

fn status(e: io::Error) -> Status {
    match e.kind() {
        io::ErrorKind::AlreadyExists => Status::new(StatusCode::AlreadyExists, &e.to_string()),
        _ => Status::from(e),
    }
}

impl AccelEnv {
    /// An environment on a mounted file system; `image_lock` (see
    /// [`lock_image`]) is held until [`Self::unmount`].
    pub fn new(mut fs: Fs, cfg: &EnvConfig, image_lock: Option<std::fs::File>) -> AccelEnv {
        fs.set_cache_blocks(cfg.cache_blocks);
        fs.set_cache_budget(cfg.cache_budget);
        AccelEnv {
            inner: Rc::new(Inner::new(fs, cfg.sync, cfg.write_behind, image_lock)),
        }
    }

    /// Soft-syncs every open file, then unmounts (a device flush). Call it
    /// once the database is dropped; later calls fail.
    pub fn unmount(&self) -> io::Result<()> {
        // Kept closed files included: `kept` holds them, so they upgrade.
        let open: Vec<_> = self
            .inner
            .open
            .borrow_mut()
            .drain()
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        self.inner.drop_kept();
        let fs = self.inner.fs.borrow_mut().take().ok_or_else(unmounted)?;
        let mut fs = fs;
        for s in open {
            let mut o = s.borrow_mut();
            if !o.gone {
                fs.sync_soft(&mut o.file)?;
                o.gone = true;
            }
        }
        fs.unmount().map(drop)
    }

    /// Runs `f` on the file system (e.g. fsck after the database closed).
    pub fn with_fs<T>(&self, f: impl FnOnce(&mut Fs) -> io::Result<T>) -> io::Result<T> {
        self.inner.with_fs(f)
    }

    fn writer(&self, p: &Path, truncate: bool) -> io::Result<Handle> {
        let path = path_str(p)?;
        let exists = self.inner.with_fs(|fs| match fs.stat(path) {
            Ok(st) if st.kind == layout::KIND_DIR => Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{path}: a directory"),
            )),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs.create(path)?;
                Ok(false)
            }
            Err(e) => Err(e),
        })?;
        let h = self.inner.handle(path)?;
        if exists && truncate {
            h.truncate()?;
        }
        // Tables are written from start to end and synced once, at the
        // end: their data can go to the disk while the engine works.
        let table = p.extension().is_some_and(|e| e == "ldb" || e == "sst");
        if table && self.inner.write_behind > 0 {
            h.set_write_behind(self.inner.write_behind)?;
        }
        Ok(h)
    }

    fn mkdir_all(&self, path: &str) -> io::Result<()> {
        let mut at = String::new();
        for part in path.split('/').filter(|s| !s.is_empty()) {
            at.push('/');
            at.push_str(part);
            self.inner.with_fs(|fs| match fs.stat(&at) {
                Ok(st) if st.kind == layout::KIND_DIR => Ok(()),
                Ok(_) => Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{at}: exists and is not a directory"),
                )),
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs.mkdir(&at).map(drop),
                Err(e) => Err(e),
            })?;
        }
        Ok(())
    }
}

impl Env for AccelEnv {
    fn open_sequential_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn Read>> {
        let h = self.inner.handle(path_str(p)?).map_err(status)?;
        Ok(Box::new(h))
    }

    fn open_random_access_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn RandomAccess>> {
        let h = self.inner.handle(path_str(p)?).map_err(status)?;
        Ok(Box::new(h))
    }

    fn open_writable_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn Write>> {
        Ok(Box::new(self.writer(p, true).map_err(status)?))
    }

    fn open_appendable_file(&self, p: &Path) -> rusty_leveldb::Result<Box<dyn Write>> {
        Ok(Box::new(self.writer(p, false).map_err(status)?))
    }

    fn exists(&self, p: &Path) -> rusty_leveldb::Result<bool> {
        let path = path_str(p)?;
        self.inner
            .with_fs(|fs| match fs.lookup(path) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
            })
            .map_err(status)
    }

    fn children(&self, p: &Path) -> rusty_leveldb::Result<Vec<PathBuf>> {
        let path = path_str(p)?;
        let list = self.inner.with_fs(|fs| fs.list(path)).map_err(status)?;
        Ok(list.into_iter().map(|d| PathBuf::from(d.name)).collect())
    }

    fn size_of(&self, p: &Path) -> rusty_leveldb::Result<usize> {
        let path = path_str(p)?;
        let st = self.inner.with_fs(|fs| fs.stat(path)).map_err(status)?;
        // An open file's size includes its unsynced writes.
        let size = match self.inner.shared(st.ino) {
            Some(s) => s.borrow().file.size(),
            None => st.size,
        };
        Ok(size as usize)
    }

    fn delete(&self, p: &Path) -> rusty_leveldb::Result<()> {
        let path = path_str(p)?;
        let st = self.inner.with_fs(|fs| fs.stat(path)).map_err(status)?;
        if st.kind == layout::KIND_DIR {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                &format!("{path}: a directory (use rmdir)"),
            ));
        }
        self.inner.forget(st.ino);
        self.inner.with_fs(|fs| fs.remove(path)).map_err(status)
    }

    fn mkdir(&self, p: &Path) -> rusty_leveldb::Result<()> {
        self.mkdir_all(path_str(p)?).map_err(status)
    }

    fn rmdir(&self, p: &Path) -> rusty_leveldb::Result<()> {
        let path = path_str(p)?;
        for c in self.children(p)? {
            self.delete(&p.join(c))?;
        }
        self.inner.with_fs(|fs| fs.remove(path)).map_err(status)
    }

    fn rename(&self, from: &Path, to: &Path) -> rusty_leveldb::Result<()> {
        let (from, to) = (path_str(from)?, path_str(to)?);
        self.inner
            .with_fs(|fs| {
                let src = fs.lookup(from)?;
                if let Ok(st) = fs.stat(to) {
                    if src != st.ino {
                        self.inner.forget(st.ino);
                    }
                }
                // Its bytes on the disk before the new name is.
                self.inner.sync_if_open(fs, src)?;
                fs.rename(from, to)
            })
            .map_err(status)
    }

    fn lock(&self, p: &Path) -> rusty_leveldb::Result<FileLock> {
        let path = path_str(p)?.to_string();
        if !self.inner.locks.borrow_mut().insert(path.clone()) {
            return Err(Status::new(
                StatusCode::LockError,
                &format!("{path}: lock is held"),
            ));
        }
        // The engine expects the lock file to exist.
        drop(self.writer(p, false).map_err(status)?);
        Ok(FileLock { id: path })
    }

    fn unlock(&self, l: FileLock) -> rusty_leveldb::Result<()> {
        if !self.inner.locks.borrow_mut().remove(&l.id) {
            return Err(Status::new(
                StatusCode::LockError,
                &format!("{}: not locked", l.id),
            ));
        }
        Ok(())
    }

    fn new_logger(&self, p: &Path) -> rusty_leveldb::Result<Logger> {
        Ok(Logger::new(Box::new(
            self.writer(p, false).map_err(status)?,
        )))
    }

    fn micros(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }

    fn sleep_for(&self, micros: u32) {
        std::thread::sleep(std::time::Duration::from_micros(micros as u64));
    }
}
