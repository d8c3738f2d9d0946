//! The FUSE wire format as the virtio-fs transport carries it: opcode and
//! flag numbers, a bounds-checked little-endian reader for request bodies
//! ([`In`]) and a writer for reply bodies ([`Out`]) with the encodings of
//! the reply structures. Numbers and layouts are those of the kernel's
//! FUSE protocol 7.x (include/uapi/linux/fuse.h).

use crate::model::{Attr, Entry, StatFs};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Protocol version answered to INIT: 7.36 or the kernel's, if older.
pub const MAJOR: u32 = 7;
pub const MAX_MINOR: u32 = 36;
/// The oldest minor version served (virtio-fs clients are all newer).
pub const MIN_MINOR: u32 = 27;

pub const IN_HEADER_LEN: usize = 40;
pub const OUT_HEADER_LEN: usize = 16;
pub const ATTR_LEN: usize = 88;
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
pub const DIRENT_LEN: usize = 24;

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
}

/// INIT flags (fuse_init_in/out `flags`).
pub mod init {
    pub const ASYNC_READ: u32 = 1 << 0;
    pub const BIG_WRITES: u32 = 1 << 5;
    pub const DONT_MASK: u32 = 1 << 6;
    pub const DO_READDIRPLUS: u32 = 1 << 13;
    pub const READDIRPLUS_AUTO: u32 = 1 << 14;
    pub const ASYNC_DIO: u32 = 1 << 15;
    pub const WRITEBACK_CACHE: u32 = 1 << 16;
    pub const PARALLEL_DIROPS: u32 = 1 << 18;
    pub const MAX_PAGES: u32 = 1 << 22;
    pub const HANDLE_KILLPRIV_V2: u32 = 1 << 28;
}

/// fuse_setattr_in `valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

pub const GETATTR_FH: u32 = 1 << 0;
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;

/// A request body being read: every read checks the bounds, so a short
/// or malformed body gives `None`, never a panic.
pub struct In<'a> {
    b: &'a [u8],
}

impl<'a> In<'a> {
    pub fn new(b: &'a [u8]) -> In<'a> {
        In { b }
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }

    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }

    pub fn skip(&mut self, n: usize) -> Option<()> {
        self.bytes(n).map(|_| ())
    }

    /// A NUL-terminated string (without its NUL).
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let n = self.b.iter().position(|&c| c == 0)?;
        let s = self.bytes(n)?;
        self.skip(1)?;
        Some(s)
    }

    /// How many bytes are left.
    pub fn rest_len(&self) -> usize {
        self.b.len()
    }

    /// What is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
}

/// A reply body being built.
#[derive(Default)]
pub struct Out {
    pub buf: Vec<u8>,
}

impl Out {
    pub fn with_capacity(n: usize) -> Out {
        Out {
            buf: Vec::with_capacity(n),
        }
    }

    pub fn u16(&mut self, v: u16) -> &mut Out {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Out {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Out {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn zeros(&mut self, n: usize) -> &mut Out {
        self.buf.resize(self.buf.len() + n, 0);
        self
    }

    /// fuse_attr.
    pub fn attr(&mut self, a: &Attr) -> &mut Out {
        let (at, atn) = secs(a.atime);
        let (mt, mtn) = secs(a.mtime);
        let (ct, ctn) = secs(a.ctime);
        self.u64(a.ino).u64(a.size).u64(a.blocks);
        self.u64(at).u64(mt).u64(ct).u32(atn).u32(mtn).u32(ctn);
        self.u32(a.mode).u32(a.nlink).u32(a.uid).u32(a.gid);
        self.u32(a.rdev).u32(a.blksize).u32(0)
    }

    /// fuse_entry_out.
    pub fn entry(&mut self, e: &Entry) -> &mut Out {
        let (s, n) = ttl(e.ttl);
        self.u64(e.attr.ino)
            .u64(e.generation)
            .u64(s)
            .u64(s)
            .u32(n)
            .u32(n);
        self.attr(&e.attr)
    }

    /// fuse_attr_out.
    pub fn attr_out(&mut self, a: &Attr, t: Duration) -> &mut Out {
        let (s, n) = ttl(t);
        self.u64(s).u32(n).u32(0).attr(a)
    }

    /// fuse_open_out.
    pub fn open_out(&mut self, fh: u64, flags: u32) -> &mut Out {
        self.u64(fh).u32(flags).u32(0)
    }

    /// fuse_statfs_out (fuse_kstatfs).
    pub fn statfs(&mut self, s: &StatFs) -> &mut Out {
        self.u64(s.blocks)
            .u64(s.bfree)
            .u64(s.bavail)
            .u64(s.files)
            .u64(s.ffree);
        self.u32(s.bsize)
            .u32(s.namelen)
            .u32(s.frsize)
            .u32(0)
            .zeros(24)
    }

    /// fuse_dirent plus its name, padded to 8 bytes.
    pub fn dirent(&mut self, ino: u64, off: u64, kind: u32, name: &[u8]) -> &mut Out {
        self.u64(ino)
            .u64(off)
            .u32(name.len() as u32)
            .u32(kind >> 12);
        self.buf.extend_from_slice(name);
        self.zeros(pad8(name.len()))
    }
}

/// Bytes of padding after `n` to reach a multiple of 8.
pub fn pad8(n: usize) -> usize {
    (8 - n % 8) % 8
}

/// Seconds and nanoseconds since the epoch (0 for earlier times).
fn secs(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(_) => (0, 0),
    }
}

fn ttl(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_stops_at_the_end_instead_of_panicking() {
        let mut r = In::new(&[1, 0, 0, 0, 2, 0, b'a', b'b', 0, 9]);
        assert_eq!(r.u32(), Some(1));
        assert_eq!(r.u16(), Some(2));
        assert_eq!(r.cstr(), Some(&b"ab"[..]));
        assert_eq!(r.u32(), None);
        assert_eq!(r.rest(), &[9]);
        assert_eq!(In::new(b"no nul").cstr(), None);
        assert_eq!(In::new(&[]).u64(), None);
    }

    #[test]
    fn reply_structures_have_the_kernel_sizes() {
        let a = Attr {
            ino: 5,
            size: 1,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        };
        let mut o = Out::default();
        o.attr(&a);
        assert_eq!(o.buf.len(), ATTR_LEN);
        let e = Entry {
            attr: a,
            generation: 0,
            ttl: Duration::from_millis(1500),
        };
        let mut o = Out::default();
        o.entry(&e);
        assert_eq!(o.buf.len(), ENTRY_OUT_LEN);
        assert_eq!(&o.buf[16..24], &1u64.to_le_bytes());
        assert_eq!(&o.buf[32..36], &500_000_000u32.to_le_bytes());
        let mut o = Out::default();
        o.statfs(&StatFs::default());
        assert_eq!(o.buf.len(), 80);
        let mut o = Out::default();
        o.dirent(1, 2, libc::S_IFDIR, b"abc");
        assert_eq!(o.buf.len(), 32);
        assert_eq!(&o.buf[20..24], &4u32.to_le_bytes());
    }
}
