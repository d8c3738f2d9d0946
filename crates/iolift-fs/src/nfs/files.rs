//! Open files and directory listings of the nfs backend.
//!
//! An open file is opened (NFSv4 OPEN) on the connection of the worker
//! thread that opened it, its home; a worker on another connection that
//! reads or writes it opens it there too, once, so workers never wait for
//! each other's connection, and falls back to the home connection when
//! that second open fails (the file was unlinked since: only the home open
//! still reaches it). `release` closes it on every connection. A
//! directory listing is read whole at opendir (libnfs reads the whole
//! directory in `nfs_opendir`) and kept until releasedir, at most
//! `max_dir_entries` entries.

use super::ffi::{self, FileT, Stat64};
use super::{NfsFs, Slot};
use crate::model::*;
use std::ffi::{CStr, OsStr, OsString};

/// One entry of a directory listing, with the attributes the server sent.
pub struct Listed {
    pub name: OsString,
    pub st: Stat64,
}

/// An open file or directory.
pub enum Open {
    File {
        ino: u64,
        /// open(2) flags for further opens on other connections.
        flags: i32,
        /// The connection the file was first opened on.
        home: usize,
    },
    Dir {
        ino: u64,
        entries: Vec<Listed>,
    },
}

/// Open handles by `fh`, at most `max` (ENFILE beyond).
pub type Handles = crate::handles::HandleTable<Open>;

/// Flags for opening an already open file again on another connection.
pub fn reopen_flags(flags: i32) -> i32 {
    flags & !(libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL)
}

/// The one NFS open of a node on a connection, shared by every handle
/// of that node used there (a second NFSv4 OPEN by the same client of a
/// file it has open returns the same open state, which the first CLOSE
/// would end for both).
pub struct Shared {
    pub p: *mut FileT,
    pub users: usize,
}

impl Slot {
    /// The NFS open of handle `fh` on this connection, if it has one.
    pub(super) fn get(&self, fh: u64) -> Option<*mut FileT> {
        let ino = self.files.get(&fh)?;
        self.opens.get(ino).map(|s| s.p)
    }

    /// Gives handle `fh` (of node `ino` at `path`) an NFS open on this
    /// connection: the node's shared one (truncated for O_TRUNC), or a new
    /// one, read-write where the server allows it (so later handles that
    /// write can share it), else as `flags` ask.
    pub(super) fn acquire(
        &mut self,
        fh: u64,
        ino: u64,
        path: &CStr,
        flags: i32,
    ) -> FsResult<*mut FileT> {
        let c = &self.conn;
        let ino = self.key(fh, ino);
        if let Some(sh) = self.opens.get_mut(&ino) {
            if flags & libc::O_TRUNC != 0 {
                // SAFETY: sh.p is an open file of c.
                ffi::cvt(unsafe { (c.api.ftruncate)(c.cx, sh.p, 0) })?;
            }
            sh.users += 1;
            self.files.insert(fh, ino);
            return Ok(sh.p);
        }
        let open = |f: i32| {
            let mut p: *mut FileT = std::ptr::null_mut();
            // SAFETY: valid context, path and out pointer.
            ffi::cvt(unsafe { (c.api.open)(c.cx, path.as_ptr(), f, &mut p) }).map(|_| p)
        };
        let rw = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
        let p = match open(rw) {
            Ok(p) => p,
            Err(Errno(e))
                if flags & libc::O_ACCMODE != libc::O_RDWR
                    && matches!(e, libc::EACCES | libc::EPERM | libc::EROFS) =>
            {
                open(flags)?
            }
            Err(e) => return Err(e),
        };
        self.adopt(fh, ino, p);
        Ok(p)
    }

    /// The key of handle `fh`'s open: its node where opens are shared
    /// (NFSv4), the handle itself otherwise (NFSv3 opens hold no server
    /// state, and a node's inode number may come back for a new file
    /// while the old file's open is still being released).
    fn key(&self, fh: u64, ino: u64) -> u64 {
        if self.share {
            ino
        } else {
            fh
        }
    }

    /// Records `p`, just opened for node `ino`, as handle `fh`'s open.
    pub(super) fn adopt(&mut self, fh: u64, ino: u64, p: *mut FileT) {
        let ino = self.key(fh, ino);
        if let Some(old) = self.opens.insert(ino, Shared { p, users: 1 }) {
            // Two opens raced here: the newer one carries the open state;
            // the older libnfs handle is dropped without a CLOSE (a small
            // leak, rather than closing the state both share).
            if let Some(sh) = self.opens.get_mut(&ino) {
                sh.users += old.users;
            }
        }
        self.files.insert(fh, ino);
    }

    /// Handle `fh` is done on this connection: the node's NFS open is
    /// closed with its last handle.
    pub(super) fn release(&mut self, fh: u64) {
        let Some(ino) = self.files.remove(&fh) else {
            return;
        };
        let last = match self.opens.get_mut(&ino) {
            Some(sh) => {
                sh.users = sh.users.saturating_sub(1);
                sh.users == 0
            }
            None => false,
        };
        if last {
            if let Some(sh) = self.opens.remove(&ino) {
                // SAFETY: sh.p was opened on this context and is dropped here.
                unsafe { (self.conn.api.close)(self.conn.cx, sh.p) };
            }
        }
    }
}

impl NfsFs {
    /// Runs `f` with the NFS open of file handle `fh` on this worker's
    /// connection (opened there on first use), or on its home connection.
    pub(super) fn with_file<R>(
        &self,
        fh: u64,
        mut f: impl FnMut(&ffi::Conn, *mut FileT) -> FsResult<R>,
    ) -> FsResult<R> {
        let h = self.handles.get(fh)?;
        let Open::File { ino, flags, home } = *h else {
            return Err(Errno::EISDIR);
        };
        let me = self.my_conn();
        if me != home {
            let mut s = self.slot(me)?;
            if let Some(p) = s.get(fh) {
                return f(&s.conn, p);
            }
            if let Ok(path) = self.nodes.path(ino) {
                if let Ok(p) = s.acquire(fh, ino, &path, flags) {
                    if !self.handles.contains(fh) {
                        // Released meanwhile: release will not visit us again.
                        s.release(fh);
                        return Err(Errno::EBADF);
                    }
                    return f(&s.conn, p);
                }
            }
        }
        let s = self.slot(home)?;
        let p = s.get(fh).ok_or(Errno::EBADF)?;
        f(&s.conn, p)
    }

    /// Closes file handle `fh` on every connection that opened it.
    pub(super) fn close_everywhere(&self, fh: u64) {
        for i in 0..self.conns.len() {
            if let Ok(mut s) = self.slot(i) {
                s.release(fh);
            }
        }
    }

    pub(super) fn read_now(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let mut buf = vec![0u8; size as usize];
        let n = self.with_file(fh, |c, p| {
            let mut done = 0usize;
            while done < buf.len() {
                // SAFETY: the buffer is valid for the rest of its length.
                let r = ffi::cvt(unsafe {
                    (c.api.pread)(
                        c.cx,
                        p,
                        offset + done as u64,
                        (buf.len() - done) as u64,
                        buf[done..].as_mut_ptr().cast(),
                    )
                })?;
                if r == 0 {
                    break;
                }
                done += r as usize;
            }
            Ok(done)
        })?;
        buf.truncate(n);
        Ok(buf)
    }

    pub(super) fn write_now(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.with_file(fh, |c, p| {
            let mut done = 0usize;
            while done < data.len() {
                // SAFETY: the data is valid for the rest of its length.
                let r = ffi::cvt(unsafe {
                    (c.api.pwrite)(
                        c.cx,
                        p,
                        offset + done as u64,
                        (data.len() - done) as u64,
                        data[done..].as_ptr().cast(),
                    )
                })?;
                if r == 0 {
                    return Err(Errno::EIO);
                }
                done += r as usize;
            }
            Ok(done as u32)
        })
    }

    /// Reads the whole directory `ino` (at most `max_dir_entries`).
    pub(super) fn list_dir(&self, ino: u64) -> FsResult<Vec<Listed>> {
        if self.nodes.kind(ino)? != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        let path = self.nodes.path(ino)?;
        let s = self.slot(self.my_conn())?;
        let c = &s.conn;
        let mut d = std::ptr::null_mut();
        // SAFETY: valid context, path and out pointer.
        ffi::cvt(unsafe { (c.api.opendir)(c.cx, path.as_ptr(), &mut d) })?;
        let mut out = Vec::new();
        let mut r = Ok(());
        loop {
            // SAFETY: d is an open listing of this context.
            let e = unsafe { (c.api.readdir)(c.cx, d) };
            if e.is_null() {
                break;
            }
            // SAFETY: libnfs keeps the entry valid until closedir.
            let e = unsafe { &*e };
            if e.name.is_null() {
                continue;
            }
            // SAFETY: NUL-terminated name owned by the listing.
            let name = unsafe { std::ffi::CStr::from_ptr(e.name) }.to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if out.len() >= self.opts.max_dir_entries {
                r = Err(Errno(libc::ENOMEM));
                break;
            }
            out.push(Listed {
                name: <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name).to_os_string(),
                st: dirent_stat(e),
            });
        }
        // SAFETY: d is ours and not used after this.
        unsafe { (c.api.closedir)(c.cx, d) };
        if r.is_err() {
            tracing::warn!(
                "nfs: listing of {} has more than {} entries (max_dir_entries)",
                path.to_string_lossy(),
                self.opts.max_dir_entries
            );
        }
        r.map(|_| out)
    }
}

/// The attributes a READDIR entry carries, as a stat.
fn dirent_stat(e: &ffi::DirEnt) -> Stat64 {
    let us = |t: libc::timeval, ns: u32| {
        (
            t.tv_sec as u64,
            if ns != 0 {
                ns as u64
            } else {
                t.tv_usec as u64 * 1000
            },
        )
    };
    let (at, atn) = us(e.atime, e.atime_nsec);
    let (mt, mtn) = us(e.mtime, e.mtime_nsec);
    let (ct, ctn) = us(e.ctime, e.ctime_nsec);
    Stat64 {
        dev: e.dev,
        ino: e.inode,
        mode: e.mode as u64,
        nlink: e.nlink as u64,
        uid: e.uid as u64,
        gid: e.gid as u64,
        rdev: e.rdev,
        size: e.size,
        blksize: e.blksize,
        blocks: e.blocks,
        atime: at,
        mtime: mt,
        ctime: ct,
        atime_nsec: atn,
        mtime_nsec: mtn,
        ctime_nsec: ctn,
        used: e.used,
    }
}
