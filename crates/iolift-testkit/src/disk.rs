//! Helpers for tests that use the kernel's block layer and file systems
//! (root only: mount(2), loop devices) and for the `qemu-img` calls that
//! several tests repeat.

use crate::process::{cmd, run_ok, run_timeout, CMD_TIMEOUT};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A loop device over an image file (`losetup -f --show --direct-io=on`),
/// detached on drop. Fails the test, naming the image and losetup's words,
/// when no loop device can be had (it needs root and loop devices).
pub struct Loop(PathBuf);

impl Loop {
    pub fn new(img: &Path) -> Loop {
        let o = Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(img)
            .output()
            .expect("losetup: not installed");
        assert!(
            o.status.success(),
            "losetup -f --show {}: {} (this test needs root and loop devices)",
            img.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        Loop(PathBuf::from(
            String::from_utf8(o.stdout).unwrap().trim().to_string(),
        ))
    }

    /// The device, e.g. /dev/loop3.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// Fails the test unless it runs as root; `why` says what needs root
/// (e.g. "the FUSE tests need root (mount(2))").
pub fn require_root(why: &str) {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "{why}: run the suite as root (CI does)");
}

/// Whether `dir` is a mount point now (its canonical path is a mount point
/// in /proc/self/mountinfo). False when `dir` does not exist.
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(d) = dir.canonicalize() else {
        return false;
    };
    let Some(d) = d.to_str() else {
        return false;
    };
    let m = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    m.lines().any(|l| l.split_whitespace().nth(4) == Some(d))
}

/// Best-effort cleanup: `umount DIR`, then `umount -l DIR` if it is still
/// mounted. Errors are ignored (for Drop and after a crash); returns
/// whether `dir` is unmounted afterwards.
pub fn umount_lazy(dir: &Path) -> bool {
    if is_mounted(dir) {
        let _ = Command::new("umount")
            .arg(dir)
            .stderr(Stdio::null())
            .status();
    }
    if is_mounted(dir) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(dir)
            .stderr(Stdio::null())
            .status();
    }
    !is_mounted(dir)
}

/// A file system mounted by the test; unmounted on drop (lazily if it is
/// busy), also when the test panics half-way.
pub struct Mount {
    dir: PathBuf,
    mounted: bool,
}

impl Mount {
    /// `mount DEV DIR` (creating DIR); asserts it succeeds.
    pub fn new(dev: &Path, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        run_ok(cmd("mount").arg(dev).arg(dir));
        Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `umount DIR`; asserts it succeeds (a busy or broken mount fails the
    /// test). Does nothing the second time.
    pub fn umount(&mut self) {
        if self.mounted {
            run_ok(cmd("umount").arg(&self.dir));
            self.mounted = false;
        }
    }

    /// Unmounts without asserting (lazily if need be), for a file system
    /// whose device has gone away; returns whether it is unmounted.
    pub fn release(&mut self) -> bool {
        self.mounted = false;
        umount_lazy(&self.dir)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            umount_lazy(&self.dir);
        }
    }
}

/// `mkfs.ext4 -F -q -E nodiscard DEV` (nodiscard: mkfs does not trim the
/// whole device first, which would only slow the test).
pub fn mkfs_ext4(dev: &Path) {
    run_ok(
        cmd("mkfs.ext4")
            .args(["-F", "-q", "-E", "nodiscard"])
            .arg(dev),
    );
}

/// `e2fsck -f -n DEV` (forced, read-only) must report a clean file system.
pub fn fsck_clean(dev: &Path) {
    let o = run_timeout(cmd("e2fsck").args(["-f", "-n"]).arg(dev), CMD_TIMEOUT);
    assert!(
        o.status.success(),
        "e2fsck -fn {} not clean:\n{}",
        dev.display(),
        o.all()
    );
}

/// `sync`: everything written so far reaches the devices.
pub fn sync() {
    run_ok(&mut cmd("sync"));
}

/// `qemu-img convert -n -f raw -O raw SRC DST`: copies raw `src` (a file
/// or an NBD URI) onto the existing target `dst` (not created, not
/// resized); asserts success.
pub fn qemu_img_convert(src: impl AsRef<OsStr>, dst: impl AsRef<OsStr>) {
    run_ok(
        cmd("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(src)
            .arg(dst),
    );
}

/// `qemu-img compare -f raw -F raw A B`: true when the two raw images
/// hold the same bytes (exit 0), false when they differ (exit 1); any
/// other outcome (an error, a timeout) fails the test.
pub fn qemu_img_compare(a: impl AsRef<OsStr>, b: impl AsRef<OsStr>) -> bool {
    let o = run_timeout(
        cmd("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(a)
            .arg(b),
        CMD_TIMEOUT,
    );
    match o.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("qemu-img compare failed\n{}", o.report()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_mount_points() {
        assert!(is_mounted(Path::new("/")));
        assert!(is_mounted(Path::new("/proc")));
        assert!(!is_mounted(Path::new("/no/such/dir")));
        let tmp = std::env::temp_dir().join(format!("iolift-testkit-m{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        assert!(!is_mounted(&tmp));
        assert!(umount_lazy(&tmp), "a plain directory counts as unmounted");
        std::fs::remove_dir(&tmp).unwrap();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let r = std::panic::catch_unwind(|| require_root("this check needs root"));
        assert_eq!(r.is_ok(), root);
    }

    #[test]
    fn qemu_img_convert_then_compare() {
        let tmp = std::env::temp_dir().join(format!("iolift-testkit-q{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let (a, b) = (tmp.join("a.raw"), tmp.join("b.raw"));
        crate::write_random_file(&a, 1 << 20, 3);
        std::fs::write(&b, vec![0u8; 1 << 20]).unwrap();
        assert!(!qemu_img_compare(&a, &b), "random data equals zeros?");
        qemu_img_convert(&a, &b);
        assert!(qemu_img_compare(&a, &b));
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let r = std::panic::catch_unwind(|| qemu_img_compare(&a, tmp.join("missing.raw")));
        assert!(r.is_err(), "a missing image must fail, not compare unequal");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
