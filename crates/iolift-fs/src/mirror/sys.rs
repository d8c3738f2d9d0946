//! The system calls the mirror backend makes, as small safe functions on
//! fds: every path it passes to the kernel is one checked name relative
//! to a directory fd, or the number of one of its own fds under
//! `/proc/self/fd`.

use crate::model::{Errno, FsResult};
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `-1` of a system call as the thread's errno.
pub fn cvt(r: libc::c_int) -> FsResult<libc::c_int> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: isize) -> FsResult<usize> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as usize)
    }
}

/// A name as a C string (names with NUL were refused by `check_name`).
pub fn cstr(name: &OsStr) -> FsResult<CString> {
    CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

fn own(fd: libc::c_int) -> FsResult<OwnedFd> {
    // SAFETY: fd was just returned by a successful open and is ours.
    cvt(fd).map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
}

const EMPTY: &CStr = c"";

/// Opens one name beneath `dir` without following symlinks or magic
/// links anywhere: a symlink comes back as an O_PATH fd of the link
/// itself (with `flags` containing O_PATH | O_NOFOLLOW), and `..` or an
/// absolute path cannot leave `dir`.
pub fn open_beneath(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> FsResult<OwnedFd> {
    // SAFETY: open_how is plain data; all-zero is its "nothing asked" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        how.mode = (mode & 0o7777) as u64;
    }
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: valid dirfd, NUL-terminated name, `how` outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    own(r as libc::c_int)
}

/// Opens `path` (the mirrored directory itself) as an O_PATH directory fd.
pub fn open_root(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reopens the file an fd of ours refers to (an O_PATH fd, or the node of
/// an unlinked file) with real access `flags`, through `/proc/self/fd`.
/// Only for regular files and directories: the caller never passes a
/// symlink's fd, so no link is followed.
pub fn reopen(proc_fd: BorrowedFd<'_>, fd: RawFd, flags: i32) -> FsResult<OwnedFd> {
    let name = CString::new(fd.to_string()).map_err(|_| Errno::EINVAL)?;
    let flags = (flags | libc::O_CLOEXEC) & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL);
    // SAFETY: valid dirfd and NUL-terminated name.
    own(unsafe { libc::openat(proc_fd.as_raw_fd(), name.as_ptr(), flags) })
}

/// The `/proc/self/fd/N` path of an fd of ours.
pub fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number")
}

/// `stat` of what `fd` refers to (an O_PATH fd included), not following it.
pub fn fstat(fd: BorrowedFd<'_>) -> FsResult<libc::stat> {
    // SAFETY: st is written by the kernel before being read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// `stat` of the entry `name` of directory `dir` (one checked component),
/// not following it if it is a symlink.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> FsResult<libc::stat> {
    // SAFETY: st is written by the kernel before being read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

pub fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

/// A `timespec` for utimensat: the time, UTIME_NOW or UTIME_OMIT.
pub fn timespec(t: Option<crate::model::TimeSet>) -> libc::timespec {
    use crate::model::TimeSet;
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeSet::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => {
            let (s, n) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
                Err(e) => {
                    let d = e.duration();
                    let mut s = -(d.as_secs() as i64);
                    let mut n = -(d.subsec_nanos() as i64);
                    if n < 0 {
                        s -= 1;
                        n += 1_000_000_000;
                    }
                    (s, n)
                }
            };
            libc::timespec {
                tv_sec: s,
                tv_nsec: n,
            }
        }
    }
}

/// Sets the times of what `fd` refers to (symlinks included, not followed).
pub fn utimens(fd: BorrowedFd<'_>, ts: &[libc::timespec; 2]) -> FsResult<()> {
    // SAFETY: ts points to two timespecs.
    cvt(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            ts.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// chown of what `fd` refers to, not following it; `u32::MAX` keeps a value.
pub fn chown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> FsResult<()> {
    // SAFETY: plain system call.
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// pread into uninitialised memory; returns how many bytes it filled.
pub fn pread_into(
    fd: BorrowedFd<'_>,
    buf: &mut [std::mem::MaybeUninit<u8>],
    off: u64,
) -> FsResult<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes; the kernel only
    // writes to it.
    cvt_size(unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            off as i64,
        )
    })
}

/// Writes all of `data` at `off` (retrying short writes).
pub fn pwrite_all(fd: BorrowedFd<'_>, mut data: &[u8], mut off: u64) -> FsResult<usize> {
    let total = data.len();
    while !data.is_empty() {
        // SAFETY: data is valid for data.len() bytes.
        let n = cvt_size(unsafe {
            libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), off as i64)
        })?;
        if n == 0 {
            return Err(Errno::EIO);
        }
        data = &data[n..];
        off += n as u64;
    }
    Ok(total)
}

/// One directory entry as getdents64 gives it: d_ino, d_off, d_type, name.
pub type RawDirent = (u64, u64, u8, Vec<u8>);

/// One `getdents64` batch of `dir` from cookie `offset`: (d_ino, d_off,
/// d_type, name) per entry; empty at the end.
pub fn getdents(dir: BorrowedFd<'_>, offset: u64, buf: &mut [u8]) -> FsResult<Vec<RawDirent>> {
    // SAFETY: plain system calls on a directory fd we own; buf is valid.
    unsafe {
        if libc::lseek(dir.as_raw_fd(), offset as i64, libc::SEEK_SET) < 0 {
            return Err(Errno::last());
        }
        let n = libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        );
        let n = cvt_size(n as isize)?;
        let mut out = Vec::new();
        let mut p = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        while p + 19 <= n {
            let ino = u64::from_ne_bytes(buf[p..p + 8].try_into().unwrap());
            let off = u64::from_ne_bytes(buf[p + 8..p + 16].try_into().unwrap());
            let reclen = u16::from_ne_bytes(buf[p + 16..p + 18].try_into().unwrap()) as usize;
            let ty = buf[p + 18];
            if reclen < 19 || p + reclen > n {
                return Err(Errno::EIO);
            }
            let name = &buf[p + 19..p + reclen];
            let len = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            out.push((ino, off, ty, name[..len].to_vec()));
            p += reclen;
        }
        Ok(out)
    }
}

/// The mode bits of a `d_type` (0 when unknown).
pub fn dtype_mode(t: u8) -> u32 {
    match t {
        libc::DT_REG => libc::S_IFREG,
        libc::DT_DIR => libc::S_IFDIR,
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_CHR => libc::S_IFCHR,
        libc::DT_BLK => libc::S_IFBLK,
        libc::DT_FIFO => libc::S_IFIFO,
        libc::DT_SOCK => libc::S_IFSOCK,
        _ => 0,
    }
}

/// Raises the soft open-files limit to at least `want` (up to the hard
/// limit); returns the limit now in force.
pub fn raise_nofile(want: u64) -> u64 {
    // SAFETY: rl is written by getrlimit before it is read.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 1024;
        }
        if rl.rlim_cur < want {
            let new = libc::rlimit {
                rlim_cur: want.min(rl.rlim_max),
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &new) == 0 {
                return new.rlim_cur;
            }
        }
        rl.rlim_cur
    }
}
