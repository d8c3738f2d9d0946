//! The `kv` backend: a flat namespace of files kept as key-value pairs in
//! Ceph RADOS (`kv:rados:POOL`, see [`spec`] and docs/fs.md).
//!
//! Layout in the pool (all names start with the prefix, `kvfs` by
//! default): the index object `kvfs.index`, whose omap maps each file
//! name to its encoded [`Meta`] (file id, size, mode, owner, times), and
//! each file's bytes striped over data objects `kvfs.ID.NNNNNNNN` of
//! `object_size` bytes. The root directory is the only directory; its
//! entries are the omap's keys, listed in key order. A file's node id is
//! its file id, so it stays the same across renames and remounts. Rename
//! rewrites index keys only (one atomic omap operation); data objects
//! never move.
//!
//! Requests are served on the front-end's worker threads with librados's
//! synchronous calls. Index changes (create, unlink, rename, metadata
//! writes) are serialised by one lock, so the index never sees two
//! writers from this process; one mount per pool and prefix at a time.
//! A write updates the in-memory size at once and the index on flush,
//! fsync and release; metadata changes by setattr are written at once.

mod data;
pub mod meta;
mod names;
mod nodes;
mod rados;
pub mod spec;

use crate::fs::FileSystem;
use crate::model::*;
use bytes::Bytes;
use meta::{io_err, Layout, Meta};
use nodes::{DirPos, Table, MAX_DIRS};
use rados::Pool;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// The first file id; smaller node ids are the root's and reserved.
pub const FIRST_ID: u64 = 16;
/// File ids reserved in the index per write of its `next_id` xattr.
const ID_BATCH: u64 = 1024;
const NEXT_ID: &str = "iolift.next_id";

/// A flat file system in a RADOS pool.
pub struct KvFs {
    pool: Pool,
    layout: Layout,
    blksize: u32,
    ttl: Duration,
    max_nodes: usize,
    start: SystemTime,
    t: Mutex<Table>,
    /// Held across every change of the index object.
    ns: Mutex<()>,
}

/// The index value of a file, as text for errors.
fn bad_meta(name: &[u8], why: &str) -> Errno {
    tracing::warn!("kv: index entry {:?}: {why}", String::from_utf8_lossy(name));
    Errno::EIO
}

impl KvFs {
    /// Opens `kv:ARG` (ARG as [`spec::parse`] takes it); `ttl` is how long
    /// the kernel may cache attributes and names.
    pub fn open(arg: &str, ttl: Duration) -> Result<KvFs, String> {
        let s = spec::parse(arg)?;
        let pool = Pool::connect(&s.target).map_err(|e| format!("kv:{arg}: {e}"))?;
        let layout = Layout {
            prefix: s.prefix,
            object_size: s.object_size,
        };
        let next = match pool.getxattr(&layout.index(), NEXT_ID) {
            Ok(v) => std::str::from_utf8(&v)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .filter(|&n| n >= FIRST_ID)
                .ok_or_else(|| {
                    format!(
                        "kv:{arg}: xattr {NEXT_ID} of {} is not a file id: {:?}",
                        layout.index(),
                        String::from_utf8_lossy(&v)
                    )
                })?,
            Err(e) if e == Errno::ENOENT || e.0 == libc::ENODATA => FIRST_ID,
            Err(e) => return Err(format!("kv:{arg}: reading {}: {e:?}", layout.index())),
        };
        let t = Table {
            next_id: next,
            reserved: next,
            next_dir: 1,
            ..Table::default()
        };
        Ok(KvFs {
            pool,
            blksize: layout.object_size.min(1 << 20) as u32,
            layout,
            ttl,
            max_nodes: s.max_nodes,
            start: SystemTime::now(),
            t: Mutex::new(t),
            ns: Mutex::new(()),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.t.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ns(&self) -> std::sync::MutexGuard<'_, ()> {
        self.ns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn root_attr(&self) -> Attr {
        Attr {
            mode: libc::S_IFDIR | 0o777,
            nlink: 2,
            size: 4096,
            atime: self.start,
            mtime: self.start,
            ctime: self.start,
            ..Attr::placeholder(ROOT)
        }
    }

    fn entry(&self, m: &Meta) -> Entry {
        Entry {
            attr: m.attr(self.blksize),
            generation: 0,
            ttl: self.ttl,
        }
    }

    /// The current metadata of `name`: the table's if it holds the file,
    /// else the index's; `None` if there is no such file.
    fn fetch(&self, name: &OsStr) -> FsResult<Option<Meta>> {
        if let Some(n) = self.table().by_name(name) {
            return Ok(Some(n.meta));
        }
        let oid = self.layout.index();
        match self.pool.omap_get(&oid, name.as_bytes()) {
            Ok(Some(v)) => Meta::decode(&v)
                .map(Some)
                .map_err(|e| bad_meta(name.as_bytes(), &e)),
            Ok(None) => Ok(None),
            Err(e) => Err(io_err("lookup in", &oid, e)),
        }
    }

    /// Writes `id`'s metadata to the index if it changed. Call with the
    /// namespace lock held.
    fn persist_locked(&self, id: u64) -> FsResult<()> {
        let (name, m) = {
            let mut t = self.table();
            let Some(n) = t.nodes.get_mut(&id) else {
                return Ok(());
            };
            match (&n.name, n.dirty) {
                (Some(name), true) => {
                    n.dirty = false;
                    (name.clone(), n.meta)
                }
                _ => return Ok(()),
            }
        };
        let oid = self.layout.index();
        let v = m.encode();
        self.pool
            .omap_update(&oid, &[(name.as_bytes(), &v)], &[])
            .map_err(|e| {
                if let Some(n) = self.table().nodes.get_mut(&id) {
                    n.dirty = true;
                }
                io_err("update", &oid, e)
            })
    }

    fn persist(&self, id: u64) -> FsResult<()> {
        let _ns = self.ns();
        self.persist_locked(id)
    }
}

/// The flat namespace has one directory, the root.
fn dir_only(parent: u64) -> FsResult<()> {
    if parent == ROOT {
        Ok(())
    } else {
        Err(Errno::ENOTDIR)
    }
}

impl FileSystem for KvFs {
    fn name(&self) -> String {
        "kv".into()
    }

    fn lookup(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<Entry>) {
        let r = (|| {
            dir_only(parent)?;
            check_name(name)?;
            let m = self.fetch(name)?.ok_or(Errno::ENOENT)?;
            let m = self.table().add_ref(name, m, 1, self.max_nodes)?;
            Ok(self.entry(&m))
        })();
        done.send(r)
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        let mut t = self.table();
        if let Some(n) = t.nodes.get_mut(&ino) {
            n.lookups = n.lookups.saturating_sub(nlookup);
            t.maybe_drop(ino);
        }
    }

    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>, done: Done<Attr>) {
        if ino == ROOT {
            return done.ok(self.root_attr());
        }
        let r = self
            .table()
            .nodes
            .get(&ino)
            .map(|n| n.meta.attr(self.blksize));
        done.send(r.ok_or(Errno::ENOENT))
    }

    fn setattr(&self, _: &Ctx, ino: u64, set: SetAttr, done: Done<Attr>) {
        if ino == ROOT {
            // The root's attributes are fixed.
            return done.send(if set.size.is_some() {
                Err(Errno::EISDIR)
            } else {
                Ok(self.root_attr())
            });
        }
        let r = (|| {
            let _ns = self.ns();
            let old = self
                .table()
                .nodes
                .get(&ino)
                .map(|n| n.meta)
                .ok_or(Errno::ENOENT)?;
            if let Some(size) = set.size {
                data::truncate(&self.pool, &self.layout, old.id, old.size, size)?;
            }
            let now = SystemTime::now();
            let at = |t: TimeSet| match t {
                TimeSet::At(t) => t,
                TimeSet::Now => now,
            };
            let m = {
                let mut t = self.table();
                let n = t.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                let m = &mut n.meta;
                if let Some(size) = set.size {
                    m.size = size;
                    m.mtime = now;
                }
                if let Some(mode) = set.mode {
                    m.mode = libc::S_IFREG | (mode & 0o7777);
                }
                m.uid = set.uid.unwrap_or(m.uid);
                m.gid = set.gid.unwrap_or(m.gid);
                m.atime = set.atime.map_or(m.atime, at);
                m.mtime = set.mtime.map_or(m.mtime, at);
                m.ctime = now;
                n.dirty = true;
                n.meta
            };
            self.persist_locked(ino)?;
            Ok(m.attr(self.blksize))
        })();
        done.send(r)
    }

    fn mknod(&self, c: &Ctx, parent: u64, name: &OsStr, mode: u32, _: u32, done: Done<Entry>) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Only regular files: the store has no devices, fifos or sockets.
            return done.err(Errno::EPERM);
        }
        done.send(self.make(c, parent, name, mode, 0).map(|m| self.entry(&m)))
    }

    fn mkdir(&self, _: &Ctx, _: u64, _: &OsStr, _: u32, done: Done<Entry>) {
        // The namespace is flat: the root is the only directory.
        done.err(Errno::EPERM)
    }

    fn symlink(&self, _: &Ctx, _: u64, _: &OsStr, _: &Path, done: Done<Entry>) {
        done.err(Errno::EPERM)
    }

    fn link(&self, _: &Ctx, _: u64, _: u64, _: &OsStr, done: Done<Entry>) {
        // One name per file: the index maps each name to its own file.
        done.err(Errno::EPERM)
    }

    fn unlink(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        let r = (|| {
            dir_only(parent)?;
            check_name(name)?;
            let _ns = self.ns();
            let m = self.fetch(name)?.ok_or(Errno::ENOENT)?;
            let oid = self.layout.index();
            self.pool
                .omap_update(&oid, &[], &[name.as_bytes()])
                .map_err(|e| io_err("unlink in", &oid, e))?;
            self.forget_name(name, &m);
            Ok(())
        })();
        done.send(r)
    }

    fn rmdir(&self, _: &Ctx, parent: u64, name: &OsStr, done: Done<()>) {
        let r = dir_only(parent)
            .and_then(|_| check_name(name))
            .and_then(|_| self.fetch(name))
            .and_then(|m| {
                Err(if m.is_some() {
                    Errno::ENOTDIR
                } else {
                    Errno::ENOENT
                })
            });
        done.send(r)
    }

    fn rename(
        &self,
        _: &Ctx,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        done: Done<()>,
    ) {
        done.send(self.rename_in_index(parent, name, newparent, newname, flags))
    }

    fn open(&self, _: &Ctx, ino: u64, flags: i32, done: Done<Opened>) {
        let r = (|| {
            let m = {
                let mut t = self.table();
                let n = t.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                n.opens += 1;
                n.meta
            };
            if flags & libc::O_TRUNC != 0 && m.size > 0 {
                let set = SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                };
                let (tx, rx) = std::sync::mpsc::channel();
                self.setattr(
                    &Ctx::default(),
                    ino,
                    set,
                    Done::new(move |r| {
                        let _ = tx.send(r);
                    }),
                );
                if let Err(e) = rx.recv().unwrap_or(Err(Errno::EIO)) {
                    self.release_node(ino);
                    return Err(e);
                }
            }
            Ok(Opened::handle(ino))
        })();
        done.send(r)
    }

    fn read(&self, _: &Ctx, ino: u64, _: u64, offset: u64, size: u32, done: Done<Bytes>) {
        let r = (|| {
            let m = self
                .table()
                .nodes
                .get(&ino)
                .map(|n| n.meta)
                .ok_or(Errno::EBADF)?;
            let len = (size as u64).min(m.size.saturating_sub(offset)) as usize;
            data::read(&self.pool, &self.layout, m.id, offset, len).map(Bytes::from)
        })();
        done.send(r)
    }

    fn write(
        &self,
        _: &Ctx,
        ino: u64,
        _: u64,
        offset: u64,
        buf: &[u8],
        kill_suidgid: bool,
        done: Done<u32>,
    ) {
        let r = (|| {
            let id = self
                .table()
                .nodes
                .get(&ino)
                .map(|n| n.meta.id)
                .ok_or(Errno::EBADF)?;
            let end = offset
                .checked_add(buf.len() as u64)
                .ok_or(Errno(libc::EFBIG))?;
            data::write(&self.pool, &self.layout, id, offset, buf)?;
            let mut t = self.table();
            let n = t.nodes.get_mut(&ino).ok_or(Errno::EBADF)?;
            let now = SystemTime::now();
            n.meta.size = n.meta.size.max(end);
            n.meta.mtime = now;
            n.meta.ctime = now;
            if kill_suidgid {
                n.meta.mode &= !(libc::S_ISUID | libc::S_ISGID);
            }
            n.dirty = true;
            Ok(buf.len() as u32)
        })();
        done.send(r)
    }

    fn handles_killpriv(&self) -> bool {
        true
    }

    fn flush(&self, _: &Ctx, ino: u64, _: u64, done: Done<()>) {
        done.send(self.persist(ino))
    }

    fn release(&self, _: &Ctx, ino: u64, _: u64, done: Done<()>) {
        let r = self.persist(ino);
        self.release_node(ino);
        done.send(r)
    }

    fn fsync(&self, _: &Ctx, ino: u64, _: u64, _: bool, done: Done<()>) {
        // Data writes are on the OSDs when librados answers; the size and
        // times are written to the index here.
        done.send(self.persist(ino))
    }

    fn opendir(&self, _: &Ctx, ino: u64, _: i32, done: Done<Opened>) {
        if ino != ROOT {
            return done.err(Errno::ENOTDIR);
        }
        let mut t = self.table();
        if t.dirs.len() >= MAX_DIRS {
            return done.err(Errno::ENFILE);
        }
        let fh = t.next_dir;
        t.next_dir += 1;
        t.dirs.insert(fh, DirPos::default());
        done.ok(Opened::handle(fh))
    }

    fn readdir(&self, _: &Ctx, _: u64, fh: u64, off: u64, max: usize, done: Done<Vec<DirEntry>>) {
        done.send(
            self.list(fh, off, max)
                .map(|v| v.into_iter().map(|(e, _)| e).collect()),
        )
    }

    fn readdirplus(
        &self,
        _: &Ctx,
        _: u64,
        fh: u64,
        off: u64,
        max: usize,
        done: Done<Vec<(DirEntry, Option<Entry>)>>,
    ) {
        let r = self.list(fh, off, max).map(|v| {
            let mut t = self.table();
            v.into_iter()
                .map(|(e, m)| {
                    // A full node table gives a name-only entry.
                    let ent = m.and_then(|m| t.add_ref(&e.name, m, 1, self.max_nodes).ok());
                    let ent = ent.map(|m| self.entry(&m));
                    (e, ent)
                })
                .collect()
        });
        done.send(r)
    }

    fn releasedir(&self, _: &Ctx, _: u64, fh: u64, done: Done<()>) {
        self.table().dirs.remove(&fh);
        done.ok(())
    }

    fn fsyncdir(&self, _: &Ctx, _: u64, _: u64, _: bool, done: Done<()>) {
        // Every index change is on the OSDs when librados answers.
        done.ok(())
    }

    fn statfs(&self, _: &Ctx, _: u64, done: Done<StatFs>) {
        let r = self
            .pool
            .cluster_stat()
            .map(|(total, avail, objects)| StatFs {
                blocks: total / 4096,
                bfree: avail / 4096,
                bavail: avail / 4096,
                files: objects + (1 << 32),
                ffree: 1 << 32,
                bsize: 4096,
                namelen: 255,
                frsize: 4096,
            });
        done.send(r.map_err(|e| io_err("statfs of", "the cluster", e)))
    }

    fn create(
        &self,
        c: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _: i32,
        done: Done<(Entry, Opened)>,
    ) {
        done.send(
            self.make(c, parent, name, mode, 1)
                .map(|m| (self.entry(&m), Opened::handle(m.id))),
        )
    }

    fn fallocate(&self, _: &Ctx, ino: u64, _: u64, off: u64, len: u64, mode: i32, done: Done<()>) {
        if mode != 0 {
            // Objects have no allocation to keep or punch.
            return done.err(Errno::ENOTSUP);
        }
        let r = (|| {
            let end = off.checked_add(len).ok_or(Errno(libc::EFBIG))?;
            {
                let mut t = self.table();
                let n = t.nodes.get_mut(&ino).ok_or(Errno::EBADF)?;
                if end > n.meta.size {
                    n.meta.size = end;
                    n.meta.ctime = SystemTime::now();
                    n.dirty = true;
                }
            }
            self.persist(ino)
        })();
        done.send(r)
    }
}
