//! libnfs, loaded at run time: the entry points the nfs backend uses
//! ([`Api`]) and one NFS connection ([`Conn`]).
//!
//! The library is `$IOLIFT_LIBNFS` or `libnfs.so.13` (Debian's libnfs13,
//! libnfs 4.0), opened once per process on first use; a build of iolift
//! needs neither libnfs nor its header. The prototypes below are those of
//! libnfs 4.0's `nfsc/libnfs.h` synchronous API.

use crate::model::Errno;
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// `struct nfs_context`, `struct nfsfh`, `struct nfsdir`: opaque.
pub type Context = c_void;
pub type FileT = c_void;
pub type DirT = c_void;

/// `struct nfs_stat_64`: every field 64 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Stat64 {
    pub dev: u64,
    pub ino: u64,
    pub mode: u64,
    pub nlink: u64,
    pub uid: u64,
    pub gid: u64,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atime_nsec: u64,
    pub mtime_nsec: u64,
    pub ctime_nsec: u64,
    pub used: u64,
}

/// `struct nfs_statvfs_64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StatVfs64 {
    pub bsize: u64,
    pub frsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub favail: u64,
    pub fsid: u64,
    pub flag: u64,
    pub namemax: u64,
}

/// `struct nfsdirent` (the fields up to `ctime_nsec`; libnfs allocates it).
#[repr(C)]
pub struct DirEnt {
    pub next: *mut DirEnt,
    pub name: *mut c_char,
    pub inode: u64,
    pub kind: u32,
    pub mode: u32,
    pub size: u64,
    pub atime: libc::timeval,
    pub mtime: libc::timeval,
    pub ctime: libc::timeval,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub dev: u64,
    pub rdev: u64,
    pub blksize: u64,
    pub blocks: u64,
    pub used: u64,
    pub atime_nsec: u32,
    pub mtime_nsec: u32,
    pub ctime_nsec: u32,
}

/// `struct nfs_url`.
#[repr(C)]
pub struct Url {
    pub server: *mut c_char,
    pub path: *mut c_char,
    pub file: *mut c_char,
}

type Cx = *mut Context;
type P = *const c_char;

/// The libnfs entry points, resolved once per process.
pub struct Api {
    pub init_context: unsafe extern "C" fn() -> Cx,
    pub destroy_context: unsafe extern "C" fn(Cx),
    pub get_error: unsafe extern "C" fn(Cx) -> *mut c_char,
    pub parse_url_dir: unsafe extern "C" fn(Cx, P) -> *mut Url,
    pub destroy_url: unsafe extern "C" fn(*mut Url),
    pub set_version: unsafe extern "C" fn(Cx, c_int) -> c_int,
    pub set_timeout: unsafe extern "C" fn(Cx, c_int),
    pub set_autoreconnect: unsafe extern "C" fn(Cx, c_int),
    pub set_client_name: unsafe extern "C" fn(Cx, P),
    pub set_dircache: unsafe extern "C" fn(Cx, c_int),
    pub mount: unsafe extern "C" fn(Cx, P, P) -> c_int,
    pub lstat64: unsafe extern "C" fn(Cx, P, *mut Stat64) -> c_int,
    pub fstat64: unsafe extern "C" fn(Cx, *mut FileT, *mut Stat64) -> c_int,
    pub open: unsafe extern "C" fn(Cx, P, c_int, *mut *mut FileT) -> c_int,
    pub create: unsafe extern "C" fn(Cx, P, c_int, c_int, *mut *mut FileT) -> c_int,
    pub close: unsafe extern "C" fn(Cx, *mut FileT) -> c_int,
    pub pread: unsafe extern "C" fn(Cx, *mut FileT, u64, u64, *mut c_void) -> c_int,
    pub pwrite: unsafe extern "C" fn(Cx, *mut FileT, u64, u64, *const c_void) -> c_int,
    pub fsync: unsafe extern "C" fn(Cx, *mut FileT) -> c_int,
    pub truncate: unsafe extern "C" fn(Cx, P, u64) -> c_int,
    pub ftruncate: unsafe extern "C" fn(Cx, *mut FileT, u64) -> c_int,
    pub mkdir2: unsafe extern "C" fn(Cx, P, c_int) -> c_int,
    pub rmdir: unsafe extern "C" fn(Cx, P) -> c_int,
    pub mknod: unsafe extern "C" fn(Cx, P, c_int, c_int) -> c_int,
    pub unlink: unsafe extern "C" fn(Cx, P) -> c_int,
    pub opendir: unsafe extern "C" fn(Cx, P, *mut *mut DirT) -> c_int,
    pub readdir: unsafe extern "C" fn(Cx, *mut DirT) -> *mut DirEnt,
    pub closedir: unsafe extern "C" fn(Cx, *mut DirT),
    pub statvfs64: unsafe extern "C" fn(Cx, P, *mut StatVfs64) -> c_int,
    pub readlink: unsafe extern "C" fn(Cx, P, *mut c_char, c_int) -> c_int,
    pub chmod: unsafe extern "C" fn(Cx, P, c_int) -> c_int,
    pub fchmod: unsafe extern "C" fn(Cx, *mut FileT, c_int) -> c_int,
    pub lchown: unsafe extern "C" fn(Cx, P, c_int, c_int) -> c_int,
    pub lutimes: unsafe extern "C" fn(Cx, P, *mut libc::timeval) -> c_int,
    pub symlink: unsafe extern "C" fn(Cx, P, P) -> c_int,
    pub rename: unsafe extern "C" fn(Cx, P, P) -> c_int,
    pub link: unsafe extern "C" fn(Cx, P, P) -> c_int,
    /// Keeps the library mapped (the pointers above point into it).
    _lib: Library,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// libnfs, loaded on first use; a failure is remembered.
pub fn api() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let name = std::env::var("IOLIFT_LIBNFS").unwrap_or_else(|_| "libnfs.so.13".into());
    // SAFETY: loading a shared library runs its initialisers; libnfs's
    // have no preconditions.
    let lib = unsafe { Library::new(&name) }.map_err(|e| {
        format!("nfs: cannot load {name} ({e}): install libnfs13, e.g. apt-get install libnfs13")
    })?;
    macro_rules! sym {
        ($c:literal) => {
            // SAFETY: the field's type is the C prototype of this symbol
            // in libnfs 4.0's header.
            *unsafe { lib.get(concat!($c, "\0").as_bytes()) }
                .map_err(|e| format!("nfs: {name} has no {} ({e})", $c))?
        };
    }
    Ok(Api {
        init_context: sym!("nfs_init_context"),
        destroy_context: sym!("nfs_destroy_context"),
        get_error: sym!("nfs_get_error"),
        parse_url_dir: sym!("nfs_parse_url_dir"),
        destroy_url: sym!("nfs_destroy_url"),
        set_version: sym!("nfs_set_version"),
        set_timeout: sym!("nfs_set_timeout"),
        set_autoreconnect: sym!("nfs_set_autoreconnect"),
        set_client_name: sym!("nfs4_set_client_name"),
        set_dircache: sym!("nfs_set_dircache"),
        mount: sym!("nfs_mount"),
        lstat64: sym!("nfs_lstat64"),
        fstat64: sym!("nfs_fstat64"),
        open: sym!("nfs_open"),
        create: sym!("nfs_create"),
        close: sym!("nfs_close"),
        pread: sym!("nfs_pread"),
        pwrite: sym!("nfs_pwrite"),
        fsync: sym!("nfs_fsync"),
        truncate: sym!("nfs_truncate"),
        ftruncate: sym!("nfs_ftruncate"),
        mkdir2: sym!("nfs_mkdir2"),
        rmdir: sym!("nfs_rmdir"),
        mknod: sym!("nfs_mknod"),
        unlink: sym!("nfs_unlink"),
        opendir: sym!("nfs_opendir"),
        readdir: sym!("nfs_readdir"),
        closedir: sym!("nfs_closedir"),
        statvfs64: sym!("nfs_statvfs64"),
        readlink: sym!("nfs_readlink"),
        chmod: sym!("nfs_chmod"),
        fchmod: sym!("nfs_fchmod"),
        lchown: sym!("nfs_lchown"),
        lutimes: sym!("nfs_lutimes"),
        symlink: sym!("nfs_symlink"),
        rename: sym!("nfs_rename"),
        link: sym!("nfs_link"),
        _lib: lib,
    })
}

/// A libnfs result: >= 0 as it is, < 0 the negated errno libnfs mapped
/// the NFS status to (EIO where it gave none that fits: libnfs 4.0 maps
/// NFSv4-only statuses, such as a lost open state, to ERANGE).
pub fn cvt(r: c_int) -> Result<c_int, Errno> {
    if r >= 0 {
        Ok(r)
    } else if r == -libc::ERANGE {
        Err(Errno::EIO)
    } else if r > -4096 {
        Err(Errno(-r))
    } else {
        Err(Errno::EIO)
    }
}

/// One NFS connection: a mounted `nfs_context`, used by one thread at a
/// time (libnfs contexts are not thread-safe).
pub struct Conn {
    pub api: &'static Api,
    pub cx: *mut Context,
}

// SAFETY: a context may move between threads; the owner serialises its use
// (each Conn sits behind a Mutex).
unsafe impl Send for Conn {}

impl Conn {
    /// Connects to and mounts `url` (libnfs's URL syntax) with NFS
    /// `version` (3 or 4), every synchronous call bounded by `timeout_ms`.
    pub fn connect(url: &str, version: u32, timeout_ms: u32) -> Result<Conn, String> {
        let api = api()?;
        // SAFETY: no preconditions; NULL on failure.
        let cx = unsafe { (api.init_context)() };
        if cx.is_null() {
            return Err("nfs: nfs_init_context failed".into());
        }
        let conn = Conn { api, cx };
        let curl = CString::new(url).map_err(|_| format!("{url}: NUL in the URL"))?;
        // SAFETY: valid context and string; the URL is freed below.
        let u = unsafe { (api.parse_url_dir)(cx, curl.as_ptr()) };
        if u.is_null() {
            return Err(format!("{url}: not an NFS URL: {}", conn.error()));
        }
        // SAFETY: u is a valid nfs_url until destroy_url.
        let (server, path) = unsafe {
            let server = (*u).server;
            let path = (*u).path;
            let s = (!server.is_null()).then(|| CStr::from_ptr(server).to_owned());
            let p = (!path.is_null()).then(|| CStr::from_ptr(path).to_owned());
            (api.destroy_url)(u);
            (s, p)
        };
        let (Some(server), Some(path)) = (server, path) else {
            return Err(format!(
                "{url}: needs a host and an export: nfs://HOST/EXPORT"
            ));
        };
        // SAFETY: valid context.
        unsafe {
            (api.set_version)(cx, version as c_int);
            (api.set_timeout)(cx, timeout_ms.min(i32::MAX as u32) as c_int);
            // A lost server fails requests (EIO) rather than retrying forever.
            (api.set_autoreconnect)(cx, 0);
            // libnfs keeps listings (with their attributes) until the
            // directory's mtime changes, which a write to a file in it
            // does not: stale sizes would reach the kernel through
            // readdirplus. Listings are read fresh at every opendir.
            (api.set_dircache)(cx, 0);
        }
        // Each connection is its own NFSv4 client: libnfs's default client
        // name is the same for every context of a process, and a second
        // SETCLIENTID under one name makes the server expire the first
        // client's open state (NFS4ERR_EXPIRED).
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = CString::new(format!(
            "iolift {} {} {:x}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        ))
        .expect("no NUL in the name");
        // SAFETY: valid context and string (libnfs copies it).
        unsafe { (api.set_client_name)(cx, name.as_ptr()) };
        // SAFETY: valid context and strings.
        let r = unsafe { (api.mount)(cx, server.as_ptr(), path.as_ptr()) };
        if r < 0 {
            return Err(format!(
                "nfs: mounting {} from {} (NFSv{version}): {}",
                path.to_string_lossy(),
                server.to_string_lossy(),
                conn.error()
            ));
        }
        Ok(conn)
    }

    /// libnfs's description of the last error on this context.
    pub fn error(&self) -> String {
        // SAFETY: valid context; the string (if any) lives in it.
        let p = unsafe { (self.api.get_error)(self.cx) };
        if p.is_null() {
            return "unknown error".into();
        }
        // SAFETY: NUL-terminated string owned by libnfs.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: the context is ours and no longer used.
        unsafe { (self.api.destroy_context)(self.cx) }
    }
}
