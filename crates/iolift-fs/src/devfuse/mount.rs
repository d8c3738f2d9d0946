//! Opening /dev/fuse and mounting it (mount(2), root), the same way the
//! fuser front-end does, and cloning the fd for more reader threads.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::kernel::{io_err, mount_dev_fuse, open_dev_fuse};

/// Mounts a FUSE file system named `name` of type `fuse.<subtype>` on
/// `dir` (made canonical) and returns the /dev/fuse fd that serves it
/// (`kernel::mount_dev_fuse`, as the fuser front-end mounts).
pub fn mount(dir: &Path, name: &str, subtype: &str) -> io::Result<(OwnedFd, PathBuf)> {
    mount_dev_fuse(dir, name, subtype)
}

/// FUSE_DEV_IOC_CLONE: `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// A second fd on the same connection, with its own request queue for
/// the thread that reads it.
pub fn clone_fd(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let new = open_dev_fuse()?;
    let old: u32 = fd.as_raw_fd() as u32;
    // SAFETY: `new` is an open /dev/fuse fd, `old` a valid u32 the ioctl reads.
    let r = unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE, &old) };
    if r != 0 {
        return Err(io_err(
            "FUSE_DEV_IOC_CLONE".into(),
            io::Error::last_os_error(),
        ));
    }
    Ok(new)
}

/// An eventfd (non-blocking, close-on-exec).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; a valid fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io_err("eventfd".into(), io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel's FUSE ring has one queue per possible CPU
/// (/sys/devices/system/cpu/possible, e.g. "0-3" or "0,2-5").
pub fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .map_err(|e| io_err("/sys/devices/system/cpu/possible".into(), e))?;
    parse_cpu_list(s.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/sys/devices/system/cpu/possible: cannot parse {s:?}"),
        )
    })
}

fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        if b < a {
            return None;
        }
        n += b - a + 1;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists() {
        assert_eq!(super::parse_cpu_list("0-1"), Some(2));
        assert_eq!(super::parse_cpu_list("0"), Some(1));
        assert_eq!(super::parse_cpu_list("0,2-5"), Some(5));
        assert_eq!(super::parse_cpu_list("3-1"), None);
        assert_eq!(super::parse_cpu_list(""), None);
        assert_eq!(super::parse_cpu_list("x"), None);
    }
}
