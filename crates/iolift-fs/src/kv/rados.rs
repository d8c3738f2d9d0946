//! The few librados calls the kv backend makes, loaded at run time with
//! `libloading` (the iolift crate's own loader in `iolift::ceph` cannot be
//! used from here: iolift depends on this crate, not the other way round;
//! docs/fs.md says why this small table exists beside it).
//!
//! Contract: [`Pool::connect`] loads librados.so.2 (or `$IOLIFT_LIBRADOS`)
//! once per process, reads the Ceph config as Ceph's tools do (`conf`,
//! else `$CEPH_CONF`, else Ceph's search path, then `$CEPH_ARGS`), bounds
//! connecting and monitor operations by a timeout, keeps librados quiet on
//! stderr and opens one pool; every failure is one line saying what is
//! wrong. The object calls return librados's negative errno as an
//! [`Errno`]. A [`Pool`] may be used from any thread.

use crate::model::Errno;
use libloading::Library;
use std::ffi::{c_char, c_int, c_uchar, c_void, CStr, CString};
use std::ptr;
use std::sync::OnceLock;

type Handle = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct ClusterStat {
    kb: u64,
    kb_used: u64,
    kb_avail: u64,
    num_objects: u64,
}

/// librados's entry points, with the prototypes of librados.h.
struct Api {
    create2: unsafe extern "C" fn(*mut Handle, *const c_char, *const c_char, u64) -> c_int,
    conf_read_file: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    conf_parse_env: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    conf_set: unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int,
    conf_get: unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize) -> c_int,
    connect: unsafe extern "C" fn(Handle) -> c_int,
    shutdown: unsafe extern "C" fn(Handle),
    cluster_stat: unsafe extern "C" fn(Handle, *mut ClusterStat) -> c_int,
    ioctx_create: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int,
    ioctx_destroy: unsafe extern "C" fn(Handle),
    read: unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize, u64) -> c_int,
    write: unsafe extern "C" fn(Handle, *const c_char, *const c_char, usize, u64) -> c_int,
    trunc: unsafe extern "C" fn(Handle, *const c_char, u64) -> c_int,
    remove: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    getxattr:
        unsafe extern "C" fn(Handle, *const c_char, *const c_char, *mut c_char, usize) -> c_int,
    setxattr:
        unsafe extern "C" fn(Handle, *const c_char, *const c_char, *const c_char, usize) -> c_int,
    create_write_op: unsafe extern "C" fn() -> Handle,
    release_write_op: unsafe extern "C" fn(Handle),
    write_op_omap_set: unsafe extern "C" fn(
        Handle,
        *const *const c_char,
        *const *const c_char,
        *const usize,
        usize,
    ),
    write_op_omap_rm_keys: unsafe extern "C" fn(Handle, *const *const c_char, usize),
    write_op_operate: unsafe extern "C" fn(Handle, Handle, *const c_char, *mut i64, c_int) -> c_int,
    create_read_op: unsafe extern "C" fn() -> Handle,
    release_read_op: unsafe extern "C" fn(Handle),
    read_op_omap_get_vals2: unsafe extern "C" fn(
        Handle,
        *const c_char,
        *const c_char,
        u64,
        *mut Handle,
        *mut c_uchar,
        *mut c_int,
    ),
    read_op_omap_get_vals_by_keys:
        unsafe extern "C" fn(Handle, *const *const c_char, usize, *mut Handle, *mut c_int),
    read_op_operate: unsafe extern "C" fn(Handle, Handle, *const c_char, c_int) -> c_int,
    omap_get_next:
        unsafe extern "C" fn(Handle, *mut *mut c_char, *mut *mut c_char, *mut usize) -> c_int,
    omap_get_end: unsafe extern "C" fn(Handle),
    /// Keeps the library mapped for the life of the process.
    _lib: Library,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(|e| e.clone())
}

fn load() -> Result<Api, String> {
    let name = std::env::var("IOLIFT_LIBRADOS").unwrap_or_else(|_| "librados.so.2".into());
    // SAFETY: loading librados runs its initialisers, which have no
    // preconditions.
    let lib = unsafe { Library::new(&name) }.map_err(|e| {
        format!(
            "cannot load {name} (install Ceph's client library: apt-get install librados2): {e}"
        )
    })?;
    macro_rules! sym {
        ($s:literal) => {
            // SAFETY: the field's type is the symbol's prototype in librados.h.
            *unsafe { lib.get($s.as_bytes()) }.map_err(|e| format!("{name} lacks {}: {e}", $s))?
        };
    }
    Ok(Api {
        create2: sym!("rados_create2"),
        conf_read_file: sym!("rados_conf_read_file"),
        conf_parse_env: sym!("rados_conf_parse_env"),
        conf_set: sym!("rados_conf_set"),
        conf_get: sym!("rados_conf_get"),
        connect: sym!("rados_connect"),
        shutdown: sym!("rados_shutdown"),
        cluster_stat: sym!("rados_cluster_stat"),
        ioctx_create: sym!("rados_ioctx_create"),
        ioctx_destroy: sym!("rados_ioctx_destroy"),
        read: sym!("rados_read"),
        write: sym!("rados_write"),
        trunc: sym!("rados_trunc"),
        remove: sym!("rados_remove"),
        getxattr: sym!("rados_getxattr"),
        setxattr: sym!("rados_setxattr"),
        create_write_op: sym!("rados_create_write_op"),
        release_write_op: sym!("rados_release_write_op"),
        write_op_omap_set: sym!("rados_write_op_omap_set"),
        write_op_omap_rm_keys: sym!("rados_write_op_omap_rm_keys"),
        write_op_operate: sym!("rados_write_op_operate"),
        create_read_op: sym!("rados_create_read_op"),
        release_read_op: sym!("rados_release_read_op"),
        read_op_omap_get_vals2: sym!("rados_read_op_omap_get_vals2"),
        read_op_omap_get_vals_by_keys: sym!("rados_read_op_omap_get_vals_by_keys"),
        read_op_operate: sym!("rados_read_op_operate"),
        omap_get_next: sym!("rados_omap_get_next"),
        omap_get_end: sym!("rados_omap_get_end"),
        _lib: lib,
    })
}

/// A negative librados return as text.
fn errtext(r: c_int) -> String {
    std::io::Error::from_raw_os_error(-r).to_string()
}

fn cstr(what: &str, s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} {s:?} contains a NUL byte"))
}

/// A name for librados: object names and omap keys never hold NUL
/// (file names cannot), so this only fails on a caller's bug.
fn c(b: &[u8]) -> Result<CString, Errno> {
    CString::new(b).map_err(|_| Errno::EINVAL)
}

fn check(r: c_int) -> Result<c_int, Errno> {
    if r < 0 {
        Err(Errno(-r))
    } else {
        Ok(r)
    }
}

/// How to reach the cluster and which pool to open.
#[derive(Clone, Debug, Default)]
pub struct Target {
    pub pool: String,
    pub conf: Option<String>,
    /// Client name without `client.` (default `admin`).
    pub id: Option<String>,
    pub timeout_s: u32,
}

/// A connected cluster handle and an I/O context on one pool.
pub struct Pool {
    api: &'static Api,
    cluster: Handle,
    io: Handle,
}

// SAFETY: librados cluster handles and I/O contexts are thread-safe for
// the synchronous calls made here.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: each handle was created once and is released once,
        // the I/O context before its cluster.
        unsafe {
            if !self.io.is_null() {
                (self.api.ioctx_destroy)(self.io);
            }
            if !self.cluster.is_null() {
                (self.api.shutdown)(self.cluster);
            }
        }
    }
}

impl Pool {
    /// Loads librados if needed, connects and opens `t.pool`.
    pub fn connect(t: &Target) -> Result<Pool, String> {
        let api = api()?;
        let mut p = Pool {
            api,
            cluster: ptr::null_mut(),
            io: ptr::null_mut(),
        };
        let client = cstr(
            "id",
            &format!("client.{}", t.id.as_deref().unwrap_or("admin")),
        )?;
        let cname = cstr("cluster", "ceph")?;
        // SAFETY: out-pointer we own; NUL-terminated names.
        let r = unsafe { (api.create2)(&mut p.cluster, cname.as_ptr(), client.as_ptr(), 0) };
        if r < 0 {
            p.cluster = ptr::null_mut();
            return Err(format!("rados_create2 failed: {}", errtext(r)));
        }
        let conf = t
            .conf
            .clone()
            .or_else(|| std::env::var("CEPH_CONF").ok().filter(|c| !c.is_empty()));
        let path = conf.as_deref().map(|c| cstr("conf", c)).transpose()?;
        // SAFETY: valid handle; NULL asks for Ceph's search path.
        let r = unsafe {
            (api.conf_read_file)(p.cluster, path.as_ref().map_or(ptr::null(), |c| c.as_ptr()))
        };
        if r < 0 {
            return Err(match &conf {
                Some(c) => format!("cannot read Ceph config {c}: {}", errtext(r)),
                None => format!(
                    "no Ceph config found (give conf=PATH or set CEPH_CONF): {}",
                    errtext(r)
                ),
            });
        }
        // SAFETY: NULL means $CEPH_ARGS.
        unsafe { (api.conf_parse_env)(p.cluster, ptr::null()) };
        let timeout = t.timeout_s.to_string();
        for (k, v) in [
            ("client_mount_timeout", timeout.as_str()),
            ("rados_mon_op_timeout", &timeout),
            ("rados_osd_op_timeout", &timeout),
            ("log_to_stderr", "false"),
            ("err_to_stderr", "false"),
        ] {
            let (kc, vc) = (cstr("option", k)?, cstr("value", v)?);
            // SAFETY: valid handle and strings.
            let r = unsafe { (api.conf_set)(p.cluster, kc.as_ptr(), vc.as_ptr()) };
            if r < 0 {
                return Err(format!("cannot set {k}={v}: {}", errtext(r)));
            }
        }
        let mut mon = [0u8; 512];
        let key = cstr("option", "mon_host")?;
        // SAFETY: valid handle; the buffer's length is passed.
        let r = unsafe {
            (api.conf_get)(
                p.cluster,
                key.as_ptr(),
                mon.as_mut_ptr() as *mut c_char,
                mon.len(),
            )
        };
        if r == 0 && mon[0] == 0 {
            return Err(format!(
                "no monitors configured (no \"mon host\" in {})",
                conf.as_deref().unwrap_or("the default Ceph config")
            ));
        }
        // SAFETY: configured handle; bounded by client_mount_timeout.
        let r = unsafe { (api.connect)(p.cluster) };
        if r < 0 {
            return Err(format!(
                "cannot connect to the Ceph cluster of {} as {}: {}",
                conf.as_deref().unwrap_or("the default config"),
                client.to_string_lossy(),
                errtext(r)
            ));
        }
        let pool = cstr("pool", &t.pool)?;
        // SAFETY: connected handle, out-pointer we own.
        let r = unsafe { (api.ioctx_create)(p.cluster, pool.as_ptr(), &mut p.io) };
        if r < 0 {
            p.io = ptr::null_mut();
            return Err(if r == -libc::ENOENT {
                format!(
                    "pool {:?} does not exist (create it with `ceph osd pool create {}`)",
                    t.pool, t.pool
                )
            } else {
                format!("cannot open pool {:?}: {}", t.pool, errtext(r))
            });
        }
        Ok(p)
    }

    /// Reads up to `buf.len()` bytes at `off` of `oid`; the count read.
    pub fn read(&self, oid: &str, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context; the buffer's length is passed.
        let r = unsafe {
            (self.api.read)(
                self.io,
                o.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
                off,
            )
        };
        check(r).map(|n| n as usize)
    }

    pub fn write(&self, oid: &str, data: &[u8], off: u64) -> Result<(), Errno> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context; the data's length is passed.
        let r = unsafe {
            (self.api.write)(
                self.io,
                o.as_ptr(),
                data.as_ptr() as *const c_char,
                data.len(),
                off,
            )
        };
        check(r).map(drop)
    }

    pub fn trunc(&self, oid: &str, size: u64) -> Result<(), Errno> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context and name.
        check(unsafe { (self.api.trunc)(self.io, o.as_ptr(), size) }).map(drop)
    }

    pub fn remove(&self, oid: &str) -> Result<(), Errno> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context and name.
        check(unsafe { (self.api.remove)(self.io, o.as_ptr()) }).map(drop)
    }

    /// An xattr of `oid` (at most 64 bytes).
    pub fn getxattr(&self, oid: &str, name: &str) -> Result<Vec<u8>, Errno> {
        let (o, n) = (c(oid.as_bytes())?, c(name.as_bytes())?);
        let mut buf = [0u8; 64];
        // SAFETY: valid context; the buffer's length is passed.
        let r = unsafe {
            (self.api.getxattr)(
                self.io,
                o.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
            )
        };
        let n = check(r)? as usize;
        Ok(buf[..n.min(buf.len())].to_vec())
    }

    pub fn setxattr(&self, oid: &str, name: &str, value: &[u8]) -> Result<(), Errno> {
        let (o, n) = (c(oid.as_bytes())?, c(name.as_bytes())?);
        // SAFETY: valid context; the value's length is passed.
        let r = unsafe {
            (self.api.setxattr)(
                self.io,
                o.as_ptr(),
                n.as_ptr(),
                value.as_ptr() as *const c_char,
                value.len(),
            )
        };
        check(r).map(drop)
    }

    /// Sets the `set` keys and removes the `rm` keys of `oid`'s omap in
    /// one atomic operation (creating the object if needed).
    pub fn omap_update(
        &self,
        oid: &str,
        set: &[(&[u8], &[u8])],
        rm: &[&[u8]],
    ) -> Result<(), Errno> {
        let o = c(oid.as_bytes())?;
        let keys: Vec<CString> = set.iter().map(|(k, _)| c(k)).collect::<Result<_, _>>()?;
        let rmk: Vec<CString> = rm.iter().map(|k| c(k)).collect::<Result<_, _>>()?;
        let kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let vp: Vec<*const c_char> = set
            .iter()
            .map(|(_, v)| v.as_ptr() as *const c_char)
            .collect();
        let lens: Vec<usize> = set.iter().map(|(_, v)| v.len()).collect();
        let rp: Vec<*const c_char> = rmk.iter().map(|k| k.as_ptr()).collect();
        // SAFETY: the op is created, filled with pointers that outlive
        // operate (the vectors above), run once and released once.
        unsafe {
            let op = (self.api.create_write_op)();
            if op.is_null() {
                return Err(Errno(libc::ENOMEM));
            }
            if !set.is_empty() {
                (self.api.write_op_omap_set)(op, kp.as_ptr(), vp.as_ptr(), lens.as_ptr(), kp.len());
            }
            if !rm.is_empty() {
                (self.api.write_op_omap_rm_keys)(op, rp.as_ptr(), rp.len());
            }
            let r = (self.api.write_op_operate)(op, self.io, o.as_ptr(), ptr::null_mut(), 0);
            (self.api.release_write_op)(op);
            check(r).map(drop)
        }
    }

    /// The value of omap key `key` of `oid`, `None` if the key (or the
    /// object) does not exist.
    pub fn omap_get(&self, oid: &str, key: &[u8]) -> Result<Option<Vec<u8>>, Errno> {
        let k = c(key)?;
        let kp = [k.as_ptr()];
        let got = self.read_omap(oid, |api, op, iter, rval| {
            // SAFETY: called by read_omap on a live op with out-pointers.
            unsafe { (api.read_op_omap_get_vals_by_keys)(op, kp.as_ptr(), 1, iter, rval) }
        })?;
        Ok(got.0.into_iter().find(|(kk, _)| kk == key).map(|(_, v)| v))
    }

    /// At most `max` omap pairs of `oid` after key `after` (from the
    /// start if `None`), in key order, and whether more follow.
    #[allow(clippy::type_complexity)]
    pub fn omap_list(
        &self,
        oid: &str,
        after: Option<&[u8]>,
        max: u64,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), Errno> {
        let a = after.map(c).transpose()?;
        let empty = CString::default();
        let mut more: c_uchar = 0;
        let pm: *mut c_uchar = &mut more;
        let mut got = self.read_omap(oid, |api, op, iter, rval| {
            // SAFETY: called by read_omap on a live op; strings outlive it.
            unsafe {
                (api.read_op_omap_get_vals2)(
                    op,
                    a.as_ref().unwrap_or(&empty).as_ptr(),
                    empty.as_ptr(),
                    max,
                    iter,
                    pm,
                    rval,
                )
            }
        })?;
        got.1 = more != 0;
        Ok(got)
    }

    /// Runs a read op with one omap step added by `add` and collects the
    /// pairs its iterator yields; a missing object reads as no pairs.
    #[allow(clippy::type_complexity)]
    fn read_omap(
        &self,
        oid: &str,
        add: impl FnOnce(&'static Api, Handle, *mut Handle, *mut c_int),
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), Errno> {
        let o = c(oid.as_bytes())?;
        let mut out = Vec::new();
        // SAFETY: the op is created, run once and released once; the
        // iterator is read only after a successful operate and ended once.
        unsafe {
            let op = (self.api.create_read_op)();
            if op.is_null() {
                return Err(Errno(libc::ENOMEM));
            }
            let mut iter: Handle = ptr::null_mut();
            let mut rval: c_int = 0;
            add(self.api, op, &mut iter, &mut rval);
            let r = (self.api.read_op_operate)(op, self.io, o.as_ptr(), 0);
            if r < 0 || rval < 0 {
                // The iterator is allocated when the step is added: end
                // it on every path.
                if !iter.is_null() {
                    (self.api.omap_get_end)(iter);
                }
                (self.api.release_read_op)(op);
                if r == -libc::ENOENT {
                    return Ok((out, false));
                }
                return Err(Errno(-(if r < 0 { r } else { rval })));
            }
            loop {
                let (mut k, mut v, mut len) = (ptr::null_mut(), ptr::null_mut(), 0usize);
                if (self.api.omap_get_next)(iter, &mut k, &mut v, &mut len) < 0 || k.is_null() {
                    break;
                }
                let key = CStr::from_ptr(k).to_bytes().to_vec();
                let val = if v.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(v as *const u8, len).to_vec()
                };
                out.push((key, val));
            }
            (self.api.omap_get_end)(iter);
            (self.api.release_read_op)(op);
        }
        Ok((out, false))
    }

    /// (total, available) bytes and the number of objects in the cluster.
    pub fn cluster_stat(&self) -> Result<(u64, u64, u64), Errno> {
        let mut s = ClusterStat::default();
        // SAFETY: connected handle and an out-struct of librados's layout.
        check(unsafe { (self.api.cluster_stat)(self.cluster, &mut s) })?;
        Ok((s.kb << 10, s.kb_avail << 10, s.num_objects))
    }
}
