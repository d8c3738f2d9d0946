//! The `mirror:DIR` backend: a host directory served as it is.
//!
//! Every node is an O_PATH fd of a host inode ([`nodes`]), every name a
//! single checked component opened beneath its parent's fd with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`,
//! and every change an `*at` call on those fds. No path is ever built from
//! the root, so paths longer than PATH_MAX work, renames under the tree
//! (by this mount or on the host) leave every node right, and nothing
//! outside DIR is reached through `..` or a symlink: the server never
//! follows a symlink at all (the kernel resolves them on the client side).
//! Open files ([`files`]) and directory listings ([`dir`]) are fds of
//! their own, reopened from the node through `/proc/self/fd`, so a file
//! unlinked while open stays readable and writable.
//!
//! Reads of open files go to an io_uring ([`uring`], at most
//! `uring_depth` in flight) and complete later ("complete later"); writes
//! too with `uring_writes` (off by default: buffered host writes run on
//! io_uring's worker threads, dearer than a pwrite). Otherwise, with
//! `uring_depth` 0, or when the ring is full or cannot be set up, they run
//! on the front-end's worker thread that received them (pread/pwrite on
//! the host fd, "reply now"). With `passthrough` the kernel reads and
//! writes the host file itself (FUSE passthrough).

mod dir;
mod files;
mod nodes;
mod sys;
mod uring;

use crate::fs::FileSystem;
use crate::model::*;
use bytes::Bytes;
use files::Handles;
use nodes::{Node, Nodes};
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The mirror's options (each a budget or a switch).
#[derive(Clone, Debug)]
pub struct MirrorOptions {
    /// Nodes the kernel may hold at once (each holds one fd).
    pub max_nodes: usize,
    /// Open files and directories at once (each holds one fd).
    pub max_handles: usize,
    /// How long the kernel may cache attributes and names.
    pub ttl: Duration,
    /// Open files for FUSE passthrough (the front-end must offer it).
    pub passthrough: bool,
    /// The kernel's writeback cache is on: files opened write-only are
    /// opened read-write on the host and O_APPEND is left to the kernel.
    pub writeback: bool,
    /// Reads and writes in flight on the io_uring data path at most (0:
    /// none, every read and write runs on the thread that received it).
    /// Each holds its buffer, at most one request's data (1 MiB).
    pub uring_depth: usize,
    /// Writes go to the ring too. Off by default: the host's buffered
    /// writes do not complete inside the submit, so io_uring runs each on
    /// an io-wq worker thread, which cost 3.5x the CPU of a pwrite per 4 KiB
    /// write on ext4 here (docs/measurements/fs.md).
    pub uring_writes: bool,
}

impl Default for MirrorOptions {
    fn default() -> Self {
        MirrorOptions {
            max_nodes: 1 << 18,
            max_handles: 4096,
            ttl: Duration::from_secs(1),
            passthrough: false,
            writeback: false,
            uring_depth: 64,
            uring_writes: false,
        }
    }
}

/// The mirror backend over one host directory.
pub struct MirrorFs {
    dir: PathBuf,
    nodes: Nodes,
    handles: Handles,
    proc_fd: OwnedFd,
    opts: MirrorOptions,
    euid: u32,
    uring: Option<uring::Uring>,
}

impl MirrorFs {
    /// Opens `dir` (which must be a directory) to serve it.
    pub fn open(dir: &Path, opts: MirrorOptions) -> std::io::Result<MirrorFs> {
        let root = sys::open_root(dir)
            .map_err(|e| std::io::Error::new(e.kind(), format!("mirror:{}: {e}", dir.display())))?;
        let st = sys::fstat(root.as_fd()).map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
        let proc_fd = sys::open_root(Path::new("/proc/self/fd"))?;
        let mut opts = opts;
        let want = (opts.max_nodes + opts.max_handles + 256) as u64;
        let limit = sys::raise_nofile(want);
        if limit < want {
            // Each node and handle holds an fd: keep the node budget within
            // the open-files limit, so lookups fail with ENFILE (counted)
            // rather than EMFILE anywhere.
            let fit = (limit as usize)
                .saturating_sub(opts.max_handles + 256)
                .max(16);
            tracing::info!(
                "mirror: open-files limit {limit}: at most {fit} nodes (asked {})",
                opts.max_nodes
            );
            opts.max_nodes = opts.max_nodes.min(fit);
        }
        let uring = match opts.uring_depth {
            0 => None,
            d => match uring::Uring::new(d) {
                Ok(u) => Some(u),
                Err(e) => {
                    tracing::warn!(
                        "mirror: no io_uring ({e}): reads and writes run on the worker threads"
                    );
                    None
                }
            },
        };
        Ok(MirrorFs {
            uring,
            dir: dir.to_path_buf(),
            nodes: Nodes::new(root, (st.st_dev, st.st_ino), opts.max_nodes),
            handles: Handles::new(opts.max_handles),
            proc_fd,
            // SAFETY: geteuid has no preconditions.
            euid: unsafe { libc::geteuid() },
            opts,
        })
    }

    /// Nodes and open handles held now.
    pub fn held(&self) -> (usize, usize) {
        (self.nodes.len(), self.handles.len())
    }

    fn attr_of(&self, node: &Node, st: &libc::stat) -> Attr {
        Attr {
            ino: node.id,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: sys::time(st.st_atime, st.st_atime_nsec),
            mtime: sys::time(st.st_mtime, st.st_mtime_nsec),
            ctime: sys::time(st.st_ctime, st.st_ctime_nsec),
            mode: st.st_mode,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
        }
    }

    fn attr(&self, node: &Node) -> FsResult<Attr> {
        let st = sys::fstat(node.fd.as_fd())?;
        Ok(self.attr_of(node, &st))
    }

    fn dir_node(&self, id: u64) -> FsResult<Arc<Node>> {
        let n = self.nodes.get(id)?;
        if n.kind != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        Ok(n)
    }

    /// Looks `name` up beneath directory node `parent`: one counted lookup.
    /// An inode that has a node already costs one `fstatat` (the name is
    /// one checked component, not followed); only a new one is opened.
    fn lookup_in(&self, parent: &Node, name: &OsStr) -> FsResult<Entry> {
        check_name(name)?;
        let c = sys::cstr(name)?;
        let st = sys::stat_at(parent.fd.as_fd(), &c)?;
        if let Some(node) = self.nodes.find((st.st_dev, st.st_ino)) {
            return Ok(Entry {
                attr: self.attr_of(&node, &st),
                generation: 0,
                ttl: self.opts.ttl,
            });
        }
        let fd = sys::open_beneath(parent.fd.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        self.enter(fd)
    }

    /// Makes (or finds) the node of the inode `fd` (O_PATH) refers to.
    fn enter(&self, fd: OwnedFd) -> FsResult<Entry> {
        let st = sys::fstat(fd.as_fd())?;
        let node = self
            .nodes
            .insert((st.st_dev, st.st_ino), fd, st.st_mode & libc::S_IFMT)?;
        Ok(Entry {
            attr: self.attr_of(&node, &st),
            generation: 0,
            ttl: self.opts.ttl,
        })
    }

    /// Gives a new file to the caller (when we run as root for someone else).
    fn chown_new(&self, ctx: &Ctx, parent: &Node, c: &std::ffi::CStr) -> FsResult<()> {
        if self.euid != 0 || (ctx.uid == 0 && ctx.gid == 0) {
            return Ok(());
        }
        // SAFETY: plain system call with a valid dirfd and name.
        sys::cvt(unsafe {
            libc::fchownat(
                parent.fd.as_raw_fd(),
                c.as_ptr(),
                ctx.uid,
                ctx.gid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
        .map(drop)
    }

    fn make(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mk: impl FnOnce(libc::c_int, &std::ffi::CStr) -> libc::c_int,
    ) -> FsResult<Entry> {
        check_name(name)?;
        let p = self.dir_node(parent)?;
        let c = sys::cstr(name)?;
        sys::cvt(mk(p.fd.as_raw_fd(), &c))?;
        self.chown_new(ctx, &p, &c)?;
        self.lookup_in(&p, name)
    }

    fn setattr_now(&self, ctx: &Ctx, ino: u64, set: SetAttr) -> FsResult<Attr> {
        let node = self.nodes.get(ino)?;
        let is_link = node.kind == libc::S_IFLNK;
        if let Some(mode) = set.mode {
            if is_link {
                return Err(Errno::ENOTSUP);
            }
            let p = sys::proc_path(node.fd.as_raw_fd());
            // SAFETY: NUL-terminated path of our own fd (not a symlink).
            sys::cvt(unsafe { libc::chmod(p.as_ptr(), mode & 0o7777) })?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            sys::chown(
                node.fd.as_fd(),
                set.uid.unwrap_or(u32::MAX),
                set.gid.unwrap_or(u32::MAX),
            )?;
        }
        if let Some(size) = set.size {
            let size = i64::try_from(size).map_err(|_| Errno(libc::EFBIG))?;
            let r = match set.fh.and_then(|fh| self.handles.get(fh).ok()) {
                // SAFETY: plain system call on an fd we own.
                Some(h) => unsafe { libc::ftruncate(h.fd.as_raw_fd(), size) },
                None => {
                    if node.kind != libc::S_IFREG {
                        return Err(if node.kind == libc::S_IFDIR {
                            Errno::EISDIR
                        } else {
                            Errno::EINVAL
                        });
                    }
                    let f = sys::reopen(self.proc_fd.as_fd(), node.fd.as_raw_fd(), libc::O_WRONLY)?;
                    // SAFETY: as above.
                    unsafe { libc::ftruncate(f.as_raw_fd(), size) }
                }
            };
            sys::cvt(r)?;
            if ctx.uid != 0 {
                files::kill_suidgid(node.fd.as_raw_fd())?;
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            sys::utimens(
                node.fd.as_fd(),
                &[sys::timespec(set.atime), sys::timespec(set.mtime)],
            )?;
        }
        self.attr(&node)
    }

    fn xattr_path(&self, ino: u64) -> FsResult<(Arc<Node>, std::ffi::CString)> {
        let node = self.nodes.get(ino)?;
        if node.kind == libc::S_IFLNK {
            return Err(Errno::ENOTSUP);
        }
        let p = sys::proc_path(node.fd.as_raw_fd());
        Ok((node, p))
    }
}

/// A getxattr/listxattr answer from a `-1 / size` system call result.
fn xattr_reply(size: u32, call: impl Fn(*mut libc::c_void, usize) -> isize) -> FsResult<Xattr> {
    if size == 0 {
        let n = call(std::ptr::null_mut(), 0);
        if n < 0 {
            return Err(Errno::last());
        }
        return Ok(Xattr::Size(n as u32));
    }
    let mut buf = vec![0u8; size as usize];
    let n = call(buf.as_mut_ptr().cast(), buf.len());
    if n < 0 {
        return Err(Errno::last());
    }
    buf.truncate(n as usize);
    Ok(Xattr::Data(buf))
}

impl FileSystem for MirrorFs {
    fn name(&self) -> String {
        format!("mirror:{}", self.dir.display())
    }

    fn lookup(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<Entry>) {
        done.send(self.dir_node(parent).and_then(|p| self.lookup_in(&p, name)))
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        self.nodes.forget(ino, nlookup)
    }

    fn getattr(&self, _: &Ctx, ino: u64, fh: Option<u64>, done: Done<Attr>) {
        let r =
            self.nodes
                .get(ino)
                .and_then(|n| match fh.and_then(|fh| self.handles.get(fh).ok()) {
                    Some(h) => {
                        let st = sys::fstat(h.fd.as_fd())?;
                        Ok(self.attr_of(&n, &st))
                    }
                    None => self.attr(&n),
                });
        done.send(r)
    }

    fn setattr(&self, ctx: &Ctx, ino: u64, set: SetAttr, done: Done<Attr>) {
        done.send(self.setattr_now(ctx, ino, set))
    }

    fn readlink(&self, _: &Ctx, ino: u64, done: Done<Vec<u8>>) {
        let r = self.nodes.get(ino).and_then(|n| {
            if n.kind != libc::S_IFLNK {
                return Err(Errno::EINVAL);
            }
            let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
            // SAFETY: buf is valid for its length; "" with an O_PATH fd of a link.
            let len = unsafe {
                libc::readlinkat(
                    n.fd.as_raw_fd(),
                    c"".as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if len < 0 {
                return Err(Errno::last());
            }
            buf.truncate(len as usize);
            Ok(buf)
        });
        done.send(r)
    }

    fn symlink(&self, ctx: &Ctx, parent: u64, name: &OsStr, target: &Path, done: Done<Entry>) {
        let t = match sys::cstr(target.as_os_str()) {
            Ok(t) => t,
            Err(e) => return done.err(e),
        };
        // SAFETY (closure): valid strings and dirfd.
        done.send(self.make(ctx, parent, name, |d, c| unsafe {
            libc::symlinkat(t.as_ptr(), d, c.as_ptr())
        }))
    }

    fn mknod(&self, ctx: &Ctx, parent: u64, name: &OsStr, mode: u32, rdev: u32, done: Done<Entry>) {
        done.send(self.make(ctx, parent, name, |d, c| unsafe {
            libc::mknodat(d, c.as_ptr(), mode, rdev as libc::dev_t)
        }))
    }

    fn mkdir(&self, ctx: &Ctx, parent: u64, name: &OsStr, mode: u32, done: Done<Entry>) {
        done.send(self.make(ctx, parent, name, |d, c| unsafe {
            libc::mkdirat(d, c.as_ptr(), mode)
        }))
    }

    fn unlink(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        done.send(self.remove(parent, name, 0))
    }

    fn rmdir(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        done.send(self.remove(parent, name, libc::AT_REMOVEDIR))
    }

    fn rename(
        &self,
        _: &Ctx,
        parent: u64,
        name: &OsStr,
        np: u64,
        nn: &OsStr,
        flags: u32,
        done: Done<()>,
    ) {
        let r = (|| {
            check_name(name)?;
            check_name(nn)?;
            let (p, q) = (self.dir_node(parent)?, self.dir_node(np)?);
            let (a, b) = (sys::cstr(name)?, sys::cstr(nn)?);
            // SAFETY: valid dirfds and names.
            sys::cvt(unsafe {
                libc::renameat2(
                    p.fd.as_raw_fd(),
                    a.as_ptr(),
                    q.fd.as_raw_fd(),
                    b.as_ptr(),
                    flags,
                )
            })
            .map(drop)
        })();
        done.send(r)
    }

    fn link(&self, _: &Ctx, ino: u64, np: u64, nn: &OsStr, done: Done<Entry>) {
        let r = (|| {
            check_name(nn)?;
            let n = self.nodes.get(ino)?;
            let q = self.dir_node(np)?;
            let b = sys::cstr(nn)?;
            // SAFETY: valid fds and names; AT_EMPTY_PATH links the inode of n.fd.
            sys::cvt(unsafe {
                libc::linkat(
                    n.fd.as_raw_fd(),
                    c"".as_ptr(),
                    q.fd.as_raw_fd(),
                    b.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            })?;
            self.lookup_in(&q, nn)
        })();
        done.send(r)
    }

    fn open(&self, _: &Ctx, ino: u64, flags: i32, done: Done<Opened>) {
        done.send(self.open_file(ino, flags))
    }
    fn read(&self, _: &Ctx, _: u64, fh: u64, offset: u64, size: u32, done: Done<Bytes>) {
        self.read_on_ring(fh, offset, size, done)
    }
    fn write(&self, _: &Ctx, _: u64, fh: u64, off: u64, data: &[u8], kill: bool, done: Done<u32>) {
        self.write_on_ring(fh, off, data, kill, done)
    }
    fn handles_killpriv(&self) -> bool {
        true
    }
    fn flush(&self, _: &Ctx, _: u64, _: u64, done: Done<()>) {
        // Nothing to do on close(2): writes went to the host file as they
        // came, and the host fd closes on release. ENOSYS tells the kernel
        // so once; it then stops sending FLUSH, one round trip per close(2)
        // saved (it still writes back cached pages itself first).
        done.err(Errno::ENOSYS)
    }
    fn cacheable_listings(&self) -> bool {
        true
    }
    fn release(&self, _: &Ctx, _: u64, fh: u64, done: Done<()>) {
        done.send(self.handles.remove(fh).map(drop))
    }
    fn fsync(&self, _: &Ctx, _: u64, fh: u64, datasync: bool, done: Done<()>) {
        done.send(self.sync(fh, datasync))
    }
    fn opendir(&self, _: &Ctx, ino: u64, _: i32, done: Done<Opened>) {
        done.send(self.open_dir(ino))
    }
    fn readdir(&self, _: &Ctx, _: u64, fh: u64, off: u64, max: usize, done: Done<Vec<DirEntry>>) {
        done.send(self.list(fh, off, max))
    }
    fn readdirplus(
        &self,
        _: &Ctx,
        ino: u64,
        fh: u64,
        off: u64,
        max: usize,
        done: Done<Vec<(DirEntry, Option<Entry>)>>,
    ) {
        done.send(self.list_plus(ino, fh, off, max))
    }
    fn releasedir(&self, _: &Ctx, _: u64, fh: u64, done: Done<()>) {
        done.send(self.handles.remove(fh).map(drop))
    }
    fn fsyncdir(&self, _: &Ctx, _: u64, fh: u64, datasync: bool, done: Done<()>) {
        done.send(self.sync(fh, datasync))
    }

    fn statfs(&self, _: &Ctx, ino: u64, done: Done<StatFs>) {
        let r = self.nodes.get(ino).and_then(|n| {
            // SAFETY: sv is written by the kernel before being read.
            let mut sv: libc::statfs = unsafe { std::mem::zeroed() };
            sys::cvt(unsafe { libc::fstatfs(n.fd.as_raw_fd(), &mut sv) })?;
            Ok(StatFs {
                blocks: sv.f_blocks,
                bfree: sv.f_bfree,
                bavail: sv.f_bavail,
                files: sv.f_files,
                ffree: sv.f_ffree,
                bsize: sv.f_bsize as u32,
                namelen: sv.f_namelen as u32,
                frsize: sv.f_frsize as u32,
            })
        });
        done.send(r)
    }

    fn setxattr(&self, _: &Ctx, ino: u64, name: &OsStr, value: &[u8], flags: i32, done: Done<()>) {
        let r = (|| {
            let (_n, p) = self.xattr_path(ino)?;
            let k = sys::cstr(name)?;
            // SAFETY: valid strings and buffer.
            sys::cvt(unsafe {
                libc::setxattr(
                    p.as_ptr(),
                    k.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    flags,
                )
            })
            .map(drop)
        })();
        done.send(r)
    }
    fn getxattr(&self, _: &Ctx, ino: u64, name: &OsStr, size: u32, done: Done<Xattr>) {
        let r = (|| {
            let (_n, p) = self.xattr_path(ino)?;
            let k = sys::cstr(name)?;
            // SAFETY: valid strings; buffer pointer/length from xattr_reply.
            xattr_reply(size, |b, l| unsafe {
                libc::getxattr(p.as_ptr(), k.as_ptr(), b, l)
            })
        })();
        done.send(r)
    }
    fn listxattr(&self, _: &Ctx, ino: u64, size: u32, done: Done<Xattr>) {
        let r = (|| {
            let (_n, p) = self.xattr_path(ino)?;
            // SAFETY: as above.
            xattr_reply(size, |b, l| unsafe {
                libc::listxattr(p.as_ptr(), b.cast(), l)
            })
        })();
        done.send(r)
    }
    fn removexattr(&self, _: &Ctx, ino: u64, name: &OsStr, done: Done<()>) {
        let r = (|| {
            let (_n, p) = self.xattr_path(ino)?;
            let k = sys::cstr(name)?;
            // SAFETY: valid strings.
            sys::cvt(unsafe { libc::removexattr(p.as_ptr(), k.as_ptr()) }).map(drop)
        })();
        done.send(r)
    }

    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        done: Done<(Entry, Opened)>,
    ) {
        done.send(self.create_file(ctx, parent, name, mode, flags))
    }
    fn fallocate(&self, _: &Ctx, _: u64, fh: u64, off: u64, len: u64, mode: i32, done: Done<()>) {
        done.send(self.allocate(fh, off, len, mode))
    }
    fn lseek(&self, _: &Ctx, _: u64, fh: u64, off: i64, whence: i32, done: Done<i64>) {
        done.send(self.seek(fh, off, whence))
    }
    fn copy_file_range(
        &self,
        _: &Ctx,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
        done: Done<u32>,
    ) {
        done.send(self.copy_range(fh_in, off_in, fh_out, off_out, len, flags))
    }
}

impl MirrorFs {
    fn remove(&self, parent: u64, name: &OsStr, flags: i32) -> FsResult<()> {
        check_name(name)?;
        let p = self.dir_node(parent)?;
        let c = sys::cstr(name)?;
        // SAFETY: valid dirfd and name.
        sys::cvt(unsafe { libc::unlinkat(p.fd.as_raw_fd(), c.as_ptr(), flags) }).map(drop)
    }
}
