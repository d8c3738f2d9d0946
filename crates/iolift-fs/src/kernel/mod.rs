//! The kernel FUSE front-end: mounts a [`FileSystem`] with mount(2) on
//! /dev/fuse (root), and serves it with `threads` fuser worker threads,
//! each reading its own clone of the /dev/fuse fd (FUSE_DEV_IOC_CLONE: one
//! request queue per thread) and completing requests through [`adapter`].

mod adapter;
mod convert;

use crate::fs::FileSystem;
use crate::stats::OpStats;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How the mount is set up.
#[derive(Clone, Debug)]
pub struct KernelOptions {
    /// Worker threads, each with its own /dev/fuse fd (1..=64).
    pub threads: usize,
    /// FUSE_WRITEBACK_CACHE: the kernel caches writes and sends them later.
    pub writeback_cache: bool,
    /// FUSE_PASSTHROUGH: open files the backend offers go to the kernel.
    pub passthrough: bool,
    /// FUSE_DO_READDIRPLUS (with READDIRPLUS_AUTO).
    pub readdirplus: bool,
    /// How long the kernel may cache attributes from getattr/setattr.
    pub ttl: Duration,
    /// Let the kernel keep directory listings (FOPEN_CACHE_DIR and
    /// KEEP_CACHE on opendir, FUSE_AUTO_INVAL_DATA) where the backend's
    /// directory mtimes change with their entries
    /// ([`FileSystem::cacheable_listings`]).
    pub dir_cache: bool,
    /// The fstype shown in /proc/mounts is `fuse.<subtype>`.
    pub subtype: String,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            threads: 4,
            writeback_cache: false,
            passthrough: false,
            readdirplus: true,
            ttl: Duration::from_secs(1),
            dir_cache: true,
            subtype: "iolift-fs".into(),
        }
    }
}

/// A mounted file system. Dropping it unmounts (lazily if busy) and waits
/// for the worker threads.
pub struct Mounted {
    dir: PathBuf,
    session: Option<fuser::BackgroundSession>,
    mounted: bool,
    pub stats: Arc<OpStats>,
}

/// `e` with `ctx` in front of its message, its kind kept.
pub(crate) fn io_err(ctx: String, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{ctx}: {e}"))
}

/// Unmounts `dir` (MNT_DETACH if `lazy`).
pub fn umount(dir: &Path, lazy: bool) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), if lazy { libc::MNT_DETACH } else { 0 }) };
    if r != 0 {
        return Err(io_err(
            format!("umount {}", dir.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

impl Mounted {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Unmounts (lazily if `lazy` or if the mount is busy) and waits for
    /// the worker threads to finish what they were doing.
    pub fn unmount(mut self, lazy: bool) -> io::Result<()> {
        self.finish(lazy)
    }

    /// Whether the worker threads have stopped (the mount was taken away,
    /// e.g. by `umount` from outside).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    fn finish(&mut self, lazy: bool) -> io::Result<()> {
        if self.mounted {
            self.mounted = false;
            match umount(&self.dir, lazy) {
                Ok(()) => {}
                // Not a mount point any more: unmounted from outside.
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
                Err(_) if !lazy => umount(&self.dir, true)?,
                Err(e) => return Err(e),
            }
        }
        if let Some(s) = self.session.take() {
            s.join()?;
        }
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.finish(false) {
            tracing::warn!("unmounting {}: {e}", self.dir.display());
        }
    }
}

/// `dir` made canonical, checked to be a directory to mount on.
pub(crate) fn mount_point(dir: &Path) -> io::Result<PathBuf> {
    let dir = dir
        .canonicalize()
        .map_err(|e| io_err(format!("mount point {}", dir.display()), e))?;
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("mount point {} is not a directory", dir.display()),
        ));
    }
    Ok(dir)
}

/// Opens /dev/fuse for a mount (root only: mount(2) needs it).
pub(crate) fn open_dev_fuse() -> io::Result<OwnedFd> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "a FUSE mount needs root (mount(2) of /dev/fuse); run as root",
        ));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| io_err("cannot open /dev/fuse".into(), e))?;
    Ok(f.into())
}

/// mount(2) of a FUSE file system served on `fd` (an open /dev/fuse) at
/// `dir`: `source` and `fstype` as /proc/mounts shows them, mount `flags`
/// (MS_*), files owned by `owner` (uid, gid) as the kernel checks access
/// (`default_permissions`, `allow_other`). The error is mount(2)'s own
/// (InvalidInput for a NUL byte in a name), for the caller to put in context.
pub fn mount_fuse(
    fd: &OwnedFd,
    dir: &Path,
    source: &str,
    fstype: &str,
    flags: libc::c_ulong,
    owner: (u32, u32),
) -> io::Result<()> {
    let data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},allow_other,default_permissions",
        fd.as_raw_fd(),
        owner.0,
        owner.1
    );
    let src = CString::new(source)?;
    let fstype = CString::new(fstype)?;
    let target = CString::new(dir.as_os_str().as_bytes())?;
    let cdata = CString::new(data)?;
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
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens /dev/fuse and mounts a file system named `name` (spaces, commas
/// and NULs made `_`) of type `fuse.<subtype>` on `dir` (made canonical),
/// owned by root, nosuid and nodev: the fd that serves it and the mount
/// point. Both front-ends (fuser's and devfuse's) mount this way.
pub(crate) fn mount_dev_fuse(
    dir: &Path,
    name: &str,
    subtype: &str,
) -> io::Result<(OwnedFd, PathBuf)> {
    let fd = open_dev_fuse()?;
    let dir = mount_point(dir)?;
    let src = name.replace(['\0', ' ', ','], "_");
    let fstype = format!("fuse.{subtype}");
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    mount_fuse(&fd, &dir, &src, &fstype, flags, (0, 0))
        .map_err(|e| io_err(format!("mount(2) of FUSE at {}", dir.display()), e))?;
    Ok((fd, dir))
}

/// Mounts `fs` on the directory `dir` and starts serving it.
pub fn mount(fs: Arc<dyn FileSystem>, dir: &Path, opts: &KernelOptions) -> io::Result<Mounted> {
    let (fd, dir) = mount_dev_fuse(dir, &fs.name(), &opts.subtype)?;
    let stats = Arc::new(OpStats::default());
    let mut m = Mounted {
        dir,
        session: None,
        mounted: true,
        stats: stats.clone(),
    };
    let adapter = adapter::Adapter::new(fs, stats, opts.clone());
    let mut cfg = fuser::Config::default();
    cfg.acl = fuser::SessionACL::All;
    cfg.n_threads = Some(opts.threads.clamp(1, 64));
    cfg.clone_fd = true;
    let session = fuser::Session::from_fd(adapter, fd, fuser::SessionACL::All, cfg)
        .map_err(|e| io_err("FUSE handshake".into(), e))?;
    m.session = Some(session.spawn()?);
    Ok(m)
}
