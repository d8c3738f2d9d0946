//! The `null` backend: every operation succeeds at once, reads return
//! zeros, writes are dropped. What it measures is the framework's own
//! cost per operation (front-end, kernel, request model), nothing else.
//!
//! Its tree: the root directory (node 1), and behind every name looked up
//! or created in it one regular file of `size` bytes (node 2); mkdir
//! answers with a directory (node 3) that behaves like the root.

use crate::fs::FileSystem;
use crate::model::*;
use bytes::Bytes;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::time::{Duration, SystemTime};

const FILE: u64 = 2;
const DIR: u64 = 3;
/// Reads are answered from this buffer (no allocation per read).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// The null backend; `size` is the size every file claims.
pub struct NullFs {
    size: u64,
    start: SystemTime,
}

impl NullFs {
    pub fn new(size: u64) -> NullFs {
        NullFs {
            size,
            start: SystemTime::now(),
        }
    }

    fn attr(&self, ino: u64) -> Attr {
        let (mode, size, nlink) = if ino == FILE {
            (libc::S_IFREG | 0o644, self.size, 1)
        } else {
            (libc::S_IFDIR | 0o755, 4096, 2)
        };
        Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.start,
            mtime: self.start,
            ctime: self.start,
            mode,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        }
    }

    fn entry(&self, ino: u64) -> Entry {
        Entry {
            attr: self.attr(ino),
            generation: 0,
            ttl: Duration::from_secs(1),
        }
    }
}

impl FileSystem for NullFs {
    fn name(&self) -> String {
        "null".into()
    }
    fn lookup(&self, _: &Ctx, _: u64, name: &OsStr, done: Done<Entry>) {
        done.send(check_name(name).map(|_| self.entry(FILE)))
    }
    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>, done: Done<Attr>) {
        done.ok(self.attr(ino))
    }
    fn setattr(&self, _: &Ctx, ino: u64, _: SetAttr, done: Done<Attr>) {
        done.ok(self.attr(ino))
    }
    fn readlink(&self, _: &Ctx, _: u64, done: Done<Vec<u8>>) {
        done.err(Errno::EINVAL)
    }
    fn symlink(&self, _: &Ctx, _: u64, name: &OsStr, _: &Path, done: Done<Entry>) {
        done.send(check_name(name).map(|_| self.entry(FILE)))
    }
    fn mknod(&self, _: &Ctx, _: u64, name: &OsStr, _: u32, _: u32, done: Done<Entry>) {
        done.send(check_name(name).map(|_| self.entry(FILE)))
    }
    fn mkdir(&self, _: &Ctx, _: u64, name: &OsStr, _: u32, done: Done<Entry>) {
        done.send(check_name(name).map(|_| self.entry(DIR)))
    }
    fn unlink(&self, _: &Ctx, _: u64, _: &OsStr, done: Done<()>) {
        done.ok(())
    }
    fn rmdir(&self, _: &Ctx, _: u64, _: &OsStr, done: Done<()>) {
        done.ok(())
    }
    fn rename(&self, _: &Ctx, _: u64, _: &OsStr, _: u64, n: &OsStr, _: u32, done: Done<()>) {
        done.send(check_name(n))
    }
    fn link(&self, _: &Ctx, _: u64, _: u64, name: &OsStr, done: Done<Entry>) {
        done.send(check_name(name).map(|_| self.entry(FILE)))
    }
    fn open(&self, _: &Ctx, _: u64, _: i32, done: Done<Opened>) {
        done.ok(Opened::handle(0))
    }
    fn read(&self, _: &Ctx, _: u64, _: u64, offset: u64, size: u32, done: Done<Bytes>) {
        let n = (size as u64)
            .min(self.size.saturating_sub(offset))
            .min(ZEROS.len() as u64) as usize;
        done.ok(Bytes::from_static(&ZEROS[..n]))
    }
    fn write(&self, _: &Ctx, _: u64, _: u64, _: u64, data: &[u8], _: bool, done: Done<u32>) {
        done.ok(data.len() as u32)
    }
    fn handles_killpriv(&self) -> bool {
        true
    }
    fn fsync(&self, _: &Ctx, _: u64, _: u64, _: bool, done: Done<()>) {
        done.ok(())
    }
    fn opendir(&self, _: &Ctx, _: u64, _: i32, done: Done<Opened>) {
        done.ok(Opened::handle(0))
    }
    fn readdir(&self, _: &Ctx, ino: u64, _: u64, off: u64, _: usize, done: Done<Vec<DirEntry>>) {
        let all = [(ino, "."), (ROOT, "..")];
        let v = all
            .iter()
            .enumerate()
            .skip(off as usize)
            .map(|(i, (ino, n))| DirEntry {
                ino: *ino,
                offset: i as u64 + 1,
                kind: libc::S_IFDIR,
                name: OsString::from(n),
            })
            .collect();
        done.ok(v)
    }
    fn readdirplus(
        &self,
        c: &Ctx,
        ino: u64,
        fh: u64,
        off: u64,
        max: usize,
        done: Done<Vec<(DirEntry, Option<Entry>)>>,
    ) {
        self.readdir(
            c,
            ino,
            fh,
            off,
            max,
            Done::new(move |r: FsResult<Vec<DirEntry>>| {
                done.send(r.map(|v| v.into_iter().map(|e| (e, None)).collect()))
            }),
        )
    }
    fn fsyncdir(&self, _: &Ctx, _: u64, _: u64, _: bool, done: Done<()>) {
        done.ok(())
    }
    fn statfs(&self, _: &Ctx, _: u64, done: Done<StatFs>) {
        done.ok(StatFs {
            blocks: 1 << 30,
            bfree: 1 << 30,
            bavail: 1 << 30,
            files: 1 << 20,
            ffree: 1 << 20,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }
    fn create(&self, _: &Ctx, _: u64, name: &OsStr, _: u32, _: i32, done: Done<(Entry, Opened)>) {
        done.send(check_name(name).map(|_| (self.entry(FILE), Opened::handle(0))))
    }
    fn fallocate(&self, _: &Ctx, _: u64, _: u64, _: u64, _: u64, _: i32, done: Done<()>) {
        done.ok(())
    }
    fn lseek(&self, _: &Ctx, _: u64, _: u64, off: i64, _: i32, done: Done<i64>) {
        done.ok(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn call<T: Send + 'static>(f: impl FnOnce(Done<T>)) -> FsResult<T> {
        let (tx, rx) = mpsc::channel();
        f(Done::new(move |r| tx.send(r).unwrap()));
        rx.recv().unwrap()
    }

    #[test]
    fn reads_are_zeros_up_to_the_size_and_names_are_checked() {
        let fs = NullFs::new(10_000);
        let c = Ctx::default();
        let e = call(|d| fs.lookup(&c, ROOT, OsStr::new("f"), d)).unwrap();
        assert_eq!(e.attr.size, 10_000);
        assert_eq!(e.attr.kind(), libc::S_IFREG);
        let b = call(|d| fs.read(&c, e.attr.ino, 0, 8192, 4096, d)).unwrap();
        assert_eq!(b.len(), 10_000 - 8192);
        assert!(b.iter().all(|&x| x == 0));
        let long = "n".repeat(256);
        assert_eq!(
            call(|d| fs.lookup(&c, ROOT, OsStr::new(&long), d)).unwrap_err(),
            Errno::ENAMETOOLONG
        );
    }
}
