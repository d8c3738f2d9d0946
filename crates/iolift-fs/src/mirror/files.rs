//! Open files and directories of the mirror: a bounded handle table, and
//! the data operations on a handle's host fd.

use super::{sys, MirrorFs};
use crate::model::*;
use bytes::Bytes;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// One open file or directory.
#[derive(Debug)]
pub struct Handle {
    pub fd: Arc<OwnedFd>,
    /// Serialises seek + getdents of a directory listing.
    pub dir_lock: Option<Mutex<()>>,
}

/// Open handles by `fh`, at most `max` (ENFILE beyond).
pub type Handles = crate::handles::HandleTable<Handle>;

impl MirrorFs {
    /// open(2) flags as the host open gets them.
    fn host_flags(&self, flags: i32) -> i32 {
        // O_DIRECT: the served path reads into unaligned buffers; the
        // kernel side of FUSE already bypasses its cache for direct opens.
        let mut f = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_DIRECT);
        if self.opts.writeback {
            // The kernel reads pages around partial writes and does the
            // appending itself.
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        f
    }

    fn opened(&self, fd: OwnedFd) -> FsResult<Opened> {
        let fd = Arc::new(fd);
        let fh = self.handles.add(Handle {
            fd: fd.clone(),
            dir_lock: None,
        })?;
        let mut o = Opened::handle(fh);
        if self.opts.passthrough {
            o.passthrough = Some(fd);
        }
        Ok(o)
    }

    pub(super) fn open_file(&self, ino: u64, flags: i32) -> FsResult<Opened> {
        let node = self.nodes.get(ino)?;
        match node.kind {
            libc::S_IFLNK => return Err(Errno::ELOOP),
            libc::S_IFDIR if flags & libc::O_ACCMODE != libc::O_RDONLY => {
                return Err(Errno::EISDIR)
            }
            _ => {}
        }
        let fd = sys::reopen(
            self.proc_fd.as_fd(),
            node.fd.as_raw_fd(),
            self.host_flags(flags),
        )?;
        self.opened(fd)
    }

    pub(super) fn create_file(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Entry, Opened)> {
        check_name(name)?;
        let p = self.dir_node(parent)?;
        let c = sys::cstr(name)?;
        let f = self.host_flags(flags) | libc::O_CREAT | libc::O_NOFOLLOW | (flags & libc::O_EXCL);
        let fd = sys::open_beneath(p.fd.as_fd(), &c, f, mode)?;
        self.chown_new(ctx, &p, &c)?;
        // The node comes from the open file itself, not from the name again
        // (which another client may have renamed meanwhile).
        let path_fd = sys::reopen(self.proc_fd.as_fd(), fd.as_raw_fd(), libc::O_PATH)?;
        let entry = self.enter(path_fd)?;
        match self.opened(fd) {
            Ok(o) => Ok((entry, o)),
            Err(e) => {
                self.nodes.forget(entry.attr.ino, 1);
                Err(e)
            }
        }
    }

    pub(super) fn read_now(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let h = self.handles.get(fh)?;
        // Not zeroed first: pread fills what it returns, and only that much
        // is kept (a 1 MiB memset per read would cost as much as the copy).
        let mut buf: Vec<u8> = Vec::with_capacity(size as usize);
        while buf.len() < size as usize {
            let got = buf.len();
            let n = sys::pread_into(
                h.fd.as_fd(),
                &mut buf.spare_capacity_mut()[..size as usize - got],
                offset + got as u64,
            )?;
            if n == 0 {
                break;
            }
            // SAFETY: pread initialised the n bytes after `got`.
            unsafe { buf.set_len(got + n) };
        }
        Ok(Bytes::from(buf))
    }

    /// A read on the ring when there is one and it has a free slot, else
    /// on this thread.
    pub(super) fn read_on_ring(&self, fh: u64, offset: u64, size: u32, done: Done<Bytes>) {
        let done = match (&self.uring, self.handles.get(fh)) {
            (_, Err(e)) => return done.err(e),
            (Some(u), Ok(h)) => match u.read(h.fd.clone(), offset, size, done) {
                None => return,
                Some(d) => d,
            },
            (None, Ok(_)) => done,
        };
        done.send(self.read_now(fh, offset, size))
    }

    /// A write on the ring when writes go there (`uring_writes`) and it
    /// has a free slot (and no set-user-ID bit may need clearing after
    /// it), else on this thread.
    pub(super) fn write_on_ring(
        &self,
        fh: u64,
        off: u64,
        data: &[u8],
        kill: bool,
        done: Done<u32>,
    ) {
        let done = match (&self.uring, self.handles.get(fh)) {
            (_, Err(e)) => return done.err(e),
            (Some(u), Ok(h)) if !kill && self.opts.uring_writes => {
                match u.write(h.fd.clone(), off, data, done) {
                    None => return,
                    Some(d) => d,
                }
            }
            _ => done,
        };
        done.send(self.write_now(fh, off, data, kill))
    }

    pub(super) fn write_now(&self, fh: u64, offset: u64, data: &[u8], kill: bool) -> FsResult<u32> {
        let h = self.handles.get(fh)?;
        let n = sys::pwrite_all(h.fd.as_fd(), data, offset)?;
        if kill {
            kill_suidgid(h.fd.as_raw_fd())?;
        }
        Ok(n as u32)
    }

    pub(super) fn sync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        // SAFETY: plain system calls on an fd we own.
        let r = unsafe {
            if datasync {
                libc::fdatasync(h.fd.as_raw_fd())
            } else {
                libc::fsync(h.fd.as_raw_fd())
            }
        };
        sys::cvt(r).map(drop)
    }

    pub(super) fn allocate(&self, fh: u64, off: u64, len: u64, mode: i32) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        let (off, len) = (
            i64::try_from(off).map_err(|_| Errno::EINVAL)?,
            i64::try_from(len).map_err(|_| Errno::EINVAL)?,
        );
        // SAFETY: plain system call; the host checks mode and range.
        sys::cvt(unsafe { libc::fallocate(h.fd.as_raw_fd(), mode, off, len) }).map(drop)
    }

    pub(super) fn seek(&self, fh: u64, off: i64, whence: i32) -> FsResult<i64> {
        let h = self.handles.get(fh)?;
        // SAFETY: plain system call; pread/pwrite never use the position.
        let r = unsafe { libc::lseek(h.fd.as_raw_fd(), off, whence) };
        if r < 0 {
            Err(Errno::last())
        } else {
            Ok(r)
        }
    }

    pub(super) fn copy_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> FsResult<u32> {
        let (a, b) = (self.handles.get(fh_in)?, self.handles.get(fh_out)?);
        let mut oi = i64::try_from(off_in).map_err(|_| Errno::EINVAL)?;
        let mut oo = i64::try_from(off_out).map_err(|_| Errno::EINVAL)?;
        let len = len.min(u32::MAX as u64 & !0xfff) as usize;
        // SAFETY: offsets are valid pointers to i64; fds are ours.
        let n = unsafe {
            libc::copy_file_range(
                a.fd.as_raw_fd(),
                &mut oi,
                b.fd.as_raw_fd(),
                &mut oo,
                len,
                flags,
            )
        };
        if n < 0 {
            Err(Errno::last())
        } else {
            Ok(n as u32)
        }
    }
}

/// Clears the set-user-ID bit, and the set-group-ID bit when group execute
/// is set (as the kernel does on a write by an unprivileged process), of
/// the file `fd` (ours, possibly O_PATH) refers to.
pub(super) fn kill_suidgid(fd: std::os::fd::RawFd) -> FsResult<()> {
    // SAFETY: fd is one of ours, borrowed for this call only.
    let st = sys::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })?;
    let mut kill = st.st_mode & libc::S_ISUID;
    if st.st_mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        kill |= libc::S_ISGID;
    }
    if kill == 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    let p = sys::proc_path(fd);
    // SAFETY: NUL-terminated path of our own fd (a regular file).
    sys::cvt(unsafe { libc::chmod(p.as_ptr(), (st.st_mode & 0o7777) & !kill) }).map(drop)
}
