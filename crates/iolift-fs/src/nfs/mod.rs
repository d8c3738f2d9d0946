//! The `nfs://HOST/EXPORT` backend: a user-space NFS client through
//! libnfs (loaded at run time, [`ffi`]), NFSv3 by default, NFSv4 with
//! `version=4` (libnfs 4.0's NFSv4 client lacks too much to be the
//! default: see docs/fs.md).
//!
//! Every operation runs on the front-end worker thread that received it,
//! through libnfs's synchronous API on that worker's own NFS connection
//! (one `nfs_context` per worker, as DPFS does: workers are assigned
//! connections round-robin on first use, `connections` of them, each
//! behind a mutex, so with as many connections as workers no worker waits
//! for another). libnfs 4.0's calls are path-based: a node is identified
//! by its fileid and knows its names ([`nodes`]), and each call gets the
//! path built from them. Open files are libnfs opens, one per node and
//! connection ([`files`]).
//!
//! The spec is libnfs's URL (`nfs://HOST/EXPORT`, `?nfsport=N` and
//! `mountport=N` for a server whose ports are not found through rpcbind,
//! `version=3|4`), plus this backend's own parameters: `connections=N`
//! and `timeout_ms=N` (every NFS call fails with an error after that long
//! rather than waiting for a lost server).

mod ffi;
mod files;
mod nodes;
mod ops;

use crate::model::*;
use ffi::{Conn, FileT, Stat64};
use files::{Handles, Open};
use nodes::Nodes;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// The nfs backend's options (each a budget).
#[derive(Clone, Debug)]
pub struct NfsOptions {
    /// NFS connections (one per front-end worker thread is best).
    pub connections: usize,
    /// Nodes the kernel may hold at once.
    pub max_nodes: usize,
    /// Open files and directories at once (each file is opened on at most
    /// every connection once).
    pub max_handles: usize,
    /// Entries of one directory listing held at once (ENOMEM beyond).
    pub max_dir_entries: usize,
    /// How long one NFS call may take before it fails.
    pub timeout_ms: u32,
    /// NFS version: 3 (default) or 4 (see docs/fs.md for what libnfs
    /// 4.0's NFSv4 client lacks).
    pub version: u32,
    /// How long the kernel may cache attributes and names.
    pub ttl: Duration,
}

impl Default for NfsOptions {
    fn default() -> Self {
        NfsOptions {
            connections: 4,
            max_nodes: 1 << 18,
            max_handles: 4096,
            max_dir_entries: 1 << 20,
            timeout_ms: 10_000,
            version: 3,
            ttl: Duration::from_secs(1),
        }
    }
}

/// One connection and the files opened on it.
pub(crate) struct Slot {
    pub(super) conn: Conn,
    /// Our handle -> node, for the handles used on this connection.
    pub(super) files: HashMap<u64, u64>,
    /// NFS opens by node (NFSv4: shared by the node's handles) or by
    /// handle (NFSv3).
    pub(super) opens: HashMap<u64, files::Shared>,
    /// Whether a node's handles share one open (NFSv4).
    pub(super) share: bool,
}

// SAFETY: the file pointers belong to the connection and are used only
// while its mutex is held.
unsafe impl Send for Slot {}

/// The nfs backend over one export.
pub struct NfsFs {
    url: String,
    conns: Vec<Mutex<Slot>>,
    nodes: Nodes,
    handles: Handles,
    opts: NfsOptions,
}

static NEXT_WORKER: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Splits this backend's own parameters off a spec: (libnfs URL, options).
pub fn parse_spec(spec: &str, base: NfsOptions) -> Result<(String, NfsOptions), String> {
    let mut o = base;
    let (head, query) = match spec.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (spec, None),
    };
    let rest = head
        .strip_prefix("nfs://")
        .ok_or_else(|| format!("{spec}: an nfs spec starts with nfs://"))?;
    match rest.split_once('/') {
        Some((host, export)) if !host.is_empty() && !export.is_empty() => {}
        _ => {
            return Err(format!(
                "{spec}: needs a host and an export: nfs://HOST/EXPORT"
            ))
        }
    }
    let mut keep = Vec::new();
    for kv in query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let num = |what: &str| {
            v.parse::<u64>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("{spec}: {what}={v:?} must be a number of at least 1"))
        };
        match k {
            "connections" => o.connections = num("connections")?.min(64) as usize,
            "timeout_ms" => o.timeout_ms = num("timeout_ms")?.min(u32::MAX as u64) as u32,
            "version" if v == "3" || v == "4" => o.version = v.parse().unwrap_or(3),
            "version" => return Err(format!("{spec}: version={v:?}: NFS version 3 or 4")),
            _ => keep.push(kv),
        }
    }
    keep.push(if o.version == 4 {
        "version=4"
    } else {
        "version=3"
    });
    Ok((format!("{head}?{}", keep.join("&")), o))
}

impl NfsFs {
    /// Connects `opts.connections` times to the export of `spec` (every
    /// connection now, so a bad server or export fails here).
    pub fn open(spec: &str, opts: NfsOptions) -> Result<NfsFs, String> {
        let (url, opts) = parse_spec(spec, opts)?;
        let mut conns = Vec::new();
        for _ in 0..opts.connections.max(1) {
            let conn = Conn::connect(&url, opts.version, opts.timeout_ms)?;
            conns.push(Mutex::new(Slot {
                conn,
                files: HashMap::new(),
                opens: HashMap::new(),
                share: opts.version == 4,
            }));
        }
        let root = {
            let s = conns[0].lock().unwrap_or_else(|e| e.into_inner());
            lstat(&s.conn, c"/").map_err(|e| format!("{url}: the export's root: {e:?}"))?
        };
        if root.mode as u32 & libc::S_IFMT != libc::S_IFDIR {
            return Err(format!("{url}: the export's root is not a directory"));
        }
        Ok(NfsFs {
            url,
            nodes: Nodes::new(root.ino, opts.max_nodes),
            handles: Handles::new(opts.max_handles),
            conns,
            opts,
        })
    }

    /// Nodes and open handles held now.
    pub fn held(&self) -> (usize, usize) {
        (self.nodes.len(), self.handles.len())
    }

    /// This worker thread's connection.
    fn my_conn(&self) -> usize {
        let w = WORKER.with(|w| match w.get() {
            Some(n) => n,
            None => {
                let n = NEXT_WORKER.fetch_add(1, Ordering::Relaxed);
                w.set(Some(n));
                n
            }
        });
        w % self.conns.len()
    }

    fn slot(&self, i: usize) -> FsResult<MutexGuard<'_, Slot>> {
        Ok(self
            .conns
            .get(i)
            .ok_or(Errno::EIO)?
            .lock()
            .unwrap_or_else(|e| e.into_inner()))
    }

    /// Runs `f` on this worker's connection.
    fn on_conn<R>(&self, f: impl FnOnce(&Conn) -> FsResult<R>) -> FsResult<R> {
        let s = self.slot(self.my_conn())?;
        f(&s.conn)
    }

    fn attr_of(&self, id: u64, st: &Stat64) -> Attr {
        // The server's times, as far as a SystemTime holds them.
        let t = |s: u64, ns: u64| epoch_time(s, ns.min(999_999_999) as u32);
        Attr {
            ino: id,
            size: st.size,
            blocks: st.blocks,
            atime: t(st.atime, st.atime_nsec),
            mtime: t(st.mtime, st.mtime_nsec),
            ctime: t(st.ctime, st.ctime_nsec),
            mode: st.mode as u32,
            nlink: st.nlink.min(u32::MAX as u64) as u32,
            uid: st.uid as u32,
            gid: st.gid as u32,
            rdev: st.rdev as u32,
            blksize: if st.blksize == 0 {
                4096
            } else {
                st.blksize.min(1 << 20) as u32
            },
        }
    }

    /// The current attributes of node `id`, checked to be the same file.
    fn stat_node(&self, c: &Conn, id: u64) -> FsResult<Stat64> {
        let path = self.nodes.path(id)?;
        let st = lstat(c, &path)?;
        if st.ino != self.nodes.fileid(id)? {
            // The name now leads to another file (changed on the server).
            return Err(Errno(libc::ESTALE));
        }
        Ok(st)
    }

    /// Looks `name` up in `parent` on connection `c`: one counted lookup.
    fn lookup_on(&self, c: &Conn, parent: u64, name: &OsStr) -> FsResult<Entry> {
        check_name(name)?;
        if self.nodes.kind(parent)? != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        let path = self.nodes.child_path(parent, name)?;
        let st = lstat(c, &path)?;
        self.enter(parent, name, &st)
    }

    fn enter(&self, parent: u64, name: &OsStr, st: &Stat64) -> FsResult<Entry> {
        let id = self
            .nodes
            .insert(parent, name, st.ino, st.mode as u32 & libc::S_IFMT)?;
        Ok(Entry {
            attr: self.attr_of(id, st),
            generation: 0,
            ttl: self.opts.ttl,
        })
    }

    /// Makes `name` in `parent` with `mk(conn, path)`, then looks it up
    /// (and gives it to the caller when we are root acting for another).
    fn make(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mk: impl FnOnce(&Conn, &CString) -> std::ffi::c_int,
    ) -> FsResult<Entry> {
        check_name(name)?;
        if self.nodes.kind(parent)? != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        let path = self.nodes.child_path(parent, name)?;
        self.on_conn(|c| {
            ffi::cvt(mk(c, &path))?;
            self.chown_new(c, ctx, &path)?;
            let st = lstat(c, &path)?;
            self.enter(parent, name, &st)
        })
    }

    fn chown_new(&self, c: &Conn, ctx: &Ctx, path: &CString) -> FsResult<()> {
        if ctx.uid == 0 && ctx.gid == 0 {
            return Ok(());
        }
        // SAFETY: valid context and path.
        ffi::cvt(unsafe { (c.api.lchown)(c.cx, path.as_ptr(), ctx.uid as i32, ctx.gid as i32) })
            .map(drop)
    }

    fn setattr_now(&self, ino: u64, set: SetAttr) -> FsResult<Attr> {
        let kind = self.nodes.kind(ino)?;
        if let (Some(size), Some(fh)) = (set.size, set.fh) {
            self.with_file(fh, |c, p| {
                // SAFETY: p is an open file of c.
                ffi::cvt(unsafe { (c.api.ftruncate)(c.cx, p, size) }).map(drop)
            })?;
        }
        self.on_conn(|c| {
            let path = self.nodes.path(ino)?;
            let cur = self.stat_node(c, ino)?;
            if let Some(mode) = set.mode {
                if kind == libc::S_IFLNK {
                    return Err(Errno::ENOTSUP);
                }
                // SAFETY: valid context and path.
                ffi::cvt(unsafe { (c.api.chmod)(c.cx, path.as_ptr(), (mode & 0o7777) as i32) })?;
            }
            if set.uid.is_some() || set.gid.is_some() {
                let uid = set.uid.unwrap_or(cur.uid as u32) as i32;
                let gid = set.gid.unwrap_or(cur.gid as u32) as i32;
                // SAFETY: as above.
                ffi::cvt(unsafe { (c.api.lchown)(c.cx, path.as_ptr(), uid, gid) })?;
            }
            if let (Some(size), None) = (set.size, set.fh) {
                if kind != libc::S_IFREG {
                    return Err(if kind == libc::S_IFDIR {
                        Errno::EISDIR
                    } else {
                        Errno::EINVAL
                    });
                }
                // SAFETY: as above.
                ffi::cvt(unsafe { (c.api.truncate)(c.cx, path.as_ptr(), size) })?;
            }
            if set.atime.is_some() || set.mtime.is_some() {
                let tv = |t: Option<TimeSet>, s: u64, ns: u64| {
                    let d = match t {
                        Some(TimeSet::At(t)) => {
                            t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
                        }
                        Some(TimeSet::Now) => SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .unwrap_or_default(),
                        None => Duration::new(s, ns.min(999_999_999) as u32),
                    };
                    libc::timeval {
                        tv_sec: d.as_secs() as libc::time_t,
                        tv_usec: d.subsec_micros() as libc::suseconds_t,
                    }
                };
                let mut times = [
                    tv(set.atime, cur.atime, cur.atime_nsec),
                    tv(set.mtime, cur.mtime, cur.mtime_nsec),
                ];
                // SAFETY: valid context, path and two timevals.
                ffi::cvt(unsafe { (c.api.lutimes)(c.cx, path.as_ptr(), times.as_mut_ptr()) })?;
            }
            let st = self.stat_node(c, ino)?;
            Ok(self.attr_of(ino, &st))
        })
    }

    fn open_file(&self, ino: u64, flags: i32) -> FsResult<Opened> {
        match self.nodes.kind(ino)? {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        let flags = flags
            & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_APPEND | libc::O_DIRECT);
        let path = self.nodes.path(ino)?;
        let me = self.my_conn();
        let mut s = self.slot(me)?;
        let fh = self.handles.add(Open::File {
            ino,
            flags: files::reopen_flags(flags),
            home: me,
        })?;
        match s.acquire(fh, ino, &path, flags) {
            Ok(_) => Ok(Opened::handle(fh)),
            Err(e) => {
                let _ = self.handles.remove(fh);
                Err(e)
            }
        }
    }

    fn create_file(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Entry, Opened)> {
        check_name(name)?;
        if self.nodes.kind(parent)? != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        self.handles.room()?;
        let path = self.nodes.child_path(parent, name)?;
        let flags = flags & !(libc::O_NOCTTY | libc::O_APPEND | libc::O_DIRECT);
        let me = self.my_conn();
        let mut s = self.slot(me)?;
        // An existing file (no O_EXCL) is opened, not created: a second
        // NFSv4 OPEN of a file this connection has open would share (and
        // then close) the first one's open state.
        if flags & libc::O_EXCL == 0 {
            if let Ok(st) = lstat(&s.conn, &path) {
                if st.mode as u32 & libc::S_IFMT != libc::S_IFREG {
                    return Err(Errno::EISDIR);
                }
                let e = self.enter(parent, name, &st)?;
                let ino = e.attr.ino;
                let opened = self
                    .handles
                    .add(Open::File {
                        ino,
                        flags: files::reopen_flags(flags),
                        home: me,
                    })
                    .and_then(
                        |fh| match s.acquire(fh, ino, &path, flags & !libc::O_CREAT) {
                            Ok(_) => Ok(fh),
                            Err(e) => {
                                let _ = self.handles.remove(fh);
                                Err(e)
                            }
                        },
                    );
                return match opened {
                    Ok(fh) => Ok((e, Opened::handle(fh))),
                    Err(err) => {
                        self.nodes.forget(ino, 1);
                        Err(err)
                    }
                };
            }
        }
        let mut p: *mut FileT = std::ptr::null_mut();
        let want = mode & 0o7777;
        // SAFETY: valid context, path and out pointer.
        ffi::cvt(unsafe {
            (s.conn.api.create)(
                s.conn.cx,
                path.as_ptr(),
                (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT,
                want as i32,
                &mut p,
            )
        })?;
        let mut st = Stat64::default();
        let r = self
            .chown_new(&s.conn, ctx, &path)
            // SAFETY: p is an open file of this context.
            .and_then(|_| ffi::cvt(unsafe { (s.conn.api.fstat64)(s.conn.cx, p, &mut st) }))
            .and_then(|_| {
                // libnfs 4.0's NFSv4 create leaves the server's default
                // mode (0600 from ganesha): set the one asked for, through
                // the open file.
                if st.mode as u32 & 0o7777 != want {
                    // SAFETY: p is an open file of this context.
                    ffi::cvt(unsafe { (s.conn.api.fchmod)(s.conn.cx, p, want as i32) })?;
                    st.mode = (st.mode & !0o7777) | want as u64;
                }
                self.enter(parent, name, &st)
            });
        let entry = match r {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: p is an open file of this context, not used after.
                unsafe { (s.conn.api.close)(s.conn.cx, p) };
                return Err(e);
            }
        };
        let ino = entry.attr.ino;
        let flags = files::reopen_flags(flags);
        match self.handles.add(Open::File {
            ino,
            flags,
            home: me,
        }) {
            Ok(fh) => {
                s.adopt(fh, ino, p);
                Ok((entry, Opened::handle(fh)))
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { (s.conn.api.close)(s.conn.cx, p) };
                self.nodes.forget(ino, 1);
                Err(e)
            }
        }
    }

    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> FsResult<()> {
        check_name(name)?;
        let path = self.nodes.child_path(parent, name)?;
        self.on_conn(|c| {
            // SAFETY: valid context and path.
            ffi::cvt(unsafe {
                if dir {
                    (c.api.rmdir)(c.cx, path.as_ptr())
                } else {
                    (c.api.unlink)(c.cx, path.as_ptr())
                }
            })
        })?;
        self.nodes.removed(parent, name);
        Ok(())
    }
}

/// `nfs_lstat64` of `path` on `c`.
fn lstat(c: &Conn, path: &std::ffi::CStr) -> FsResult<Stat64> {
    let mut st = Stat64::default();
    // SAFETY: valid context, path and out struct.
    ffi::cvt(unsafe { (c.api.lstat64)(c.cx, path.as_ptr(), &mut st) })?;
    Ok(st)
}
