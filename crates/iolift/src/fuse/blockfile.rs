//! The FUSE file system itself: a root directory holding one regular file
//! whose operations become block requests on the device (the table in
//! the parent module's doc).

use crate::block::{DevInfo, DevRef, Errno, Flags, IoFuture, Reply, Request};
use bytes::Bytes;
use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, WriteFlags,
};
use std::ffi::OsStr;
use std::future::Future;
use std::task::{Context as TaskCx, Poll, Waker};
use std::time::{Duration, SystemTime};

const ROOT: INodeNo = INodeNo(1);
const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(3600);
/// Largest trim/zero request handed to the device at once.
const CHUNK: u64 = 1 << 30;
/// Largest read/write the kernel sends (FUSE caps it at 256 pages anyway).
const MAX_IO: u32 = 1 << 20;

/// The filesystem: a root directory holding one file backed by `dev`.
pub(super) struct BlockFile {
    dev: DevRef,
    info: DevInfo,
    name: std::ffi::OsString,
    read_only: bool,
    rt: tokio::runtime::Handle,
    uid: u32,
    gid: u32,
    now: SystemTime,
}

fn to_fuse(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(if e.0 > 0 { e.0 } else { libc::EIO })
}

impl BlockFile {
    /// The file `name`, backed by `dev` (whose `info` it caches), owned by
    /// `owner` (uid, gid); completions that are not ready at once run on
    /// `rt`.
    pub(super) fn new(
        dev: DevRef,
        info: DevInfo,
        name: std::ffi::OsString,
        read_only: bool,
        rt: tokio::runtime::Handle,
        owner: (u32, u32),
    ) -> BlockFile {
        BlockFile {
            dev,
            info,
            name,
            read_only,
            rt,
            uid: owner.0,
            gid: owner.1,
            now: SystemTime::now(),
        }
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT {
            (FileType::Directory, 0o755, 0, 2)
        } else {
            let perm = if self.read_only { 0o400 } else { 0o600 };
            (FileType::RegularFile, perm, self.info.size, 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.now,
            mtime: self.now,
            ctime: self.now,
            crtime: self.now,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Runs `fut` to completion and hands its output to `done`: in place if
    /// it is ready at the first poll, else on the runtime.
    fn drive<T, F, D>(&self, fut: F, done: D)
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
        D: FnOnce(T) + Send + 'static,
    {
        let _g = self.rt.enter();
        let mut fut = Box::pin(fut);
        let mut cx = TaskCx::from_waker(Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => done(v),
            Poll::Pending => {
                self.rt.spawn(async move { done(fut.await) });
            }
        }
    }

    fn submit(&self, req: Request) -> IoFuture {
        let _g = self.rt.enter();
        self.dev.submit(req)
    }

    fn reply_empty(
        &self,
        fut: impl Future<Output = Result<(), Errno>> + Send + 'static,
        reply: ReplyEmpty,
    ) {
        self.drive(fut, move |r| match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(to_fuse(e)),
        });
    }

    fn flush_dev(&self, reply: ReplyEmpty) {
        if self.read_only || !self.info.can_flush {
            return reply.ok();
        }
        let f = self.submit(Request::Flush);
        self.reply_empty(async move { f.await.map(|_| ()) }, reply);
    }

    /// Trim or zero `[off, off+len)` in chunks the request model can carry.
    fn ranged(
        &self,
        off: u64,
        len: u64,
        zero: bool,
    ) -> impl Future<Output = Result<(), Errno>> + Send + 'static {
        let mut futs = Vec::new();
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let n = (end - pos).min(CHUNK) as u32;
            let req = if zero {
                Request::WriteZeroes {
                    offset: pos,
                    len: n,
                    flags: Flags {
                        no_hole: true,
                        ..Flags::NONE
                    },
                }
            } else {
                Request::Trim {
                    offset: pos,
                    len: n,
                    flags: Flags::NONE,
                }
            };
            futs.push(self.submit(req));
            pos += n as u64;
        }
        async move {
            let mut first = Ok(());
            for f in futs {
                if let Err(e) = f.await {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
            first
        }
    }
}

impl Filesystem for BlockFile {
    fn init(&mut self, _req: &fuser::Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Asynchronous direct I/O: the loop driver's aio keeps many requests
        // in flight instead of one per loop worker.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO) {
            tracing::warn!("FUSE: kernel lacks {missing:?}: direct I/O is synchronous");
        }
        let max = self.info.max_block.clamp(4096, MAX_IO);
        let _ = config.set_max_write(max);
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        Ok(())
    }

    fn lookup(&self, _req: &fuser::Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == self.name {
            reply.entry(&TTL, &self.attr(FILE), fuser::Generation(0));
        } else {
            reply.error(fuser::Errno::ENOENT);
        }
    }

    fn getattr(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        if ino == ROOT || ino == FILE {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(fuser::Errno::ENOENT);
        }
    }

    fn setattr(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != ROOT && ino != FILE {
            return reply.error(fuser::Errno::ENOENT);
        }
        // The size is the device's: no truncation (O_TRUNC, ftruncate).
        if let Some(s) = size {
            if ino != FILE || s != self.info.size {
                return reply.error(fuser::Errno::EPERM);
            }
        }
        // Mode, owner and times are fixed; accept and ignore (touch works).
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &fuser::Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(fuser::Errno::EISDIR);
        }
        if self.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(fuser::Errno::EROFS);
        }
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    fn read(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let dsize = self.info.size;
        if offset >= dsize || size == 0 {
            return reply.data(&[]);
        }
        let len = (size as u64).min(dsize - offset) as u32;
        let f = self.submit(Request::Read { offset, len });
        self.drive(f, move |r| match r {
            Ok(Reply::Data(d)) => reply.data(&d),
            Ok(_) => reply.error(fuser::Errno::EIO),
            Err(e) => reply.error(to_fuse(e)),
        });
    }

    fn write(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(fuser::Errno::EROFS);
        }
        let n = data.len() as u64;
        match offset.checked_add(n) {
            Some(end) if end <= self.info.size => {}
            _ => return reply.error(fuser::Errno::ENOSPC),
        }
        if n == 0 {
            return reply.written(0);
        }
        // O_SYNC/O_DSYNC opens ask for stable writes: FUA when the device
        // has it (the kernel also sends fsync afterwards).
        let sync = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let fl = if sync && self.info.can_fua {
            Flags::FUA
        } else {
            Flags::NONE
        };
        let f = self.submit(Request::Write {
            offset,
            data: Bytes::copy_from_slice(data),
            flags: fl,
        });
        self.drive(f, move |r| match r {
            Ok(_) => reply.written(n as u32),
            Err(e) => reply.error(to_fuse(e)),
        });
    }

    fn flush(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.flush_dev(reply);
    }

    fn fsync(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush_dev(reply);
    }

    fn fallocate(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if self.read_only {
            return reply.error(fuser::Errno::EROFS);
        }
        let size = self.info.size;
        let Some(end) = offset.checked_add(length) else {
            return reply.error(fuser::Errno::EINVAL);
        };
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let op = mode & !libc::FALLOC_FL_KEEP_SIZE;
        // Parts past the end: punch/zero there are no-ops with KEEP_SIZE;
        // growing the file is not possible.
        if end > size && !keep && op != libc::FALLOC_FL_PUNCH_HOLE {
            return reply.error(fuser::Errno::ENOSPC);
        }
        let end = end.min(size);
        let len = end.saturating_sub(offset);
        match op {
            0 => reply.ok(),
            libc::FALLOC_FL_PUNCH_HOLE => {
                if !self.info.can_trim {
                    return reply.error(fuser::Errno::EOPNOTSUPP);
                }
                if len == 0 {
                    return reply.ok();
                }
                let f = self.ranged(offset, len, false);
                self.reply_empty(f, reply);
            }
            libc::FALLOC_FL_ZERO_RANGE => {
                if !self.info.can_zero {
                    return reply.error(fuser::Errno::EOPNOTSUPP);
                }
                if len == 0 {
                    return reply.ok();
                }
                let f = self.ranged(offset, len, true);
                self.reply_empty(f, reply);
            }
            _ => reply.error(fuser::Errno::EOPNOTSUPP),
        }
    }

    fn readdir(
        &self,
        _req: &fuser::Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(fuser::Errno::ENOTDIR);
        }
        let entries: [(INodeNo, FileType, &OsStr); 3] = [
            (ROOT, FileType::Directory, OsStr::new(".")),
            (ROOT, FileType::Directory, OsStr::new("..")),
            (FILE, FileType::RegularFile, self.name.as_os_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &fuser::Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.info.size.div_ceil(4096);
        reply.statfs(blocks, 0, 0, 2, 0, 4096, 255, 4096);
    }

    fn getxattr(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // ENOSYS: the kernel stops asking for this mount.
        reply.error(fuser::Errno::ENOSYS);
    }

    fn listxattr(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(fuser::Errno::ENOSYS);
    }

    fn access(
        &self,
        _req: &fuser::Request,
        _ino: INodeNo,
        _mask: fuser::AccessFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }
}
