//! [`Session`]: one virtio-fs device's FUSE session. It decodes a
//! request's bytes, answers INIT itself, and turns every other operation
//! into a [`FileSystem`] call whose [`Done`] encodes the answer into the
//! request's [`Reply`] and counts it in [`OpStats`], on whichever thread
//! completes it.

use super::reply::Reply;
use super::request::{self, Header, Request};
use super::wire::{self, init, Out};
use crate::fs::FileSystem;
use crate::model::{Attr, DirEntry, Done, Entry, Errno, FsResult, Opened, Xattr, ROOT};
use crate::stats::{op, OpStats};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The session's knobs (see docs/fs.md).
#[derive(Clone, Debug)]
pub struct SessionOptions {
    pub writeback_cache: bool,
    pub readdirplus: bool,
    pub ttl: Duration,
    /// Largest WRITE (and READ) the guest may send; also bounds the bytes
    /// read from one request.
    pub max_write: u32,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            writeback_cache: false,
            readdirplus: true,
            ttl: Duration::from_secs(1),
            max_write: 1 << 20,
        }
    }
}

pub struct Session {
    fs: Arc<dyn FileSystem>,
    stats: Arc<OpStats>,
    opts: SessionOptions,
    initialized: AtomicBool,
}

impl Session {
    pub fn new(fs: Arc<dyn FileSystem>, stats: Arc<OpStats>, opts: SessionOptions) -> Session {
        Session {
            fs,
            stats,
            opts,
            initialized: AtomicBool::new(false),
        }
    }

    /// The most bytes one request may carry: a WRITE of `max_write` plus
    /// its headers.
    pub fn max_request(&self) -> usize {
        self.opts.max_write as usize + 4096
    }

    /// Serves one request: `bytes` is the element's device-readable part.
    pub fn handle(&self, bytes: &[u8], mut reply: Reply) {
        let h = match request::header(bytes) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("virtio-fs: dropping a bad request: {}", e.0);
                return reply.err(Errno::EINVAL);
            }
        };
        reply.set_unique(h.unique);
        let body = &bytes[wire::IN_HEADER_LEN..h.len as usize];
        let req = match request::decode(&h, body) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("virtio-fs: bad request (unique {}): {}", h.unique, e.0);
                return reply.err(Errno::EINVAL);
            }
        };
        if !self.initialized.load(Ordering::Acquire) && !matches!(req, Request::Init { .. }) {
            return reply.err(Errno::EIO);
        }
        self.dispatch(&h, req, reply)
    }

    /// A `Done` that counts `opcode`'s result and latency, then answers
    /// with the body `f` encodes (or the errno).
    fn done<T: 'static>(
        &self,
        opcode: u32,
        reply: Reply,
        f: impl FnOnce(T, &mut Out) + Send + 'static,
    ) -> Done<T> {
        let (stats, i, t) = (
            self.stats.clone(),
            op(request::opname(opcode)),
            Instant::now(),
        );
        Done::new(move |r: FsResult<T>| {
            stats.record(i, t, r.is_ok());
            match r {
                Ok(v) => {
                    let mut o = Out::default();
                    f(v, &mut o);
                    reply.ok(&[&o.buf])
                }
                Err(e) => reply.err(e),
            }
        })
    }

    fn entry(&self, h: &Header, reply: Reply) -> Done<Entry> {
        let fs = self.fs.clone();
        let (stats, i, t) = (
            self.stats.clone(),
            op(request::opname(h.opcode)),
            Instant::now(),
        );
        Done::new(move |r: FsResult<Entry>| {
            stats.record(i, t, r.is_ok());
            match r {
                Ok(e) => {
                    let mut o = Out::default();
                    o.entry(&e);
                    if o.buf.len() > reply.room() {
                        // Not delivered: give the lookup back.
                        fs.forget(e.attr.ino, 1);
                    }
                    reply.ok(&[&o.buf])
                }
                Err(e) => reply.err(e),
            }
        })
    }

    fn empty(&self, opcode: u32, reply: Reply) -> Done<()> {
        self.done(opcode, reply, |(), _| {})
    }

    fn init(&self, r: Reply, major: u32, minor: u32, max_readahead: u32, flags: u32) {
        if major != wire::MAJOR || minor < wire::MIN_MINOR {
            tracing::warn!(
                "virtio-fs: the guest speaks FUSE {major}.{minor}; this server 7.{}..7.{}",
                wire::MIN_MINOR,
                wire::MAX_MINOR
            );
            return r.err(Errno(libc::EPROTO));
        }
        let mut want = init::ASYNC_READ
            | init::BIG_WRITES
            | init::DONT_MASK
            | init::ASYNC_DIO
            | init::PARALLEL_DIROPS
            | init::MAX_PAGES;
        if self.opts.readdirplus {
            want |= init::DO_READDIRPLUS | init::READDIRPLUS_AUTO;
        }
        if self.opts.writeback_cache {
            want |= init::WRITEBACK_CACHE;
        }
        if self.fs.handles_killpriv() {
            want |= init::HANDLE_KILLPRIV_V2;
        }
        let max_pages = (self.opts.max_write / 4096).clamp(1, u16::MAX as u32) as u16;
        let mut o = Out::with_capacity(64);
        o.u32(wire::MAJOR)
            .u32(minor.min(wire::MAX_MINOR))
            .u32(max_readahead);
        o.u32(want & flags)
            .u16(64)
            .u16(48)
            .u32(self.opts.max_write)
            .u32(1);
        o.u16(max_pages).u16(0).u32(0).zeros(28);
        self.initialized.store(true, Ordering::Release);
        tracing::info!(
            "virtio-fs: FUSE 7.{minor} session, flags {:#x}",
            want & flags
        );
        r.ok(&[&o.buf])
    }

    fn dispatch(&self, h: &Header, req: Request, r: Reply) {
        let (fs, c, ino, code) = (&self.fs, h.ctx(), h.nodeid, h.opcode);
        let ttl = self.opts.ttl;
        match req {
            Request::Init {
                major,
                minor,
                max_readahead,
                flags,
            } => self.init(r, major, minor, max_readahead, flags),
            Request::Destroy => r.ok(&[]),
            Request::Forget { nlookup } => {
                fs.forget(ino, nlookup);
                self.stats.record(op("forget"), Instant::now(), true);
                r.none()
            }
            Request::BatchForget { nodes } => {
                fs.batch_forget(&nodes);
                self.stats.record(op("forget"), Instant::now(), true);
                r.none()
            }
            Request::Interrupt => r.none(),
            Request::Lookup { name } => fs.lookup(&c, ino, name, self.entry(h, r)),
            Request::Getattr { fh } => {
                let d = self.done(code, r, move |a, o| {
                    o.attr_out(&a, ttl);
                });
                fs.getattr(&c, ino, fh, d)
            }
            Request::Setattr(set) => {
                let d = self.done(code, r, move |a, o| {
                    o.attr_out(&a, ttl);
                });
                fs.setattr(&c, ino, set, d)
            }
            Request::Readlink => {
                let d = self.done(code, r, |v: Vec<u8>, o| o.buf = v);
                fs.readlink(&c, ino, d)
            }
            Request::Symlink { name, target } => {
                fs.symlink(&c, ino, name, Path::new(target), self.entry(h, r))
            }
            Request::Mknod {
                name,
                mode,
                rdev,
                umask,
            } => {
                let mode = mode & !(umask & 0o777);
                fs.mknod(&c, ino, name, mode, rdev, self.entry(h, r))
            }
            Request::Mkdir { name, mode, umask } => {
                let mode = mode & !(umask & 0o777);
                fs.mkdir(&c, ino, name, mode, self.entry(h, r))
            }
            Request::Unlink { name } => fs.unlink(&c, ino, name, self.empty(code, r)),
            Request::Rmdir { name } => fs.rmdir(&c, ino, name, self.empty(code, r)),
            Request::Rename {
                newdir,
                flags,
                name,
                newname,
            } => fs.rename(&c, ino, name, newdir, newname, flags, self.empty(code, r)),
            Request::Link { oldnodeid, newname } => {
                fs.link(&c, oldnodeid, ino, newname, self.entry(h, r))
            }
            Request::Open { flags } | Request::Opendir { flags } => {
                let d = self.done(code, r, |o: Opened, out| {
                    out.open_out(o.fh, open_flags(&o));
                });
                if code == wire::op::OPEN {
                    fs.open(&c, ino, flags as i32, d)
                } else {
                    fs.opendir(&c, ino, flags as i32, d)
                }
            }
            Request::Read { fh, offset, size } => {
                let size = size.min(r.room() as u32).min(self.opts.max_write);
                let (stats, i, t) = (self.stats.clone(), op("read"), Instant::now());
                let d = Done::new(move |res: FsResult<bytes::Bytes>| {
                    stats.record(i, t, res.is_ok());
                    match res {
                        Ok(b) => r.ok(&[&b[..b.len().min(size as usize)]]),
                        Err(e) => r.err(e),
                    }
                });
                fs.read(&c, ino, fh, offset, size, d)
            }
            Request::Write {
                fh,
                offset,
                write_flags,
                data,
            } => {
                let kill = write_flags & wire::WRITE_KILL_SUIDGID != 0;
                let d = self.done(code, r, |n: u32, o| {
                    o.u32(n).u32(0);
                });
                fs.write(&c, ino, fh, offset, data, kill, d)
            }
            Request::Readdir {
                fh,
                offset,
                size,
                plus,
            } => self.readdir(&c, ino, fh, offset, size, plus, r),
            Request::Statfs => {
                let d = self.done(code, r, |s, o| {
                    o.statfs(&s);
                });
                fs.statfs(&c, ino, d)
            }
            Request::Release { fh, dir } => {
                let d = self.empty(code, r);
                if dir {
                    fs.releasedir(&c, ino, fh, d)
                } else {
                    fs.release(&c, ino, fh, d)
                }
            }
            Request::Fsync { fh, datasync, dir } => {
                let d = self.empty(code, r);
                if dir {
                    fs.fsyncdir(&c, ino, fh, datasync, d)
                } else {
                    fs.fsync(&c, ino, fh, datasync, d)
                }
            }
            Request::Flush { fh } => fs.flush(&c, ino, fh, self.empty(code, r)),
            Request::Setxattr { name, value, flags } => {
                fs.setxattr(&c, ino, name, value, flags as i32, self.empty(code, r))
            }
            Request::Getxattr { name, size } => {
                fs.getxattr(&c, ino, name, size, self.xattr(code, r))
            }
            Request::Listxattr { size } => fs.listxattr(&c, ino, size, self.xattr(code, r)),
            Request::Removexattr { name } => fs.removexattr(&c, ino, name, self.empty(code, r)),
            // Permission checks are the guest kernel's (ENOSYS: it stops asking).
            Request::Access { .. } => r.err(Errno::ENOSYS),
            Request::Create {
                name,
                flags,
                mode,
                umask,
            } => {
                let mode = mode & !(umask & 0o777);
                let fs2 = fs.clone();
                let (stats, i, t) = (self.stats.clone(), op("create"), Instant::now());
                let d = Done::new(move |res: FsResult<(Entry, Opened)>| {
                    stats.record(i, t, res.is_ok());
                    match res {
                        Ok((e, o)) => {
                            let mut out = Out::default();
                            out.entry(&e).open_out(o.fh, open_flags(&o));
                            if out.buf.len() > r.room() {
                                fs2.forget(e.attr.ino, 1);
                            }
                            r.ok(&[&out.buf])
                        }
                        Err(e) => r.err(e),
                    }
                });
                fs.create(&c, ino, name, mode, flags as i32, d)
            }
            Request::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => fs.fallocate(
                &c,
                ino,
                fh,
                offset,
                length,
                mode as i32,
                self.empty(code, r),
            ),
            Request::Lseek { fh, offset, whence } => {
                let d = self.done(code, r, |n: i64, o| {
                    o.u64(n as u64);
                });
                fs.lseek(&c, ino, fh, offset as i64, whence as i32, d)
            }
            Request::CopyFileRange {
                fh_in,
                off_in,
                fh_out,
                off_out,
                len,
                flags,
            } => {
                let d = self.done(code, r, |n: u32, o| {
                    o.u32(n).u32(0);
                });
                fs.copy_file_range(&c, fh_in, off_in, fh_out, off_out, len, flags as u32, d)
            }
            Request::Unknown => {
                tracing::debug!("virtio-fs: opcode {} not served", h.opcode);
                self.stats.record(op("other"), Instant::now(), false);
                r.err(Errno::ENOSYS)
            }
        }
    }

    fn xattr(&self, code: u32, r: Reply) -> Done<Xattr> {
        self.done(code, r, |x: Xattr, o| match x {
            Xattr::Size(n) => {
                o.u32(n).u32(0);
            }
            Xattr::Data(d) => o.buf = d,
        })
    }

    /// READDIR and READDIRPLUS: as many entries as the guest's `size`
    /// bytes hold; with `plus`, entries that do not fit give their lookup
    /// back.
    #[allow(clippy::too_many_arguments)]
    fn readdir(
        &self,
        c: &crate::model::Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
        r: Reply,
    ) {
        let limit = (size as usize).min(r.room());
        let code = if plus {
            wire::op::READDIRPLUS
        } else {
            wire::op::READDIR
        };
        let (stats, i, t) = (
            self.stats.clone(),
            op(request::opname(code)),
            Instant::now(),
        );
        if !plus {
            // A dirent is 24 bytes plus the name; ask for what fits.
            let max = (limit / 32).clamp(1, 4096);
            let d = Done::new(move |res: FsResult<Vec<DirEntry>>| {
                stats.record(i, t, res.is_ok());
                match res {
                    Ok(v) => {
                        let mut o = Out::with_capacity(limit);
                        for e in v {
                            let n = e.name.as_encoded_bytes();
                            if o.buf.len() + wire::DIRENT_LEN + n.len() + wire::pad8(n.len())
                                > limit
                            {
                                break;
                            }
                            o.dirent(e.ino, e.offset, e.kind, n);
                        }
                        r.ok(&[&o.buf])
                    }
                    Err(e) => r.err(e),
                }
            });
            return self.fs.readdir(c, ino, fh, offset, max, d);
        }
        let fs = self.fs.clone();
        let ttl0 = Duration::ZERO;
        // An entry-plus is 152 bytes plus the name: ask for what fits, so
        // that few lookups are made for nothing.
        let max = (limit / 176).clamp(1, 1024);
        type Plus = Vec<(DirEntry, Option<Entry>)>;
        let d = Done::new(move |res: FsResult<Plus>| {
            stats.record(i, t, res.is_ok());
            match res {
                Ok(v) => {
                    let mut o = Out::with_capacity(limit);
                    let mut full = false;
                    for (e, ent) in v {
                        let n = e.name.as_encoded_bytes();
                        let need =
                            wire::ENTRY_OUT_LEN + wire::DIRENT_LEN + n.len() + wire::pad8(n.len());
                        full = full || o.buf.len() + need > limit;
                        if full {
                            if let Some(ent) = ent {
                                fs.forget(ent.attr.ino, 1);
                            }
                            continue;
                        }
                        match &ent {
                            Some(x) => o.entry(x),
                            None => {
                                // `.` and `..`: no entry, only the name.
                                let mut a =
                                    Attr::placeholder(if e.ino == 0 { ROOT } else { e.ino });
                                a.mode = e.kind;
                                o.entry(&Entry {
                                    attr: a,
                                    generation: 0,
                                    ttl: ttl0,
                                });
                                let len = o.buf.len();
                                // nodeid 0: the kernel makes no inode of it.
                                o.buf[len - wire::ENTRY_OUT_LEN..][..8].fill(0);
                                &mut o
                            }
                        };
                        o.dirent(e.ino, e.offset, e.kind, n);
                    }
                    r.ok(&[&o.buf])
                }
                Err(e) => r.err(e),
            }
        });
        self.fs.readdirplus(c, ino, fh, offset, max, d)
    }
}

fn open_flags(o: &Opened) -> u32 {
    let mut f = 0;
    if o.direct_io {
        f |= wire::FOPEN_DIRECT_IO;
    }
    if o.keep_cache {
        f |= wire::FOPEN_KEEP_CACHE;
    }
    f
}
