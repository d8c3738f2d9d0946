//! FUSE front-end: one device appears as one regular file on a FUSE mount.
//!
//! The mount holds a single file (e.g. `/run/iolift/disk0/disk.img`) whose
//! size is the device size. Its reads, writes, fsync/flush and fallocate go
//! straight into the device's [`BlockDev::submit`]:
//!
//! | file operation                    | block request                     |
//! | --------------------------------- | --------------------------------- |
//! | read                              | `Read` (clamped at end of file)   |
//! | write                             | `Write` (ENOSPC past the end)     |
//! | fsync, fdatasync, flush (close)   | `Flush`                           |
//! | fallocate PUNCH_HOLE\|KEEP_SIZE   | `Trim`                            |
//! | fallocate ZERO_RANGE              | `WriteZeroes` (no_hole)           |
//! | fallocate 0 / KEEP_SIZE           | nothing (the range exists)        |
//! | truncate to another size          | EPERM                             |
//!
//! The file is opened with `FOPEN_DIRECT_IO` (the kernel page cache is
//! bypassed, so NBD clients of the same export see the same bytes) and
//! `FOPEN_PARALLEL_DIRECT_WRITES` (writes are not serialised on the inode
//! lock); `FUSE_ASYNC_DIO` lets the loop driver's asynchronous direct I/O
//! keep many requests in flight.
//!
//! Threads: the `fuser` session runs `threads` reader threads, each with its
//! own cloned `/dev/fuse` fd. A reader submits the request and polls the
//! returned future once in place: a device that completes at once (memory,
//! null) is answered from the same thread without a hand-off; otherwise the
//! future is moved to a task on the tokio runtime, which writes the reply
//! when it completes, so the reader goes straight back to `/dev/fuse`.
//!
//! Mounting: we open `/dev/fuse` and call `mount(2)` ourselves (root only),
//! then hand the fd to `fuser::Session::from_fd`; no libfuse, no
//! `fusermount3`. See `docs/fuse.md`.

pub mod loopdev;

use crate::block::{DevInfo, DevRef, Errno, Flags, IoFuture, Reply, Request};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, WriteFlags,
};
use std::ffi::{CString, OsStr};
use std::future::Future;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::task::{Context as TaskCx, Poll, Waker};
use std::time::{Duration, SystemTime};

const ROOT: INodeNo = INodeNo(1);
const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(3600);
/// Largest trim/zero request handed to the device at once.
const CHUNK: u64 = 1 << 30;
/// Largest read/write the kernel sends (FUSE caps it at 256 pages anyway).
const MAX_IO: u32 = 1 << 20;

/// How to mount.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    /// FUSE reader threads (each with its own /dev/fuse fd).
    pub threads: usize,
    /// Export read-only even if the device is writable.
    pub read_only: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            threads: 2,
            read_only: false,
        }
    }
}

/// Checks that this process can mount FUSE: root and a usable /dev/fuse.
/// Returns the opened /dev/fuse fd.
pub fn open_dev_fuse() -> Result<OwnedFd> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("FUSE mount needs root (mount(2) of /dev/fuse); run as root");
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(f) => Ok(f.into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("/dev/fuse is missing: this kernel or container has no FUSE (CONFIG_FUSE_FS)")
        }
        Err(e) => bail!("cannot open /dev/fuse: {e}"),
    }
}

/// A mounted FUSE file. Unmounts (lazily if busy) on drop.
pub struct FuseMount {
    dir: PathBuf,
    file: PathBuf,
    session: Option<fuser::BackgroundSession>,
    mounted: bool,
}

impl std::fmt::Debug for FuseMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FuseMount({})", self.file.display())
    }
}

impl FuseMount {
    /// The path of the block file.
    pub fn file(&self) -> &Path {
        &self.file
    }
    /// The mount point (parent of the file).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Unmounts and waits for the reader threads. Fails with EBUSY while
    /// something (a loop device) still holds the file open.
    pub fn unmount(mut self) -> Result<()> {
        self.do_unmount(false)
    }

    fn do_unmount(&mut self, lazy: bool) -> Result<()> {
        if self.mounted {
            umount(&self.dir, lazy)?;
            self.mounted = false;
        }
        if let Some(s) = self.session.take() {
            if let Err(e) = s.join() {
                tracing::warn!("FUSE session for {}: {e}", self.file.display());
            }
        }
        Ok(())
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if self.mounted && umount(&self.dir, false).is_ok() {
            self.mounted = false;
        }
        if self.mounted {
            // Busy: detach it so the reader threads see ENODEV once the
            // last user closes the file; do not wait for them.
            let _ = umount(&self.dir, true);
            self.mounted = false;
            self.session.take();
            return;
        }
        let _ = self.do_unmount(false);
    }
}

/// Unmounts `dir` (MNT_DETACH if `lazy`).
pub fn umount(dir: &Path, lazy: bool) -> Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes()).context("mount point path")?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: umount2 with a valid NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), flags) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        bail!("cannot unmount {}: {e}", dir.display());
    }
    Ok(())
}

/// Whether `dir` is a FUSE mount point of ours (fstype fuse.iolift).
pub fn is_our_mount(dir: &Path) -> bool {
    let Ok(m) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.to_string_lossy();
    m.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            return false;
        };
        f.get(4).map(|p| unescape_mount(p)) == Some(want.to_string())
            && f.get(sep + 1) == Some(&"fuse.iolift")
    })
}

fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Mounts `dev` as the regular file `file` (its parent directory becomes
/// the mount point, created if missing). Completions that do not finish at
/// once run on `rt`.
pub fn mount(
    dev: DevRef,
    file: &Path,
    rt: tokio::runtime::Handle,
    opts: &FuseOptions,
) -> Result<FuseMount> {
    let name = file
        .file_name()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .with_context(|| format!("FUSE file {}: needs a file name", file.display()))?
        .to_os_string();
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let fd = open_dev_fuse()?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create mount point {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("mount point {}", dir.display()))?;
    if is_our_mount(&dir) {
        bail!(
            "{} is already an iolift FUSE mount (stale after a crash? `umount -l {}` or `iolift detach {}`)",
            dir.display(),
            dir.display(),
            dir.join(&name).display()
        );
    }
    let info = dev.info();
    if info.size == 0 {
        bail!("device {} has size 0", dev.name());
    }
    let read_only = info.read_only || opts.read_only;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},allow_other,default_permissions",
        fd.as_raw_fd()
    );
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    let src = CString::new("iolift").unwrap();
    let fstype = CString::new("fuse.iolift").unwrap();
    let target = CString::new(dir.as_os_str().as_bytes()).context("mount point path")?;
    let cdata = CString::new(data).unwrap();
    // SAFETY: all pointers are valid NUL-terminated strings owned here.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            cdata.as_ptr().cast(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        bail!("mount(2) of FUSE at {} failed: {e}", dir.display());
    }
    let mut m = FuseMount {
        file: dir.join(&name),
        dir,
        session: None,
        mounted: true,
    };
    let now = SystemTime::now();
    let fs = BlockFile {
        dev,
        info: info.clone(),
        name,
        read_only,
        rt,
        uid,
        gid,
        now,
    };
    let mut cfg = fuser::Config::default();
    cfg.acl = fuser::SessionACL::All;
    cfg.n_threads = Some(opts.threads.clamp(1, 64));
    cfg.clone_fd = true;
    let session =
        fuser::Session::from_fd(fs, fd, fuser::SessionACL::All, cfg).context("FUSE handshake")?;
    m.session = Some(session.spawn().context("FUSE session threads")?);
    tracing::info!(
        "FUSE: {} ({} bytes{}) on {}",
        m.file.display(),
        info.size,
        if read_only { ", read-only" } else { "" },
        m.dir.display()
    );
    Ok(m)
}

/// Which export a `--fuse [NAME=]FILE` spec names, and the file.
///
/// `FILE` alone names the default export: the one called `default` (else
/// `""`), or the only export. `NAME=FILE` is taken as a name only when
/// NAME is an export, so file names may contain `=`.
pub fn parse_fuse_spec<'a>(
    spec: &str,
    names: &'a [String],
    default: Option<&'a str>,
) -> Result<(&'a str, PathBuf)> {
    if spec.is_empty() {
        bail!("--fuse: empty FILE");
    }
    if let Some((n, f)) = spec.split_once('=') {
        if let Some(name) = names.iter().find(|x| x.as_str() == n) {
            if f.is_empty() {
                bail!("--fuse {spec}: empty FILE");
            }
            return Ok((name.as_str(), PathBuf::from(f)));
        }
    }
    let name = match default {
        Some(d) if names.iter().any(|x| x == d) => d,
        _ => match names.iter().find(|x| x.is_empty()) {
            Some(n) => n.as_str(),
            None if names.len() == 1 => names[0].as_str(),
            None => bail!("--fuse {spec}: no default export among {names:?}; use --fuse NAME=FILE"),
        },
    };
    Ok((name, PathBuf::from(spec)))
}

/// Mounts every `--fuse [NAME=]FILE` of `iolift serve`; `exports` are
/// `(name, device, read_only)`. Locks the process memory first (the file
/// is meant to back a loop device on this host).
pub fn mount_exports(
    specs: &[String],
    exports: &[(String, DevRef, bool)],
    default: Option<&str>,
    rt: tokio::runtime::Handle,
) -> Result<Vec<FuseMount>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    // SAFETY: mlockall takes flags only.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        tracing::warn!(
            "mlockall failed ({}): a loop device on the FUSE file may deadlock under memory pressure",
            std::io::Error::last_os_error()
        );
    }
    let names: Vec<String> = exports.iter().map(|e| e.0.clone()).collect();
    let mut out = Vec::new();
    for spec in specs {
        let (name, file) = parse_fuse_spec(spec, &names, default)?;
        let (_, dev, ro) = exports.iter().find(|e| e.0 == name).unwrap();
        let opts = FuseOptions {
            read_only: *ro,
            ..FuseOptions::default()
        };
        let m = mount(dev.clone(), &file, rt.clone(), &opts)
            .with_context(|| format!("--fuse {spec} (export {name:?})"))?;
        out.push(m);
    }
    Ok(out)
}

/// The filesystem: a root directory holding one file backed by `dev`.
struct BlockFile {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_specs() {
        let names: Vec<String> = vec!["".into(), "a".into()];
        let (n, f) = parse_fuse_spec("/x/d.img", &names, None).unwrap();
        assert_eq!((n, f), ("", PathBuf::from("/x/d.img")));
        let (n, f) = parse_fuse_spec("a=/x/a.img", &names, None).unwrap();
        assert_eq!((n, f), ("a", PathBuf::from("/x/a.img")));
        // Not an export name: the whole spec is the file.
        let (n, f) = parse_fuse_spec("b=/x/a.img", &names, None).unwrap();
        assert_eq!((n, f), ("", PathBuf::from("b=/x/a.img")));
        let (n, _) = parse_fuse_spec("/x/d.img", &names, Some("a")).unwrap();
        assert_eq!(n, "a");
        let two: Vec<String> = vec!["a".into(), "b".into()];
        assert!(parse_fuse_spec("/x/d.img", &two, None).is_err());
        let one: Vec<String> = vec!["a".into()];
        assert_eq!(parse_fuse_spec("/x/d.img", &one, None).unwrap().0, "a");
        assert!(parse_fuse_spec("", &one, None).is_err());
        assert!(parse_fuse_spec("a=", &one, None).is_err());
    }
}
