//! The bridge from fuser's `Filesystem` (one call per request read from
//! /dev/fuse, on the worker thread that read it) to a [`FileSystem`]: each
//! request's fuser reply is wrapped in a [`Done`] that converts the result,
//! counts it in [`OpStats`] and sends it, on whichever thread completes it
//! (those wrappers and the passthrough registrations: `reply.rs`).

use super::convert::{attr, ctx, errno, kind, time};
use super::KernelOptions;
use crate::fs::FileSystem;
use crate::model::{self, Attr, Entry, Opened, SetAttr};
use crate::stats::{op, OpStats};
use fuser::{
    AccessFlags, CopyFileRangeFlags, FileHandle, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

mod reply;
use reply::Backing;

/// Entries asked of the backend per readdir (names only: the kernel's
/// buffer of up to 128 KiB holds about 4000).
const READDIR_BATCH: usize = 4096;
/// Entries asked per readdirplus (each is looked up; see `readdirplus`).
const READDIRPLUS_BATCH: usize = 56;

pub struct Adapter {
    fs: Arc<dyn FileSystem>,
    stats: Arc<OpStats>,
    opts: KernelOptions,
    backing: Arc<Mutex<Backing>>,
}

impl Adapter {
    pub fn new(fs: Arc<dyn FileSystem>, stats: Arc<OpStats>, opts: KernelOptions) -> Adapter {
        Adapter {
            fs,
            stats,
            opts,
            backing: Arc::default(),
        }
    }
}

impl Adapter {
    /// The kernel keeps directory listings (see `KernelOptions::dir_cache`).
    fn dir_cache(&self) -> bool {
        self.opts.dir_cache && self.fs.cacheable_listings()
    }
}

impl fuser::Filesystem for Adapter {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> std::io::Result<()> {
        // ASYNC_DIO: O_DIRECT reads and writes of one file may be in flight
        // together (a queue depth above 1 reaches the server).
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_ASYNC_DIO;
        if self.opts.readdirplus {
            want |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        if self.fs.handles_killpriv() {
            want |= InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        }
        if self.opts.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.dir_cache() {
            // A kept listing is checked against the directory's mtime,
            // refreshed (once the attributes are older than the timeout)
            // when a listing starts.
            want |= InitFlags::FUSE_AUTO_INVAL_DATA;
        }
        if self.opts.passthrough {
            want |= InitFlags::FUSE_PASSTHROUGH;
            let _ = cfg.set_max_stack_depth(1);
        }
        let missing = want - cfg.capabilities();
        if self.opts.passthrough && missing.contains(InitFlags::FUSE_PASSTHROUGH) {
            return Err(std::io::Error::other(
                "the kernel does not offer FUSE passthrough",
            ));
        }
        if let Err(m) = cfg.add_capabilities(want & cfg.capabilities()) {
            tracing::warn!("FUSE init: kernel refused {m:?}");
        }
        if !missing.is_empty() {
            tracing::warn!("FUSE init: the kernel does not offer {missing:?}");
        }
        let _ = cfg.set_max_write(1 << 20);
        let _ = cfg.set_max_readahead(1 << 20);
        let _ = cfg.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.fs
            .lookup(&ctx(req), parent.0, name, self.entry_done("lookup", reply))
    }
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let t = Instant::now();
        self.fs.forget(ino.0, nlookup);
        self.stats.record(op("forget"), t, true);
    }
    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let d = self.attr_done("getattr", reply, self.opts.ttl);
        self.fs.getattr(&ctx(req), ino.0, fh.map(|f| f.0), d)
    }
    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time(atime),
            mtime: time(mtime),
            fh: fh.map(|f| f.0),
        };
        let d = self.attr_done("setattr", reply, self.opts.ttl);
        self.fs.setattr(&ctx(req), ino.0, set, d)
    }
    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let d = self.done("readlink", move |r: model::FsResult<Vec<u8>>| match r {
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(e)),
        });
        self.fs.readlink(&ctx(req), ino.0, d)
    }
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mode = mode & !(umask & 0o777);
        self.fs.mknod(
            &ctx(req),
            parent.0,
            name,
            mode,
            rdev,
            self.entry_done("mknod", reply),
        )
    }
    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mode = mode & !(umask & 0o777);
        self.fs.mkdir(
            &ctx(req),
            parent.0,
            name,
            mode,
            self.entry_done("mkdir", reply),
        )
    }
    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.fs
            .unlink(&ctx(req), parent.0, name, self.empty_done("unlink", reply))
    }
    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.fs
            .rmdir(&ctx(req), parent.0, name, self.empty_done("rmdir", reply))
    }
    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let d = self.entry_done("symlink", reply);
        self.fs.symlink(&ctx(req), parent.0, link_name, target, d)
    }
    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let d = self.empty_done("rename", reply);
        self.fs.rename(
            &ctx(req),
            parent.0,
            name,
            newparent.0,
            newname,
            flags.bits(),
            d,
        )
    }
    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let d = self.entry_done("link", reply);
        self.fs.link(&ctx(req), ino.0, newparent.0, newname, d)
    }
    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let me = self.clone_for_reply();
        let d = self.done("open", move |r: model::FsResult<Opened>| match r {
            Ok(o) => match me.open_reply(ino.0, &o, |fd| reply.open_backing(fd)) {
                (f, Some(id)) => reply.opened_passthrough(FileHandle(o.fh), f, &id),
                (f, None) => reply.opened(FileHandle(o.fh), f),
            },
            Err(e) => reply.error(errno(e)),
        });
        self.fs.open(&ctx(req), ino.0, flags.0, d)
    }
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let d = self.done("read", move |r: model::FsResult<bytes::Bytes>| match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(errno(e)),
        });
        self.fs.read(&ctx(req), ino.0, fh.0, offset, size, d)
    }
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let d = self.written_done("write", reply);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        self.fs.write(&ctx(req), ino.0, fh.0, offset, data, kill, d)
    }
    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.fs
            .flush(&ctx(req), ino.0, fh.0, self.empty_done("flush", reply))
    }
    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.drop_backing(fh.0);
        self.fs
            .release(&ctx(req), ino.0, fh.0, self.empty_done("release", reply))
    }
    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.fsync(
            &ctx(req),
            ino.0,
            fh.0,
            datasync,
            self.empty_done("fsync", reply),
        )
    }
    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fopen = if self.dir_cache() {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        let d = self.done("opendir", move |r: model::FsResult<Opened>| match r {
            Ok(o) => reply.opened(FileHandle(o.fh), fopen),
            Err(e) => reply.error(errno(e)),
        });
        self.fs.opendir(&ctx(req), ino.0, flags.0, d)
    }
    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let d = self.done(
            "readdir",
            move |r: model::FsResult<Vec<model::DirEntry>>| match r {
                Ok(v) => {
                    for e in v {
                        if reply.add(INodeNo(e.ino), e.offset, kind(e.kind), &e.name) {
                            break;
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(errno(e)),
            },
        );
        self.fs
            .readdir(&ctx(req), ino.0, fh.0, offset, READDIR_BATCH, d)
    }
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let fs = self.fs.clone();
        let d = self.done(
            "readdirplus",
            move |r: model::FsResult<Vec<(model::DirEntry, Option<Entry>)>>| match r {
                Ok(v) => {
                    let mut full = false;
                    for (e, ent) in v {
                        if !full {
                            let (nodeid, a, ttl, gen) = match &ent {
                                Some(x) => (x.attr.ino, attr(&x.attr), x.ttl, x.generation),
                                None => {
                                    let mut a = attr(&Attr::placeholder(e.ino));
                                    a.kind = kind(e.kind);
                                    (0, a, std::time::Duration::ZERO, 0)
                                }
                            };
                            full = reply.add(
                                INodeNo(nodeid),
                                e.offset,
                                &e.name,
                                &ttl,
                                &a,
                                Generation(gen),
                            );
                        }
                        // Not sent (it did not fit, or an earlier one did
                        // not): give its lookup back.
                        if full {
                            if let Some(ent) = ent {
                                fs.forget(ent.attr.ino, 1);
                            }
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(errno(e)),
            },
        );
        // fuser does not say how large the kernel's buffer is (one page
        // to 128 KiB); entries that do not fit are looked up for nothing
        // and forgotten again, so ask for what one 8 KiB reply holds
        // (about 150 bytes an entry) and let the kernel come back for more.
        self.fs
            .readdirplus(&ctx(req), ino.0, fh.0, offset, READDIRPLUS_BATCH, d)
    }
    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs
            .releasedir(&ctx(req), ino.0, fh.0, self.empty_done("releasedir", reply))
    }
    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.fsyncdir(
            &ctx(req),
            ino.0,
            fh.0,
            datasync,
            self.empty_done("fsyncdir", reply),
        )
    }
    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let d = self.done("statfs", move |r: model::FsResult<model::StatFs>| match r {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(e)),
        });
        self.fs.statfs(&ctx(req), ino.0, d)
    }
    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let d = self.empty_done("setxattr", reply);
        self.fs.setxattr(&ctx(req), ino.0, name, value, flags, d)
    }
    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.fs.getxattr(
            &ctx(req),
            ino.0,
            name,
            size,
            self.xattr_done("getxattr", reply),
        )
    }
    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.fs
            .listxattr(&ctx(req), ino.0, size, self.xattr_done("listxattr", reply))
    }
    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.fs.removexattr(
            &ctx(req),
            ino.0,
            name,
            self.empty_done("removexattr", reply),
        )
    }
    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permissions are checked by the kernel (default_permissions).
        let t = Instant::now();
        reply.ok();
        self.stats.record(op("access"), t, true);
    }
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let me = self.clone_for_reply();
        let d = self.done(
            "create",
            move |r: model::FsResult<(Entry, Opened)>| match r {
                Ok((e, o)) => {
                    let a = attr(&e.attr);
                    let g = Generation(e.generation);
                    match me.open_reply(e.attr.ino, &o, |fd| reply.open_backing(fd)) {
                        (f, Some(id)) => {
                            reply.created_passthrough(&e.ttl, &a, g, FileHandle(o.fh), f, &id)
                        }
                        (f, None) => reply.created(&e.ttl, &a, g, FileHandle(o.fh), f),
                    }
                }
                Err(e) => reply.error(errno(e)),
            },
        );
        let mode = mode & !(umask & 0o777);
        self.fs.create(&ctx(req), parent.0, name, mode, flags, d)
    }
    #[allow(clippy::too_many_arguments)]
    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let d = self.empty_done("fallocate", reply);
        self.fs
            .fallocate(&ctx(req), ino.0, fh.0, offset, length, mode, d)
    }
    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let d = self.done("lseek", move |r: model::FsResult<i64>| match r {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        });
        self.fs.lseek(&ctx(req), ino.0, fh.0, offset, whence, d)
    }
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let d = self.written_done("copy_file_range", reply);
        let flags = u32::try_from(flags.bits()).unwrap_or(u32::MAX);
        self.fs.copy_file_range(
            &ctx(req),
            fh_in.0,
            offset_in,
            fh_out.0,
            offset_out,
            len,
            flags,
            d,
        )
    }
}
