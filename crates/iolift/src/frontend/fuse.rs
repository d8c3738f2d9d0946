//! FUSE block files as front-ends: `iolift serve --fuse [NAME=]FILE`
//! ([`start`]: one file per spec, next to the NBD listeners) and the file
//! plus loop device of `iolift attach` ([`LoopFile`]). The file system and
//! the mounting are in [`crate::fuse`].

use super::{BoxFuture, Frontend};
use crate::config::{Settings, DEFAULT_FUSE_THREADS};
use crate::export::Export;
use crate::fuse::{self, loopdev, FuseMount};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Locks the process memory: a loop device on a FUSE file served by this
/// process must never wait, during page reclaim, for one of our pages to
/// be swapped in.
pub fn mlock_all() {
    // SAFETY: mlockall takes flags only.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        tracing::warn!(
            "mlockall failed ({}): a loop device on the FUSE file may deadlock under memory pressure",
            std::io::Error::last_os_error()
        );
    }
}

/// The FUSE files of `iolift serve`; unmounted when stopped or dropped.
struct BlockFiles {
    mounts: Vec<FuseMount>,
}

/// Mounts every FUSE file of the settings (none: `None`). Locks the
/// process memory first, as the files are meant to back loop devices on
/// this host.
pub fn start<'a>(
    s: &'a Settings,
    exports: &'a [Arc<Export>],
) -> BoxFuture<'a, Result<Option<Box<dyn Frontend>>>> {
    Box::pin(async move {
        if s.fuse.is_empty() {
            return Ok(None);
        }
        mlock_all();
        let rt = tokio::runtime::Handle::current();
        let mut files = BlockFiles { mounts: Vec::new() };
        for f in &s.fuse {
            // The settings resolved every spec to an existing export.
            let Some(e) = exports.iter().find(|e| e.name == f.export) else {
                anyhow::bail!("--fuse {}: no export {:?}", f.spec, f.export);
            };
            let m = tokio::task::block_in_place(|| {
                fuse::mount(e, &f.file, rt.clone(), DEFAULT_FUSE_THREADS)
            })
            .with_context(|| format!("--fuse {} (export {:?})", f.spec, f.export))?;
            files.mounts.push(m);
        }
        Ok(Some(Box::new(files) as Box<dyn Frontend>))
    })
}

impl Frontend for BlockFiles {
    fn kind(&self) -> &'static str {
        "fuse"
    }

    fn hints(&self) -> Vec<String> {
        self.mounts
            .iter()
            .map(|m| format!("losetup --direct-io=on -f --show {}", m.file().display()))
            .collect()
    }

    /// Unmounts every file (lazily if a loop device still holds it) and
    /// waits for the reader threads of the others.
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || drop(self)).await;
        })
    }
}

/// `iolift attach`'s front-end: one FUSE file and, unless `--no-loop`, a
/// loop device bound to it.
pub struct LoopFile {
    mount: Option<FuseMount>,
    loop_dev: Option<PathBuf>,
}

impl LoopFile {
    /// Mounts `export` as `file` with `threads` reader threads, then binds
    /// a loop device to it if `with_loop`.
    pub fn start(
        export: &Export,
        file: &Path,
        rt: tokio::runtime::Handle,
        threads: usize,
        with_loop: bool,
    ) -> Result<LoopFile> {
        let mount = fuse::mount(export, file, rt, threads)?;
        let loop_dev = if with_loop {
            Some(loopdev::attach(mount.file(), export.read_only)?)
        } else {
            None
        };
        Ok(LoopFile {
            mount: Some(mount),
            loop_dev,
        })
    }

    /// The FUSE mount's directory.
    pub fn dir(&self) -> &Path {
        self.mount
            .as_ref()
            .map(|m| m.dir())
            .unwrap_or(Path::new(""))
    }

    /// The FUSE file.
    pub fn file(&self) -> &Path {
        self.mount
            .as_ref()
            .map(|m| m.file())
            .unwrap_or(Path::new(""))
    }

    /// What users open: the loop device, or the FUSE file without one.
    pub fn device(&self) -> PathBuf {
        match &self.loop_dev {
            Some(d) => d.clone(),
            None => self.file().to_path_buf(),
        }
    }

    /// Unbinds the loop device (the kernel finishes its I/O first), then
    /// unmounts (lazily if the file is still busy).
    fn teardown(&mut self) {
        if let Some(d) = self.loop_dev.take() {
            if let Err(e) = loopdev::detach(&d) {
                tracing::warn!("{e:#}");
            }
            if !loopdev::wait_free(&d, Duration::from_secs(10)) {
                tracing::warn!("{} is still in use (a mounted file system?)", d.display());
            }
        }
        if let Some(m) = self.mount.take() {
            let dir = m.dir().to_path_buf();
            if let Err(e) = m.unmount() {
                tracing::warn!("{e:#}; detaching the mount lazily");
                let _ = fuse::umount(&dir, true);
            }
        }
    }
}

impl Frontend for LoopFile {
    fn kind(&self) -> &'static str {
        "fuse+loop"
    }

    fn hints(&self) -> Vec<String> {
        vec![self.device().display().to_string()]
    }

    fn stop(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || self.teardown()).await;
        })
    }
}

impl Drop for LoopFile {
    fn drop(&mut self) {
        self.teardown();
    }
}
