//! Loop devices over the FUSE file, through util-linux `losetup`.
//!
//! `losetup -f --show --direct-io=on FILE` picks a free device, binds it
//! (LOOP_CONFIGURE) and turns on direct I/O, so the loop driver sends
//! asynchronous O_DIRECT reads/writes to the FUSE file instead of going
//! through the page cache twice. We check `/sys/block/loopN/loop/dio`
//! afterwards: a silent fallback to buffered I/O would hide the server
//! behind the page cache.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

fn losetup() -> Command {
    let mut c = Command::new("losetup");
    // Debian keeps losetup in /sbin, which a plain user's PATH may lack.
    let path = std::env::var("PATH").unwrap_or_default();
    c.env("PATH", format!("{path}:/usr/sbin:/sbin"));
    c
}

/// Binds a free loop device to `file` with direct I/O; returns `/dev/loopN`.
pub fn attach(file: &Path, read_only: bool) -> Result<PathBuf> {
    let mut c = losetup();
    c.args(["-f", "--show", "--direct-io=on"]);
    if read_only {
        c.arg("-r");
    }
    c.arg(file);
    let out = c
        .output()
        .context("cannot run losetup (util-linux `mount` package)")?;
    if !out.status.success() {
        bail!(
            "losetup {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !dev.starts_with("/dev/loop") {
        bail!("losetup printed {dev:?}, expected /dev/loopN");
    }
    let dev = PathBuf::from(dev);
    match dio(&dev) {
        Some(true) => {}
        other => {
            let _ = detach(&dev);
            bail!(
                "{}: direct I/O could not be enabled on {} (dio={other:?})",
                dev.display(),
                file.display()
            );
        }
    }
    Ok(dev)
}

/// `loopN` from `/dev/loopN`.
pub fn name(dev: &Path) -> Result<String> {
    let n = dev
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| {
            n.starts_with("loop") && n[4..].chars().all(|c| c.is_ascii_digit()) && n.len() > 4
        })
        .with_context(|| format!("{} is not a loop device (/dev/loopN)", dev.display()))?;
    Ok(n.to_string())
}

/// Whether direct I/O is on, `None` if the device is not bound.
pub fn dio(dev: &Path) -> Option<bool> {
    let n = name(dev).ok()?;
    let s = std::fs::read_to_string(format!("/sys/block/{n}/loop/dio")).ok()?;
    Some(s.trim() == "1")
}

/// The file a loop device is bound to, `None` if it is free.
pub fn backing_file(dev: &Path) -> Option<PathBuf> {
    let n = name(dev).ok()?;
    let s = std::fs::read_to_string(format!("/sys/block/{n}/loop/backing_file")).ok()?;
    let s = s.trim_end_matches('\n');
    // The kernel appends " (deleted)" when the file is gone.
    let s = s.strip_suffix(" (deleted)").unwrap_or(s);
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// Loop devices bound to `file`.
pub fn find(file: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return out;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        if !n.starts_with("loop") {
            continue;
        }
        let dev = PathBuf::from(format!("/dev/{n}"));
        if backing_file(&dev).as_deref() == Some(file) {
            out.push(dev);
        }
    }
    out.sort();
    out
}

/// Unbinds a loop device (`losetup -d`). If it is still open (a mounted
/// file system) the kernel only marks it for auto-clear on last close.
pub fn detach(dev: &Path) -> Result<()> {
    let out = losetup()
        .arg("-d")
        .arg(dev)
        .output()
        .context("cannot run losetup")?;
    if !out.status.success() {
        bail!(
            "losetup -d {} failed: {}",
            dev.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Waits up to `timeout` until `dev` is no longer bound.
pub fn wait_free(dev: &Path, timeout: std::time::Duration) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        if backing_file(dev).is_none() {
            return true;
        }
        if t0.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_names() {
        assert_eq!(name(Path::new("/dev/loop7")).unwrap(), "loop7");
        assert!(name(Path::new("/dev/sda")).is_err());
        assert!(name(Path::new("/dev/loop")).is_err());
        assert!(name(Path::new("/dev/loopx1")).is_err());
    }
}
