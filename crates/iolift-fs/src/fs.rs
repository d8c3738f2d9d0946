//! The [`FileSystem`] trait: one method per FUSE operation, each with a
//! [`Done`] to complete, now or later. Every method has a default that
//! fails with ENOSYS, so a backend implements what it supports.

use crate::model::*;
use bytes::Bytes;
use std::ffi::OsStr;
use std::path::Path;

/// A file-system backend. Methods are called from the front-end's worker
/// threads, many at once; a backend that blocks for long should hand the
/// work (and the `Done`) to a thread of its own.
///
/// Nodes are named by the `u64` ids that `lookup` (and mknod, mkdir,
/// symlink, link, create) return; [`ROOT`] is the root. Each successful
/// entry reply counts one reference that `forget` gives back. Open files
/// and directories are named by the `fh` of [`Opened`].
#[allow(unused_variables)]
pub trait FileSystem: Send + Sync + 'static {
    /// A short name for logs and metrics ("null", "mirror").
    fn name(&self) -> String;

    fn lookup(&self, ctx: &Ctx, parent: u64, name: &OsStr, done: Done<Entry>) {
        done.err(Errno::ENOSYS)
    }
    /// Gives back `nlookup` references to `ino` (no reply).
    fn forget(&self, ino: u64, nlookup: u64) {}
    fn batch_forget(&self, nodes: &[(u64, u64)]) {
        for &(ino, n) in nodes {
            self.forget(ino, n)
        }
    }
    fn getattr(&self, ctx: &Ctx, ino: u64, fh: Option<u64>, done: Done<Attr>) {
        done.err(Errno::ENOSYS)
    }
    fn setattr(&self, ctx: &Ctx, ino: u64, set: SetAttr, done: Done<Attr>) {
        done.err(Errno::ENOSYS)
    }
    fn readlink(&self, ctx: &Ctx, ino: u64, done: Done<Vec<u8>>) {
        done.err(Errno::ENOSYS)
    }
    fn symlink(&self, ctx: &Ctx, parent: u64, name: &OsStr, target: &Path, done: Done<Entry>) {
        done.err(Errno::ENOSYS)
    }
    /// `mode` includes the type bits; `umask` is already applied.
    fn mknod(&self, ctx: &Ctx, parent: u64, name: &OsStr, mode: u32, rdev: u32, done: Done<Entry>) {
        done.err(Errno::ENOSYS)
    }
    fn mkdir(&self, ctx: &Ctx, parent: u64, name: &OsStr, mode: u32, done: Done<Entry>) {
        done.err(Errno::ENOSYS)
    }
    fn unlink(&self, ctx: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        done.err(Errno::ENOSYS)
    }
    fn rmdir(&self, ctx: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        done.err(Errno::ENOSYS)
    }
    /// `flags`: `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT`.
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        done: Done<()>,
    ) {
        done.err(Errno::ENOSYS)
    }
    fn link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &OsStr, done: Done<Entry>) {
        done.err(Errno::ENOSYS)
    }
    /// `flags` as open(2)'s, without O_CREAT/O_EXCL/O_NOCTTY.
    fn open(&self, ctx: &Ctx, ino: u64, flags: i32, done: Done<Opened>) {
        done.err(Errno::ENOSYS)
    }
    fn read(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, size: u32, done: Done<Bytes>) {
        done.err(Errno::ENOSYS)
    }
    /// Completes with the number of bytes written. `kill_suidgid`: the
    /// writer may not keep set-user/group-ID bits (the backend clears
    /// them; see [`handles_killpriv`](Self::handles_killpriv)).
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        done: Done<u32>,
    ) {
        done.err(Errno::ENOSYS)
    }
    /// Whether the backend clears set-user/group-ID bits itself on writes
    /// flagged `kill_suidgid` and on truncation by other users than root.
    /// Then the kernel need not ask for `security.capability` before every
    /// write (FUSE_HANDLE_KILLPRIV_V2), one request per write saved.
    fn handles_killpriv(&self) -> bool {
        false
    }
    /// Whether a directory's mtime (as getattr reports it) changes whenever
    /// an entry is added, removed or renamed, by this server or anyone
    /// else. Then the kernel front-end may let the kernel keep listings and
    /// check them against the mtime (at most the attribute timeout old)
    /// instead of asking for every listing again.
    fn cacheable_listings(&self) -> bool {
        false
    }
    /// Called on each close(2) of a descriptor of the open file.
    fn flush(&self, ctx: &Ctx, ino: u64, fh: u64, done: Done<()>) {
        done.ok(())
    }
    fn release(&self, ctx: &Ctx, ino: u64, fh: u64, done: Done<()>) {
        done.ok(())
    }
    fn fsync(&self, ctx: &Ctx, ino: u64, fh: u64, datasync: bool, done: Done<()>) {
        done.err(Errno::ENOSYS)
    }
    fn opendir(&self, ctx: &Ctx, ino: u64, flags: i32, done: Done<Opened>) {
        done.err(Errno::ENOSYS)
    }
    /// Entries after the cookie `offset` (0: from the start), at most
    /// `max` of them; an empty list is the end.
    fn readdir(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        max: usize,
        done: Done<Vec<DirEntry>>,
    ) {
        done.err(Errno::ENOSYS)
    }
    /// As readdir, with each entry looked up (one reference each, except
    /// `.` and `..`, whose entry is `None`).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn readdirplus(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        max: usize,
        done: Done<Vec<(DirEntry, Option<Entry>)>>,
    ) {
        done.err(Errno::ENOSYS)
    }
    fn releasedir(&self, ctx: &Ctx, ino: u64, fh: u64, done: Done<()>) {
        done.ok(())
    }
    fn fsyncdir(&self, ctx: &Ctx, ino: u64, fh: u64, datasync: bool, done: Done<()>) {
        done.err(Errno::ENOSYS)
    }
    fn statfs(&self, ctx: &Ctx, ino: u64, done: Done<StatFs>) {
        done.err(Errno::ENOSYS)
    }
    fn setxattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        done: Done<()>,
    ) {
        done.err(Errno::ENOTSUP)
    }
    fn getxattr(&self, ctx: &Ctx, ino: u64, name: &OsStr, size: u32, done: Done<Xattr>) {
        done.err(Errno::ENOTSUP)
    }
    fn listxattr(&self, ctx: &Ctx, ino: u64, size: u32, done: Done<Xattr>) {
        done.err(Errno::ENOTSUP)
    }
    fn removexattr(&self, ctx: &Ctx, ino: u64, name: &OsStr, done: Done<()>) {
        done.err(Errno::ENOTSUP)
    }
    /// Creates and opens a regular file; `flags` as open(2)'s.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        done: Done<(Entry, Opened)>,
    ) {
        done.err(Errno::ENOSYS)
    }
    /// `mode` as fallocate(2)'s (KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE, ...).
    #[allow(clippy::too_many_arguments)]
    fn fallocate(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        len: u64,
        mode: i32,
        done: Done<()>,
    ) {
        done.err(Errno::ENOSYS)
    }
    /// `whence`: SEEK_SET/CUR/END/DATA/HOLE; completes with the new offset.
    fn lseek(&self, ctx: &Ctx, ino: u64, fh: u64, offset: i64, whence: i32, done: Done<i64>) {
        done.err(Errno::ENOSYS)
    }
    /// Completes with the number of bytes copied.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        ctx: &Ctx,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
        done: Done<u32>,
    ) {
        done.err(Errno::ENOSYS)
    }
}
