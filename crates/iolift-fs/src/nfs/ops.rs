//! The [`FileSystem`] operations of the nfs backend, each mapped to one
//! or a few libnfs calls on the worker's connection.

use super::files::{Listed, Open};
use super::{ffi, lstat, NfsFs};
use crate::fs::FileSystem;
use crate::model::*;
use bytes::Bytes;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

impl NfsFs {
    fn listing(&self, fh: u64) -> FsResult<std::sync::Arc<Open>> {
        let h = self.handles.get(fh)?;
        match *h {
            Open::Dir { .. } => Ok(h),
            Open::File { .. } => Err(Errno::ENOTDIR),
        }
    }

    /// The entries after cookie `offset` of listing `fh`: `.` and `..`
    /// first (cookies 1 and 2), then the server's (3 on).
    fn page(
        &self,
        fh: u64,
        offset: u64,
        max: usize,
        mut each: impl FnMut(DirEntry, Option<&Listed>) -> FsResult<bool>,
    ) -> FsResult<()> {
        let h = self.listing(fh)?;
        let Open::Dir { ino, entries } = &*h else {
            return Err(Errno::ENOTDIR);
        };
        let mut n = 0;
        let mut cookie = offset;
        while n < max {
            let (de, l) = match cookie {
                0 | 1 => (
                    DirEntry {
                        ino: *ino,
                        offset: cookie + 1,
                        kind: libc::S_IFDIR,
                        name: if cookie == 0 { ".".into() } else { "..".into() },
                    },
                    None,
                ),
                c => {
                    let Some(l) = entries.get((c - 2) as usize) else {
                        break;
                    };
                    (
                        DirEntry {
                            ino: self.nodes.id_for(l.st.ino),
                            offset: c + 1,
                            kind: l.st.mode as u32 & libc::S_IFMT,
                            name: l.name.clone(),
                        },
                        Some(l),
                    )
                }
            };
            if !each(de, l)? {
                break;
            }
            n += 1;
            cookie += 1;
        }
        Ok(())
    }

    fn sync_file(&self, fh: u64) -> FsResult<()> {
        self.with_file(fh, |c, p| {
            // SAFETY: p is an open file of c.
            ffi::cvt(unsafe { (c.api.fsync)(c.cx, p) }).map(drop)
        })
    }
}

fn cstr(p: &OsStr) -> FsResult<CString> {
    CString::new(p.as_bytes()).map_err(|_| Errno::EINVAL)
}

impl FileSystem for NfsFs {
    fn name(&self) -> String {
        self.url.clone()
    }

    fn lookup(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<Entry>) {
        done.send(self.on_conn(|c| self.lookup_on(c, parent, name)))
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        self.nodes.forget(ino, nlookup)
    }

    fn getattr(&self, _: &Ctx, ino: u64, fh: Option<u64>, done: Done<Attr>) {
        if let Some(fh) = fh {
            if self
                .handles
                .get(fh)
                .is_ok_and(|h| matches!(*h, Open::File { .. }))
            {
                let mut st = ffi::Stat64::default();
                let r = self.with_file(fh, |c, p| {
                    // SAFETY: p is an open file of c.
                    ffi::cvt(unsafe { (c.api.fstat64)(c.cx, p, &mut st) }).map(drop)
                });
                return done.send(r.map(|_| self.attr_of(ino, &st)));
            }
        }
        done.send(
            self.on_conn(|c| self.stat_node(c, ino))
                .map(|st| self.attr_of(ino, &st)),
        )
    }

    fn setattr(&self, _: &Ctx, ino: u64, set: SetAttr, done: Done<Attr>) {
        done.send(self.setattr_now(ino, set))
    }

    fn readlink(&self, _: &Ctx, ino: u64, done: Done<Vec<u8>>) {
        let r = (|| {
            if self.nodes.kind(ino)? != libc::S_IFLNK {
                return Err(Errno::EINVAL);
            }
            let path = self.nodes.path(ino)?;
            let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
            self.on_conn(|c| {
                // SAFETY: valid context, path and buffer of its length.
                ffi::cvt(unsafe {
                    (c.api.readlink)(
                        c.cx,
                        path.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len() as i32,
                    )
                })
            })?;
            let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            buf.truncate(n);
            Ok(buf)
        })();
        done.send(r)
    }

    fn symlink(&self, ctx: &Ctx, parent: u64, name: &OsStr, target: &Path, done: Done<Entry>) {
        let t = match cstr(target.as_os_str()) {
            Ok(t) => t,
            Err(e) => return done.err(e),
        };
        // SAFETY (closure): valid context and strings.
        done.send(self.make(ctx, parent, name, |c, p| unsafe {
            (c.api.symlink)(c.cx, t.as_ptr(), p.as_ptr())
        }))
    }

    fn mknod(&self, ctx: &Ctx, parent: u64, name: &OsStr, mode: u32, rdev: u32, done: Done<Entry>) {
        // SAFETY (closure): valid context and path.
        done.send(self.make(ctx, parent, name, |c, p| unsafe {
            (c.api.mknod)(c.cx, p.as_ptr(), mode as i32, rdev as i32)
        }))
    }

    fn mkdir(&self, ctx: &Ctx, parent: u64, name: &OsStr, mode: u32, done: Done<Entry>) {
        // SAFETY (closure): valid context and path.
        done.send(self.make(ctx, parent, name, |c, p| unsafe {
            (c.api.mkdir2)(c.cx, p.as_ptr(), (mode & 0o7777) as i32)
        }))
    }

    fn unlink(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        done.send(self.remove(parent, name, false))
    }

    fn rmdir(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        done.send(self.remove(parent, name, true))
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
            // NFS has no atomic exchange or whiteout.
            if flags & !libc::RENAME_NOREPLACE != 0 {
                return Err(Errno::EINVAL);
            }
            let (a, b) = (
                self.nodes.child_path(parent, name)?,
                self.nodes.child_path(np, nn)?,
            );
            self.on_conn(|c| {
                if flags & libc::RENAME_NOREPLACE != 0 {
                    // Checked, then renamed: not atomic against other
                    // clients of the server (NFSv4 has no such rename).
                    match lstat(c, &b) {
                        Ok(_) => return Err(Errno(libc::EEXIST)),
                        Err(Errno::ENOENT) => {}
                        Err(e) => return Err(e),
                    }
                }
                // SAFETY: valid context and paths.
                ffi::cvt(unsafe { (c.api.rename)(c.cx, a.as_ptr(), b.as_ptr()) })
            })?;
            self.nodes.renamed(parent, name, np, nn);
            Ok(())
        })();
        done.send(r)
    }

    fn link(&self, ctx: &Ctx, ino: u64, np: u64, nn: &OsStr, done: Done<Entry>) {
        let old = match self.nodes.path(ino) {
            Ok(p) => p,
            Err(e) => return done.err(e),
        };
        // SAFETY (closure): valid context and paths.
        done.send(self.make(
            &Ctx {
                uid: 0,
                gid: 0,
                ..*ctx
            },
            np,
            nn,
            |c, p| unsafe { (c.api.link)(c.cx, old.as_ptr(), p.as_ptr()) },
        ))
    }

    fn open(&self, _: &Ctx, ino: u64, flags: i32, done: Done<Opened>) {
        done.send(self.open_file(ino, flags))
    }
    fn read(&self, _: &Ctx, _: u64, fh: u64, offset: u64, size: u32, done: Done<Bytes>) {
        done.send(self.read_now(fh, offset, size).map(Bytes::from))
    }
    fn write(&self, _: &Ctx, _: u64, fh: u64, off: u64, data: &[u8], _: bool, done: Done<u32>) {
        done.send(self.write_now(fh, off, data))
    }
    fn release(&self, _: &Ctx, _: u64, fh: u64, done: Done<()>) {
        let r = self.handles.remove(fh).map(drop);
        self.close_everywhere(fh);
        done.send(r)
    }
    fn fsync(&self, _: &Ctx, _: u64, fh: u64, _: bool, done: Done<()>) {
        done.send(self.sync_file(fh))
    }
    fn opendir(&self, _: &Ctx, ino: u64, _: i32, done: Done<Opened>) {
        let r = self
            .handles
            .room()
            .and_then(|_| self.list_dir(ino))
            .and_then(|entries| {
                self.handles
                    .add(Open::Dir { ino, entries })
                    .map(Opened::handle)
            });
        done.send(r)
    }
    fn readdir(&self, _: &Ctx, _: u64, fh: u64, off: u64, max: usize, done: Done<Vec<DirEntry>>) {
        let mut out = Vec::new();
        let r = self.page(fh, off, max, |de, _| {
            out.push(de);
            Ok(true)
        });
        done.send(r.map(|_| out))
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
        let mut out = Vec::new();
        let r = self.page(fh, off, max, |mut de, l| {
            let e = match l {
                None => None,
                Some(l) if l.st.mode as u32 & libc::S_IFMT != 0 => {
                    let e = self.enter(ino, &l.name, &l.st)?;
                    de.ino = e.attr.ino;
                    Some(e)
                }
                // No attributes in the listing: look the name up.
                Some(l) => match self.on_conn(|c| self.lookup_on(c, ino, &l.name)) {
                    Ok(e) => {
                        de.ino = e.attr.ino;
                        de.kind = e.attr.kind();
                        Some(e)
                    }
                    Err(Errno::ENOENT) => return Ok(true),
                    Err(e) => return Err(e),
                },
            };
            out.push((de, e));
            Ok(true)
        });
        match r {
            Ok(()) => done.ok(out),
            // Entries already counted must reach the kernel.
            Err(_) if !out.is_empty() => done.ok(out),
            Err(e) => done.err(e),
        }
    }
    fn releasedir(&self, _: &Ctx, _: u64, fh: u64, done: Done<()>) {
        done.send(self.handles.remove(fh).map(drop))
    }
    fn fsyncdir(&self, _: &Ctx, _: u64, fh: u64, _: bool, done: Done<()>) {
        // Directory changes are done by the server when NFS answers them.
        done.send(self.listing(fh).map(drop))
    }

    fn statfs(&self, _: &Ctx, _: u64, done: Done<StatFs>) {
        let r = self.on_conn(|c| {
            let mut sv = ffi::StatVfs64::default();
            // SAFETY: valid context, path and out struct.
            ffi::cvt(unsafe { (c.api.statvfs64)(c.cx, c"/".as_ptr(), &mut sv) })?;
            Ok(StatFs {
                blocks: sv.blocks,
                bfree: sv.bfree,
                bavail: sv.bavail,
                files: sv.files,
                ffree: sv.ffree,
                bsize: sv.bsize.min(u32::MAX as u64) as u32,
                namelen: if sv.namemax == 0 {
                    255
                } else {
                    sv.namemax.min(255) as u32
                },
                frsize: sv.frsize.min(u32::MAX as u64) as u32,
            })
        });
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

    fn fallocate(&self, _: &Ctx, _: u64, fh: u64, _: u64, _: u64, _: i32, done: Done<()>) {
        // libnfs 4.0 has no ALLOCATE/DEALLOCATE (NFSv4.2).
        done.send(self.handles.get(fh).and(Err(Errno::ENOTSUP)))
    }

    fn lseek(&self, _: &Ctx, _: u64, fh: u64, off: i64, whence: i32, done: Done<i64>) {
        let r = (|| {
            if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
                return Err(Errno::EINVAL);
            }
            let mut st = ffi::Stat64::default();
            self.with_file(fh, |c, p| {
                // SAFETY: p is an open file of c.
                ffi::cvt(unsafe { (c.api.fstat64)(c.cx, p, &mut st) }).map(drop)
            })?;
            // NFSv4.0 has no SEEK: the whole file is data, one hole at its end.
            let size = st.size as i64;
            if off < 0 || off >= size {
                return Err(Errno(libc::ENXIO));
            }
            Ok(if whence == libc::SEEK_DATA { off } else { size })
        })();
        done.send(r)
    }
}
