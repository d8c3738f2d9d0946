//! Open files of [`crate::AccelEnv`]: one AccelFS `File` (with its
//! buffer cache) per inode, shared by every handle the engine holds on it,
//! and kept after the last handle goes.
//!
//! A file whose last handle went keeps its cache, dirty blocks included,
//! as the host's page cache keeps a closed file's pages: the engine
//! writes a table, closes it and opens it again to read it, and a table
//! that falls out of the engine's table cache is opened again later; and
//! the engine closes its old log and deletes it right after, so a log
//! that is never synced need never be written. A kept file is
//! soft-synced (dirty blocks, then its inode) when it is dropped: oldest
//! first once all caches together hold more than the file system's cache
//! budget, and at unmount; before it is renamed; never when it is removed
//! or replaced (its blocks are freed). What the engine syncs is on the
//! disk as before; what it did not sync may be lost on a crash, as with
//! any file system's page cache (the kernel's survives a killed process,
//! this one does not).

use crate::sync::SyncMode;
use iolift_direct::fs::{File, Fs};
use rusty_leveldb::env::RandomAccess;
use rusty_leveldb::Status;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::rc::{Rc, Weak};

/// An open file; `gone` once its name was removed or replaced (its inode
/// may be reused, so it is never written again).
pub(crate) struct OpenFile {
    pub file: File,
    pub gone: bool,
    /// Handles on it now (0: kept closed, in `Inner::kept`).
    handles: usize,
}

pub(crate) type Shared = Rc<RefCell<OpenFile>>;

/// The state behind an `AccelEnv` and all its handles.
pub(crate) struct Inner {
    /// None once unmounted.
    pub fs: RefCell<Option<Fs>>,
    /// Open files by inode.
    pub open: RefCell<HashMap<u32, Weak<RefCell<OpenFile>>>>,
    pub locks: RefCell<HashSet<String>>,
    /// What a handle's `flush` (the engine's sync) does.
    sync: SyncMode,
    /// Write-behind run of table files, in blocks (0: off).
    pub write_behind: usize,
    /// Closed files whose caches are kept, by inode, and the order they
    /// were closed in (an inode may appear there after it left `kept`).
    kept: RefCell<HashMap<u32, Shared>>,
    kept_order: RefCell<VecDeque<u32>>,
    /// flock(2) on the image, held while mounted.
    pub _image_lock: Option<std::fs::File>,
}

pub(crate) fn unmounted() -> io::Error {
    io::Error::other("the key-value store's file system is unmounted")
}

impl Inner {
    pub fn with_fs<T>(&self, f: impl FnOnce(&mut Fs) -> io::Result<T>) -> io::Result<T> {
        let mut g = self.fs.borrow_mut();
        let fs = g.as_mut().ok_or_else(unmounted)?;
        f(fs)
    }

    /// The open file of `ino`, if a handle holds it.
    pub fn shared(&self, ino: u32) -> Option<Shared> {
        self.open.borrow().get(&ino).and_then(Weak::upgrade)
    }

    pub fn new(
        fs: Fs,
        sync: SyncMode,
        write_behind: usize,
        image_lock: Option<std::fs::File>,
    ) -> Inner {
        Inner {
            sync,
            write_behind,
            fs: RefCell::new(Some(fs)),
            open: RefCell::new(Default::default()),
            locks: RefCell::new(Default::default()),
            kept: RefCell::new(Default::default()),
            kept_order: RefCell::new(Default::default()),
            _image_lock: image_lock,
        }
    }

    /// Forgets every kept closed file (at unmount, after they were synced).
    pub fn drop_kept(&self) {
        self.kept_order.borrow_mut().clear();
        let kept: Vec<_> = self.kept.borrow_mut().drain().collect();
        for (ino, _) in kept {
            self.open.borrow_mut().remove(&ino);
        }
    }

    /// Soft-syncs and drops kept closed files, oldest first, while all
    /// caches together hold more than the file system's budget.
    fn trim(&self, fs: &mut Fs) -> io::Result<()> {
        while fs.cached_blocks() > fs.cache_budget() {
            let Some(ino) = self.kept_order.borrow_mut().pop_front() else {
                return Ok(());
            };
            let kept = self.kept.borrow_mut().remove(&ino);
            if let Some(s) = kept {
                self.open.borrow_mut().remove(&ino);
                let mut o = s.borrow_mut();
                if !o.gone {
                    fs.sync_soft(&mut o.file)?;
                }
            }
        }
        Ok(())
    }

    /// Soft-syncs the open or kept file of `ino`, if any (before a rename
    /// makes its name the one the engine reads).
    pub fn sync_if_open(&self, fs: &mut Fs, ino: u32) -> io::Result<()> {
        match self.shared(ino) {
            Some(s) => fs.sync_soft(&mut s.borrow_mut().file),
            None => Ok(()),
        }
    }

    /// Marks the open file of `ino` (if any) as gone.
    pub fn forget(&self, ino: u32) {
        self.kept.borrow_mut().remove(&ino);
        if let Some(s) = self
            .open
            .borrow_mut()
            .remove(&ino)
            .and_then(|w| w.upgrade())
        {
            s.borrow_mut().gone = true;
        }
    }

    /// A handle on `path`, sharing the open file when there is one.
    pub fn handle(self: &Rc<Self>, path: &str) -> io::Result<Handle> {
        let f = self.with_fs(|fs| {
            let ino = fs.lookup(path)?;
            if let Some(s) = self.shared(ino) {
                s.borrow_mut().handles += 1;
                self.kept.borrow_mut().remove(&ino);
                return Ok(s);
            }
            self.trim(fs)?;
            let s = Rc::new(RefCell::new(OpenFile {
                file: fs.open(path)?,
                gone: false,
                handles: 1,
            }));
            self.open.borrow_mut().insert(ino, Rc::downgrade(&s));
            Ok(s)
        })?;
        Ok(Handle {
            env: self.clone(),
            f,
            pos: 0,
            path: path.to_string(),
        })
    }
}

/// One handle: a sequential reader (its own position), a random-access
/// reader, or an appending writer (`flush` is a hard or soft sync, as
/// the environment's [`SyncMode`] says).
pub(crate) struct Handle {
    env: Rc<Inner>,
    f: Shared,
    pos: u64,
    path: String,
}

impl Handle {
    fn run<T>(&self, op: impl FnOnce(&mut Fs, &mut File) -> io::Result<T>) -> io::Result<T> {
        let mut o = self.f.borrow_mut();
        if o.gone {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: removed while open", self.path),
            ));
        }
        self.env
            .with_fs(|fs| op(fs, &mut o.file))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path)))
    }

    pub fn truncate(&self) -> io::Result<()> {
        self.run(|fs, f| fs.truncate(f))
    }

    /// Write-behind in runs of `blocks` blocks from the file's end on.
    pub fn set_write_behind(&self, blocks: usize) -> io::Result<()> {
        self.run(|fs, f| {
            fs.set_write_behind(f, blocks);
            Ok(())
        })
    }
}

impl io::Read for Handle {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let pos = self.pos;
        let n = self.run(|fs, f| fs.read(f, pos, buf))?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl RandomAccess for Handle {
    fn read_at(&self, off: usize, dst: &mut [u8]) -> rusty_leveldb::Result<usize> {
        self.run(|fs, f| fs.read(f, off as u64, dst))
            .map_err(Status::from)
    }
}

impl io::Write for Handle {
    /// Appends (rusty-leveldb only appends).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.run(|fs, f| {
            let end = f.size();
            fs.write(f, end, buf)
        })?;
        Ok(buf.len())
    }

    /// The engine's sync: AccelFS's hard sync (dirty blocks, the inode, a
    /// device flush) or soft sync (the same without the device flush).
    fn flush(&mut self) -> io::Result<()> {
        match self.env.sync {
            SyncMode::Hard => self.run(|fs, f| fs.sync_hard(f)),
            SyncMode::Soft => self.run(|fs, f| fs.sync_soft(f)),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let mut o = self.f.borrow_mut();
        o.handles -= 1;
        if o.handles > 0 || o.gone {
            return;
        }
        let ino = o.file.ino();
        drop(o);
        // Kept, dirty blocks and all, for a later open; synced when it is
        // dropped (trimmed to the budget below, or at unmount).
        self.env.kept.borrow_mut().insert(ino, self.f.clone());
        {
            let mut order = self.env.kept_order.borrow_mut();
            order.push_back(ino);
            // Bounded: past twice the kept files (plus a margin), keep
            // only the last entry of each file still kept.
            let kept = self.env.kept.borrow();
            if order.len() > 2 * kept.len() + 64 {
                let mut seen = HashSet::new();
                let mut v: Vec<u32> = order
                    .iter()
                    .rev()
                    .filter(|i| kept.contains_key(i) && seen.insert(**i))
                    .copied()
                    .collect();
                v.reverse();
                *order = v.into();
            }
        }
        if let Ok(mut g) = self.env.fs.try_borrow_mut() {
            if let Some(fs) = g.as_mut() {
                // A failure here has no caller to go to; that file's
                // unsynced data stays unsynced, as after a crash.
                let _ = self.env.trim(fs);
            }
        }
    }
}
