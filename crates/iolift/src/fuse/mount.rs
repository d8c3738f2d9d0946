//! Mounting and unmounting the FUSE block file: `/dev/fuse`, `mount(2)`,
//! the `fuser` session and its reader threads, and the checks around them
//! (root, stale mounts).

use super::blockfile::BlockFile;
use crate::export::Export;
use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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

/// Mounts `export`'s device as the regular file `file` (its parent directory becomes
/// the mount point, created if missing), read-only if the export is.
/// Completions that do not finish at once run on `rt`; `threads` FUSE
/// reader threads.
pub fn mount(
    export: &Export,
    file: &Path,
    rt: tokio::runtime::Handle,
    threads: usize,
) -> Result<FuseMount> {
    let dev = export.dev.clone();
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
    let read_only = info.read_only || export.read_only;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    if let Err(e) =
        iolift_fs::kernel::mount_fuse(&fd, &dir, "iolift", "fuse.iolift", flags, (uid, gid))
    {
        bail!("mount(2) of FUSE at {} failed: {e}", dir.display());
    }
    let mut m = FuseMount {
        file: dir.join(&name),
        dir,
        session: None,
        mounted: true,
    };
    let fs = BlockFile::new(dev, info.clone(), name, read_only, rt, (uid, gid));
    let mut cfg = fuser::Config::default();
    cfg.acl = fuser::SessionACL::All;
    cfg.n_threads = Some(threads.clamp(1, 64));
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
