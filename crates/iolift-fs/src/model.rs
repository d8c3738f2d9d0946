//! The request model's values: errnos, attributes, entries, directory
//! entries, open results, and [`Done`], the completion every operation
//! takes (called at once or later, from any thread).

use std::ffi::OsString;
use std::fmt;
use std::time::{Duration, SystemTime};

/// A positive errno value (`libc::ENOENT`, ...): what an operation fails with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENFILE: Errno = Errno(libc::ENFILE);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTSUP: Errno = Errno(libc::EOPNOTSUPP);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const ERANGE: Errno = Errno(libc::ERANGE);

    /// The errno of an I/O error (EIO when it carries none).
    pub fn from_io(e: &std::io::Error) -> Errno {
        match e.raw_os_error() {
            Some(n) if n > 0 => Errno(n),
            _ => Errno::EIO,
        }
    }

    /// The errno the last failed system call left on this thread.
    pub fn last() -> Errno {
        Errno::from_io(&std::io::Error::last_os_error())
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            std::io::Error::from_raw_os_error(self.0),
            self.0
        )
    }
}

/// The result of one operation.
pub type FsResult<T> = Result<T, Errno>;

/// Who sent a request (the kernel's view of the calling process).
#[derive(Clone, Copy, Debug, Default)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The node id of the root directory; every backend has it.
pub const ROOT: u64 = 1;

/// File type bits, as in `st_mode & S_IFMT`.
pub type Mode = u32;

/// A file's attributes, as `stat(2)` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The node id the front-end knows the file by (not the host inode).
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Type and permission bits (`st_mode`).
    pub mode: Mode,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    /// Attributes for an entry that carries none (`.` and `..` of
    /// readdirplus), which the kernel will not cache: only the node id
    /// matters.
    pub fn placeholder(ino: u64) -> Attr {
        Attr {
            ino,
            size: 0,
            blocks: 0,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            mode: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        }
    }

    /// The type bits (`S_IFREG`, `S_IFDIR`, ...).
    pub fn kind(&self) -> Mode {
        self.mode & libc::S_IFMT
    }
}

/// The answer to a lookup (and to mknod, mkdir, symlink, link, create):
/// the node, its attributes and how long the kernel may cache them.
/// Each successful answer counts one lookup that a `forget` gives back.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub attr: Attr,
    pub generation: u64,
    pub ttl: Duration,
}

/// A time to set: the request's own time, or the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    At(SystemTime),
    Now,
}

/// What a `setattr` changes; `None` fields stay as they are (UTIME_OMIT
/// for the times).
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The open file the change comes through (ftruncate), if any.
    pub fh: Option<u64>,
}

/// One directory entry. `offset` is the cookie that resumes the listing
/// after this entry.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub ino: u64,
    pub offset: u64,
    /// Type bits (`S_IFREG`, ...), 0 when unknown.
    pub kind: Mode,
    pub name: OsString,
}

/// `statfs(2)`'s numbers.
#[derive(Clone, Copy, Debug, Default)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// The answer to open, opendir and create.
#[derive(Debug)]
pub struct Opened {
    /// The handle later requests on this open file carry.
    pub fh: u64,
    /// Bypass the kernel's page cache for this file.
    pub direct_io: bool,
    /// Keep the kernel's cached pages from earlier opens.
    pub keep_cache: bool,
    /// A host fd the kernel may read and write directly (FUSE
    /// passthrough); the front-end registers it if it can and keeps it
    /// registered until `release`.
    pub passthrough: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

impl Opened {
    pub fn handle(fh: u64) -> Opened {
        Opened {
            fh,
            direct_io: false,
            keep_cache: false,
            passthrough: None,
        }
    }
}

/// The answer to getxattr/listxattr: the size the value needs (when the
/// request's size was 0) or the value.
#[derive(Debug)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// One operation's completion. Call it exactly once, from the thread that
/// got the request ("reply now") or from any other ("complete later").
/// A `Done` dropped without being called completes with EIO, so a backend
/// bug never leaves the kernel waiting.
pub struct Done<T> {
    f: Option<Box<dyn FnOnce(FsResult<T>) + Send>>,
}

impl<T> Done<T> {
    pub fn new(f: impl FnOnce(FsResult<T>) + Send + 'static) -> Done<T> {
        Done {
            f: Some(Box::new(f)),
        }
    }

    /// Completes with `r`.
    pub fn send(mut self, r: FsResult<T>) {
        if let Some(f) = self.f.take() {
            f(r)
        }
    }

    pub fn ok(self, v: T) {
        self.send(Ok(v))
    }

    pub fn err(self, e: Errno) {
        self.send(Err(e))
    }
}

impl<T> Drop for Done<T> {
    fn drop(&mut self) {
        if let Some(f) = self.f.take() {
            f(Err(Errno::EIO))
        }
    }
}

/// Checks one name component as a local file system would: not empty,
/// no `/` or NUL, not `.` or `..`, at most 255 bytes (ENAMETOOLONG: the
/// kernel forwards longer names to FUSE servers).
pub fn check_name(name: &std::ffi::OsStr) -> FsResult<()> {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    if b.len() > 255 {
        return Err(Errno::ENAMETOOLONG);
    }
    if b.is_empty() || b == b"." || b == b".." || b.iter().any(|&c| c == b'/' || c == 0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// `s` seconds and `ns` nanoseconds after the epoch (`ns` past a whole
/// second is taken as 999999999), or the epoch itself where the sum is
/// more than a `SystemTime` holds: a time from a request or a server
/// never panics.
pub fn epoch_time(s: u64, ns: u32) -> SystemTime {
    std::time::UNIX_EPOCH
        .checked_add(Duration::new(s, ns.min(999_999_999)))
        .unwrap_or(std::time::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::sync::mpsc;

    #[test]
    fn names_are_checked_like_a_local_file_system() {
        assert_eq!(check_name(OsStr::new("a")), Ok(()));
        assert_eq!(check_name(OsStr::new(&"x".repeat(255))), Ok(()));
        assert_eq!(
            check_name(OsStr::new(&"x".repeat(256))),
            Err(Errno::ENAMETOOLONG)
        );
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert_eq!(check_name(OsStr::new(bad)), Err(Errno::EINVAL), "{bad:?}");
        }
    }

    #[test]
    fn epoch_times_out_of_range_are_the_epoch() {
        let e = std::time::UNIX_EPOCH;
        assert_eq!(epoch_time(5, 7), e + Duration::new(5, 7));
        assert_eq!(epoch_time(5, u32::MAX), e + Duration::new(5, 999_999_999));
        assert_eq!(epoch_time(u64::MAX, 0), e);
        assert_eq!(epoch_time(i64::MAX as u64 + 1, 0), e);
    }

    #[test]
    fn done_completes_once_and_a_dropped_one_with_eio() {
        let (tx, rx) = mpsc::channel();
        let t2 = tx.clone();
        let d: Done<u32> = Done::new(move |r| t2.send(r).unwrap());
        std::thread::spawn(move || d.ok(7)).join().unwrap();
        assert_eq!(rx.recv().unwrap(), Ok(7));
        let d: Done<u32> = Done::new(move |r| tx.send(r).unwrap());
        drop(d);
        assert_eq!(rx.recv().unwrap(), Err(Errno::EIO));
        assert!(rx.try_recv().is_err());
    }
}
