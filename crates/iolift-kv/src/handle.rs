//! Open files of [`crate::AccelEnv`]: one AccelFS `File` (with its
//! buffer cache) per inode, shared by every handle the engine holds on it,
//! soft-synced when the last handle goes.

use iolift_direct::fs::{File, Fs};
use rusty_leveldb::env::RandomAccess;
use rusty_leveldb::Status;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io;
use std::rc::{Rc, Weak};

/// An open file; `gone` once its name was removed or replaced (its inode
/// may be reused, so it is never written again).
pub(crate) struct OpenFile {
    pub file: File,
    pub gone: bool,
}

pub(crate) type Shared = Rc<RefCell<OpenFile>>;

/// The state behind an `AccelEnv` and all its handles.
pub(crate) struct Inner {
    /// None once unmounted.
    pub fs: RefCell<Option<Fs>>,
    /// Open files by inode.
    pub open: RefCell<HashMap<u32, Weak<RefCell<OpenFile>>>>,
    pub locks: RefCell<HashSet<String>>,
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

    /// Marks the open file of `ino` (if any) as gone.
    pub fn forget(&self, ino: u32) {
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
                return Ok(s);
            }
            let s = Rc::new(RefCell::new(OpenFile {
                file: fs.open(path)?,
                gone: false,
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
/// reader, or an appending writer (`flush` is a hard sync).
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

    /// AccelFS's hard sync: dirty blocks, the inode, a device flush.
    fn flush(&mut self) -> io::Result<()> {
        self.run(|fs, f| fs.sync_hard(f))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if Rc::strong_count(&self.f) > 1 {
            return;
        }
        let mut o = self.f.borrow_mut();
        if o.gone {
            return;
        }
        let ino = o.file.ino();
        self.env.open.borrow_mut().remove(&ino);
        // Close: a soft sync. A failure here has no caller to go to; the
        // data stays unsynced, as after a crash.
        let _ = self.env.with_fs(|fs| fs.sync_soft(&mut o.file));
    }
}
