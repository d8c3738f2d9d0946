//! `rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,keyring=PATH][,cluster=NAME][,snap=SNAP][,ro][,timeout=SECS]`:
//! a Ceph RBD image through librbd.
//!
//! librbd.so.1 and librados.so.2 are loaded at run time with `libloading`,
//! so building iolift needs neither Ceph headers nor Ceph libraries; only
//! opening an `rbd:` backend does. Options follow Ceph's conventions (as
//! `rbd-nbd` takes them): `conf` (else `$CEPH_CONF`, else Ceph's default
//! search path), `id` (client name without `client.`, default `admin`),
//! `keyring`, `cluster` (default `ceph`); `$CEPH_ARGS` is honoured too.
//! `timeout` bounds connecting and monitor operations (default 10 s), so an
//! unreachable cluster fails with one error line instead of hanging.
//!
//! Every request maps to one librbd aio call whose completion callback
//! (run on a librbd thread) sends the return value through a oneshot
//! channel: bytes for reads and writes, 0 for flush/discard/zero, or a
//! negative errno (DeLiBA's completion semantics). The request's buffer is
//! owned by the boxed callback context, so it outlives the aio even when
//! the waiting future is dropped; the completion is released in the
//! callback. FUA is a write followed by `rbd_aio_flush`.
//!
//! `$IOLIFT_LIBRBD` and `$IOLIFT_LIBRADOS` name other library files to load
//! (default `librbd.so.1`, `librados.so.2`).

use super::BackendSpec;
use crate::block::{
    BlockDev, Callback, Completion, DevInfo, DevRef, Errno, Extent, IoFuture, Reply, Request,
};
use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr;
use std::sync::{Arc, OnceLock};
use tokio::sync::oneshot;

type RadosT = *mut c_void;
type IoctxT = *mut c_void;
type ImageT = *mut c_void;
type CompletionT = *mut c_void;
type RbdCallback = unsafe extern "C" fn(CompletionT, *mut c_void);
type DiffCallback = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// `RBD_WRITE_ZEROES_FLAG_THICK_PROVISION`: keep the zeroed range allocated.
const WRITE_ZEROES_THICK: c_int = 1;

/// The librados/librbd entry points iolift uses, resolved once per process.
struct Api {
    rados_create2: unsafe extern "C" fn(*mut RadosT, *const c_char, *const c_char, u64) -> c_int,
    rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    rados_conf_get: unsafe extern "C" fn(RadosT, *const c_char, *mut c_char, usize) -> c_int,
    rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    rados_shutdown: unsafe extern "C" fn(RadosT),
    rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
    rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
    rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_open_read_only:
        unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    rbd_get_size: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, RbdCallback, *mut CompletionT) -> c_int,
    rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    rbd_aio_release: unsafe extern "C" fn(CompletionT),
    rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    rbd_aio_write: unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
    rbd_aio_discard: unsafe extern "C" fn(ImageT, u64, u64, CompletionT) -> c_int,
    rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
    /// Since librbd 1.13 (Ceph 14); absent in older libraries.
    rbd_aio_write_zeroes:
        Option<unsafe extern "C" fn(ImageT, u64, usize, CompletionT, c_int, c_int) -> c_int>,
    rbd_diff_iterate2: Option<
        unsafe extern "C" fn(
            ImageT,
            *const c_char,
            u64,
            u64,
            u8,
            u8,
            DiffCallback,
            *mut c_void,
        ) -> c_int,
    >,
    /// Keeps the libraries mapped for the life of the process (callbacks and
    /// the function pointers above point into them).
    _libs: (Library, Library),
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> Result<&'static Api> {
    API.get_or_init(load_api)
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

fn load_api() -> Result<Api, String> {
    let rados_name = std::env::var("IOLIFT_LIBRADOS").unwrap_or_else(|_| "librados.so.2".into());
    let rbd_name = std::env::var("IOLIFT_LIBRBD").unwrap_or_else(|_| "librbd.so.1".into());
    // SAFETY: loading Ceph's client libraries runs their initialisers,
    // which have no preconditions.
    let rados = unsafe { Library::new(&rados_name) }.map_err(|e| {
        format!("rbd backend: cannot load {rados_name} (install Ceph's client libraries, e.g. apt-get install librados2 librbd1): {e}")
    })?;
    // SAFETY: as above.
    let rbd = unsafe { Library::new(&rbd_name) }.map_err(|e| {
        format!("rbd backend: cannot load {rbd_name} (install librbd1, e.g. apt-get install librbd1): {e}")
    })?;
    macro_rules! sym {
        ($lib:expr, $libname:expr, $name:ident) => {
            // SAFETY: the type is the C prototype from librados.h/librbd.h.
            *unsafe { $lib.get(stringify!($name)) }.map_err(|e| {
                format!("rbd backend: {} lacks {}: {e}", $libname, stringify!($name))
            })?
        };
    }
    macro_rules! opt_sym {
        ($lib:expr, $name:ident) => {
            // SAFETY: as above; a missing symbol is fine.
            unsafe { $lib.get(stringify!($name)) }.ok().map(|s| *s)
        };
    }
    Ok(Api {
        rados_create2: sym!(rados, rados_name, rados_create2),
        rados_conf_read_file: sym!(rados, rados_name, rados_conf_read_file),
        rados_conf_parse_env: sym!(rados, rados_name, rados_conf_parse_env),
        rados_conf_set: sym!(rados, rados_name, rados_conf_set),
        rados_conf_get: sym!(rados, rados_name, rados_conf_get),
        rados_connect: sym!(rados, rados_name, rados_connect),
        rados_shutdown: sym!(rados, rados_name, rados_shutdown),
        rados_ioctx_create: sym!(rados, rados_name, rados_ioctx_create),
        rados_ioctx_destroy: sym!(rados, rados_name, rados_ioctx_destroy),
        rbd_open: sym!(rbd, rbd_name, rbd_open),
        rbd_open_read_only: sym!(rbd, rbd_name, rbd_open_read_only),
        rbd_close: sym!(rbd, rbd_name, rbd_close),
        rbd_get_size: sym!(rbd, rbd_name, rbd_get_size),
        rbd_aio_create_completion: sym!(rbd, rbd_name, rbd_aio_create_completion),
        rbd_aio_get_return_value: sym!(rbd, rbd_name, rbd_aio_get_return_value),
        rbd_aio_release: sym!(rbd, rbd_name, rbd_aio_release),
        rbd_aio_read: sym!(rbd, rbd_name, rbd_aio_read),
        rbd_aio_write: sym!(rbd, rbd_name, rbd_aio_write),
        rbd_aio_discard: sym!(rbd, rbd_name, rbd_aio_discard),
        rbd_aio_flush: sym!(rbd, rbd_name, rbd_aio_flush),
        rbd_aio_write_zeroes: opt_sym!(rbd, rbd_aio_write_zeroes),
        rbd_diff_iterate2: opt_sym!(rbd, rbd_diff_iterate2),
        _libs: (rados, rbd),
    })
}

/// A negative return code as text, e.g. `No such file or directory (os error 2)`.
fn errtext(r: i64) -> String {
    let e = (-r).clamp(0, i32::MAX as i64) as i32;
    std::io::Error::from_raw_os_error(e).to_string()
}

fn cstr(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| anyhow!("rbd backend: {what} {s:?} contains a NUL byte"))
}

/// Connection parameters parsed from the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    pub snap: Option<String>,
    pub conf: Option<String>,
    pub id: Option<String>,
    pub keyring: Option<String>,
    pub cluster: String,
    pub read_only: bool,
    pub timeout_s: u32,
}

const USAGE: &str = "rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,keyring=PATH][,cluster=NAME][,snap=SNAP][,ro][,timeout=SECS]";

impl RbdSpec {
    pub fn parse(s: &BackendSpec) -> Result<Self> {
        s.check_opts(&["conf", "id", "keyring", "cluster", "snap", "ro", "timeout"])?;
        let (pool, image) = match s.arg.split_once('/') {
            Some((p, i)) if !p.is_empty() && !i.is_empty() && !i.contains('/') => (p, i),
            _ => bail!(
                "rbd backend: expected POOL/IMAGE, got {:?} ({USAGE})",
                s.arg
            ),
        };
        // POOL/IMAGE@SNAP is Ceph's usual spelling of a snapshot.
        let (image, at_snap) = match image.split_once('@') {
            Some((i, sn)) if !i.is_empty() && !sn.is_empty() => (i, Some(sn.to_string())),
            Some(_) => bail!("rbd backend: bad image name {image:?} ({USAGE})"),
            None => (image, None),
        };
        let snap = s.opt("snap").map(str::to_string).or(at_snap);
        let timeout_s = match s.opt("timeout") {
            None => 10,
            Some(t) => match t.parse::<u32>() {
                Ok(n) if (1..=3600).contains(&n) => n,
                _ => bail!("rbd backend: timeout={t:?}: expected whole seconds, 1..3600"),
            },
        };
        let nonempty = |k: &str| -> Result<Option<String>> {
            match s.opt(k) {
                Some("") => bail!("rbd backend: option {k} needs a value ({USAGE})"),
                v => Ok(v.map(str::to_string)),
            }
        };
        Ok(RbdSpec {
            pool: pool.to_string(),
            image: image.to_string(),
            read_only: s.flag("ro") || snap.is_some(),
            snap,
            conf: nonempty("conf")?,
            id: nonempty("id")?,
            keyring: nonempty("keyring")?,
            cluster: nonempty("cluster")?.unwrap_or_else(|| "ceph".into()),
            timeout_s,
        })
    }
}

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let spec = RbdSpec::parse(s)?;
    Ok(Arc::new(RbdDev::open(&spec)?))
}

/// The open cluster connection, pool context and image. Dropping it
/// closes the image (librbd waits for its in-flight aio) and disconnects.
struct Handles {
    api: &'static Api,
    cluster: RadosT,
    ioctx: IoctxT,
    image: ImageT,
}

// SAFETY: librados cluster/ioctx handles and librbd image handles are
// thread-safe for the calls made here (aio submission, diff_iterate, close).
unsafe impl Send for Handles {}
// SAFETY: as above.
unsafe impl Sync for Handles {}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: each handle was opened successfully and is closed once.
        unsafe {
            if !self.image.is_null() {
                (self.api.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (self.api.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                (self.api.rados_shutdown)(self.cluster);
            }
        }
    }
}

/// The rbd backend.
pub struct RbdDev {
    h: Arc<Handles>,
    size: u64,
    read_only: bool,
    label: String,
}

impl RbdDev {
    pub fn open(spec: &RbdSpec) -> Result<Self> {
        let api = api()?;
        let label = format!("{}/{}", spec.pool, spec.image);
        let mut h = Handles {
            api,
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
            image: ptr::null_mut(),
        };
        let cluster_name = cstr("cluster", &spec.cluster)?;
        let client = cstr(
            "id",
            &format!("client.{}", spec.id.as_deref().unwrap_or("admin")),
        )?;
        // SAFETY: out-pointer to a handle we own; names are NUL-terminated.
        let r = unsafe {
            (api.rados_create2)(&mut h.cluster, cluster_name.as_ptr(), client.as_ptr(), 0)
        };
        if r < 0 {
            h.cluster = ptr::null_mut();
            bail!("rbd backend: rados_create2 failed: {}", errtext(r as i64));
        }
        // Config file: conf=, else $CEPH_CONF, else Ceph's search path.
        let conf = spec
            .conf
            .clone()
            .or_else(|| std::env::var("CEPH_CONF").ok().filter(|c| !c.is_empty()));
        match &conf {
            Some(path) => {
                let c = cstr("conf", path)?;
                // SAFETY: valid handle and path.
                let r = unsafe { (api.rados_conf_read_file)(h.cluster, c.as_ptr()) };
                if r < 0 {
                    bail!(
                        "rbd backend: cannot read Ceph config {path}: {}",
                        errtext(r as i64)
                    );
                }
            }
            None => {
                // SAFETY: NULL asks for the default search path.
                let r = unsafe { (api.rados_conf_read_file)(h.cluster, ptr::null()) };
                if r < 0 {
                    bail!("rbd backend: no Ceph config found (give conf=PATH or set CEPH_CONF; searched /etc/ceph/{}.conf, ~/.ceph/config, ./ceph.conf): {}", spec.cluster, errtext(r as i64));
                }
            }
        }
        // SAFETY: NULL means $CEPH_ARGS.
        unsafe { (api.rados_conf_parse_env)(h.cluster, ptr::null()) };
        let t = spec.timeout_s.to_string();
        let set = |k: &str, v: &str| -> Result<()> {
            let (kc, vc) = (cstr("option", k)?, cstr("value", v)?);
            // SAFETY: valid handle and NUL-terminated strings.
            let r = unsafe { (api.rados_conf_set)(h.cluster, kc.as_ptr(), vc.as_ptr()) };
            if r < 0 {
                bail!("rbd backend: cannot set {k}={v}: {}", errtext(r as i64));
            }
            Ok(())
        };
        set("client_mount_timeout", &t)?;
        set("rados_mon_op_timeout", &t)?;
        // Our own error line says what failed; keep librados quiet on stderr.
        set("log_to_stderr", "false")?;
        set("err_to_stderr", "false")?;
        if let Some(k) = &spec.keyring {
            if !std::path::Path::new(k).exists() {
                bail!("rbd backend: keyring {k} does not exist");
            }
            set("keyring", k)?;
        }
        // Without monitors librados would try DNS SRV records and print to
        // stderr: say what is missing instead.
        let mut mon = [0u8; 512];
        let key = cstr("option", "mon_host")?;
        // SAFETY: valid handle; the buffer's length is passed.
        let r = unsafe {
            (api.rados_conf_get)(
                h.cluster,
                key.as_ptr(),
                mon.as_mut_ptr() as *mut c_char,
                mon.len(),
            )
        };
        if r == 0 && mon[0] == 0 {
            bail!(
                "rbd backend: no monitors configured (no \"mon host\" in {})",
                conf.as_deref().unwrap_or("the default Ceph config")
            );
        }
        // SAFETY: configured handle; blocks at most client_mount_timeout.
        let r = unsafe { (api.rados_connect)(h.cluster) };
        if r < 0 {
            let hint = if r == -libc::ETIMEDOUT {
                format!(
                    " within {}s (is the cluster up? monitors from {})",
                    spec.timeout_s,
                    conf.as_deref().unwrap_or("the default config")
                )
            } else if r == -libc::ENOENT {
                " (no keyring found for this client: give keyring=PATH, or auth none)".to_string()
            } else if r == -libc::EACCES || r == -libc::EPERM {
                " (authentication failed: check id= and keyring=)".to_string()
            } else {
                format!(
                    " (config {})",
                    conf.as_deref().unwrap_or("from the default search path")
                )
            };
            bail!(
                "rbd backend: cannot connect to Ceph cluster {:?} as {}: {}{hint}",
                spec.cluster,
                client.to_string_lossy(),
                errtext(r as i64)
            );
        }
        let pool = cstr("pool", &spec.pool)?;
        // SAFETY: connected handle, out-pointer we own.
        let r = unsafe { (api.rados_ioctx_create)(h.cluster, pool.as_ptr(), &mut h.ioctx) };
        if r < 0 {
            h.ioctx = ptr::null_mut();
            if r == -libc::ENOENT {
                bail!("rbd backend: pool {:?} does not exist", spec.pool);
            }
            bail!(
                "rbd backend: cannot open pool {:?}: {}",
                spec.pool,
                errtext(r as i64)
            );
        }
        let image = cstr("image", &spec.image)?;
        let snap = spec.snap.as_deref().map(|s| cstr("snap", s)).transpose()?;
        let snap_ptr = snap.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let opener = if spec.read_only {
            api.rbd_open_read_only
        } else {
            api.rbd_open
        };
        // SAFETY: valid ioctx, out-pointer we own, NUL-terminated names.
        let r = unsafe { opener(h.ioctx, image.as_ptr(), &mut h.image, snap_ptr) };
        if r < 0 {
            h.image = ptr::null_mut();
            if r == -libc::ENOENT {
                match &spec.snap {
                    Some(sn) => {
                        bail!("rbd backend: image {label} or its snapshot {sn:?} does not exist")
                    }
                    None => bail!(
                        "rbd backend: image {label} does not exist in pool {:?}",
                        spec.pool
                    ),
                }
            }
            bail!(
                "rbd backend: cannot open image {label}: {}",
                errtext(r as i64)
            );
        }
        let mut size = 0u64;
        // SAFETY: open image, out-pointer we own.
        let r = unsafe { (api.rbd_get_size)(h.image, &mut size) };
        if r < 0 {
            bail!("rbd backend: size of {label}: {}", errtext(r as i64));
        }
        tracing::debug!(image = %label, size, "rbd image open");
        Ok(RbdDev {
            h: Arc::new(h),
            size,
            read_only: spec.read_only,
            label: match &spec.snap {
                Some(sn) => format!("{label}@{sn}"),
                None => label,
            },
        })
    }
}

/// What a callback context keeps alive until librbd is done with it.
enum AioBuf {
    None,
    Read(Vec<u8>),
    Write(Bytes),
}

/// Where an aio's result goes.
enum Sink {
    /// To a future waiting on the receiver.
    Future(oneshot::Sender<(isize, AioBuf)>),
    /// Straight to a function, called on librbd's completion thread.
    Call(Box<dyn FnOnce(isize, AioBuf) + Send>),
}

impl Sink {
    fn deliver(self, r: isize, buf: AioBuf) {
        match self {
            // The receiver may be gone (request abandoned); the buffer drops here.
            Sink::Future(tx) => {
                let _ = tx.send((r, buf));
            }
            Sink::Call(f) => f(r, buf),
        }
    }
}

/// Owned by librbd between submission and the callback.
struct AioCtx {
    sink: Sink,
    buf: AioBuf,
}

/// librbd's completion callback: hands the result and the buffer on and
/// releases the completion.
unsafe extern "C" fn aio_done(c: CompletionT, arg: *mut c_void) {
    // The callback only exists after `api()` succeeded.
    let Some(Ok(api)) = API.get() else { return };
    // SAFETY: `c` is the completion librbd is finishing; `arg` is the
    // AioCtx leaked by `aio_start` for exactly this completion.
    let (r, ctx) = unsafe {
        let r = (api.rbd_aio_get_return_value)(c);
        (api.rbd_aio_release)(c);
        (r, Box::from_raw(arg as *mut AioCtx))
    };
    let AioCtx { sink, buf } = *ctx;
    // A panic must not unwind into librbd's C++ thread.
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.deliver(r, buf)));
    if ok.is_err() {
        tracing::error!("rbd: a completion callback panicked");
    }
}

/// Starts one aio: `start` gets the api, image, completion and the buffer
/// pointer (read: writable, write: readable, else null) and returns
/// librbd's submission code. On failure the sink comes back undelivered.
fn aio_start(
    h: &Handles,
    buf: AioBuf,
    sink: Sink,
    start: impl FnOnce(&Api, ImageT, CompletionT, *mut u8) -> c_int,
) -> Result<(), (Errno, Sink)> {
    let api = h.api;
    let mut ctx = Box::new(AioCtx { sink, buf });
    // The heap buffers do not move when the box is leaked.
    let p = match &mut ctx.buf {
        AioBuf::None => ptr::null_mut(),
        AioBuf::Read(v) => v.as_mut_ptr(),
        AioBuf::Write(b) => b.as_ptr() as *mut u8,
    };
    let arg = Box::into_raw(ctx);
    let mut c: CompletionT = ptr::null_mut();
    // SAFETY: arg stays valid until the callback (or the failure paths below) frees it.
    let r = unsafe { (api.rbd_aio_create_completion)(arg as *mut c_void, aio_done, &mut c) };
    if r < 0 {
        // SAFETY: not handed to librbd; reclaim it.
        let ctx = unsafe { Box::from_raw(arg) };
        return Err((Errno(-r), ctx.sink));
    }
    let r = start(api, h.image, c, p);
    if r < 0 {
        // Not queued: librbd will not call back. Release and reclaim.
        // SAFETY: the completion and arg are still ours.
        let ctx = unsafe {
            (api.rbd_aio_release)(c);
            Box::from_raw(arg)
        };
        return Err((Errno(-r), ctx.sink));
    }
    Ok(())
}

/// [`aio_start`] with a future's receiver as the sink.
fn aio(
    h: &Handles,
    buf: AioBuf,
    start: impl FnOnce(&Api, ImageT, CompletionT, *mut u8) -> c_int,
) -> Result<oneshot::Receiver<(isize, AioBuf)>, Errno> {
    let (tx, rx) = oneshot::channel();
    aio_start(h, buf, Sink::Future(tx), start).map_err(|(e, _)| e)?;
    Ok(rx)
}

/// [`aio_start`] with a callback as the sink; a submission failure is
/// delivered to it as a negative return value.
fn aio_call(
    h: &Handles,
    buf: AioBuf,
    f: impl FnOnce(isize, AioBuf) + Send + 'static,
    start: impl FnOnce(&Api, ImageT, CompletionT, *mut u8) -> c_int,
) {
    if let Err((e, sink)) = aio_start(h, buf, Sink::Call(Box::new(f)), start) {
        sink.deliver(-(e.0 as isize), AioBuf::None);
    }
}

/// A librbd return value as a result.
fn rc(r: isize) -> Result<usize, Errno> {
    if r < 0 {
        Err(Errno((-r).min(i32::MAX as isize) as i32))
    } else {
        Ok(r as usize)
    }
}

/// A finished read: librbd filled `r` bytes of the buffer's capacity (a
/// short read, past the end, is zero-filled).
fn read_done(r: isize, buf: AioBuf, len: usize) -> Completion {
    let n = rc(r)?.min(len);
    let AioBuf::Read(mut v) = buf else {
        return Err(Errno::EIO);
    };
    if v.capacity() < len {
        return Err(Errno::EIO);
    }
    // SAFETY: librbd filled the first n bytes; zero the rest, then all
    // `len` bytes of capacity are initialised.
    unsafe {
        ptr::write_bytes(v.as_mut_ptr().add(n), 0, len - n);
        v.set_len(len);
    }
    Ok(Reply::Data(Bytes::from(v)))
}

/// Waits for an aio's callback; maps a negative return value to an errno.
async fn wait(rx: oneshot::Receiver<(isize, AioBuf)>) -> Result<(isize, AioBuf), Errno> {
    match rx.await {
        Ok((r, buf)) => rc(r).map(|_| (r, buf)),
        Err(_) => Err(Errno::EIO),
    }
}

fn flush_aio(h: &Handles) -> Result<oneshot::Receiver<(isize, AioBuf)>, Errno> {
    // SAFETY: open image and a fresh completion.
    aio(h, AioBuf::None, |api, img, c, _| unsafe {
        (api.rbd_aio_flush)(img, c)
    })
}

/// Starts `rbd_aio_read` of `len` bytes into the context's `AioBuf::Read`.
fn read_op(offset: u64, len: usize) -> impl FnOnce(&Api, ImageT, CompletionT, *mut u8) -> c_int {
    // SAFETY: p points to the Vec's `len` bytes of capacity.
    move |api, img, c, p| unsafe { (api.rbd_aio_read)(img, offset, len, p as *mut c_char, c) }
}

/// Starts `rbd_aio_write` of the context's `AioBuf::Write` (`len` bytes).
fn write_op(offset: u64, len: usize) -> impl FnOnce(&Api, ImageT, CompletionT, *mut u8) -> c_int {
    // SAFETY: p points to `len` bytes kept alive by the context.
    move |api, img, c, p| unsafe { (api.rbd_aio_write)(img, offset, len, p as *const c_char, c) }
}

fn write_aio(
    h: &Handles,
    offset: u64,
    data: Bytes,
) -> Result<oneshot::Receiver<(isize, AioBuf)>, Errno> {
    let len = data.len();
    aio(h, AioBuf::Write(data), write_op(offset, len))
}

/// Completes `first`, then (for FUA) a flush; returns `Done(n)`.
fn then_flush(
    h: Arc<Handles>,
    first: Result<oneshot::Receiver<(isize, AioBuf)>, Errno>,
    fua: bool,
    n: u64,
) -> IoFuture {
    Box::pin(async move {
        wait(first?).await?;
        if fua {
            wait(flush_aio(&h)?).await?;
        }
        Ok(Reply::Done(n))
    })
}

impl RbdDev {
    /// The checks every request passes before it reaches librbd: in range,
    /// and no change to a read-only image.
    fn admit(&self, req: &Request) -> Result<(), Errno> {
        req.check_range(self.size)?;
        if self.read_only
            && matches!(
                req.kind(),
                crate::block::OpKind::Write
                    | crate::block::OpKind::Trim
                    | crate::block::OpKind::WriteZeroes
            )
        {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    fn read(&self, offset: u64, len: u32) -> IoFuture {
        let len = len as usize;
        let rx = aio(
            &self.h,
            AioBuf::Read(Vec::with_capacity(len)),
            read_op(offset, len),
        );
        Box::pin(async move {
            let rx = rx?;
            match rx.await {
                Ok((r, buf)) => read_done(r, buf, len),
                Err(_) => Err(Errno::EIO),
            }
        })
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        no_hole: bool,
        fast: bool,
        fua: bool,
    ) -> IoFuture {
        let h = self.h.clone();
        match self.h.api.rbd_aio_write_zeroes {
            Some(wz) => {
                if fast && no_hole {
                    // Thick zeroing writes every byte: not fast.
                    return crate::block::ready(Err(Errno::ENOTSUP));
                }
                let flags = if no_hole { WRITE_ZEROES_THICK } else { 0 };
                // SAFETY: open image and a fresh completion.
                let rx = aio(&self.h, AioBuf::None, |_, img, c, _| unsafe {
                    wz(img, offset, len as usize, c, flags, 0)
                });
                then_flush(h, rx, fua, 0)
            }
            None => {
                if fast {
                    return crate::block::ready(Err(Errno::ENOTSUP));
                }
                // Old librbd: write zero buffers (discard may skip partial objects).
                Box::pin(async move {
                    let chunk = 4u64 << 20;
                    let zeros = Bytes::from(vec![0u8; chunk.min(len as u64) as usize]);
                    let mut done = 0u64;
                    while done < len as u64 {
                        let n = chunk.min(len as u64 - done) as usize;
                        wait(write_aio(&h, offset + done, zeros.slice(..n))?).await?;
                        done += n as u64;
                    }
                    if fua {
                        wait(flush_aio(&h)?).await?;
                    }
                    Ok(Reply::Done(0))
                })
            }
        }
    }

    fn block_status(&self, offset: u64, len: u32) -> IoFuture {
        let all_data = vec![Extent {
            len: len as u64,
            hole: false,
            zero: false,
        }];
        let Some(diff) = self.h.api.rbd_diff_iterate2 else {
            return crate::block::ready(Ok(Reply::Extents(all_data)));
        };
        let h = self.h.clone();
        Box::pin(async move {
            let found = tokio::task::spawn_blocking(move || {
                let mut ranges: Vec<(u64, u64)> = Vec::new();
                unsafe extern "C" fn cb(
                    off: u64,
                    len: usize,
                    exists: c_int,
                    arg: *mut c_void,
                ) -> c_int {
                    // SAFETY: arg is the Vec passed below, alive for the call.
                    let v = unsafe { &mut *(arg as *mut Vec<(u64, u64)>) };
                    if exists != 0 {
                        v.push((off, len as u64));
                    }
                    0
                }
                // SAFETY: open image (h keeps it open); whole-object
                // granularity uses the object map when the image has one.
                let r = unsafe {
                    diff(
                        h.image,
                        ptr::null(),
                        offset,
                        len as u64,
                        1,
                        1,
                        cb,
                        &mut ranges as *mut _ as *mut c_void,
                    )
                };
                (r >= 0).then_some(ranges)
            })
            .await
            .ok()
            .flatten();
            let Some(mut ranges) = found else {
                return Ok(Reply::Extents(all_data));
            };
            ranges.sort_unstable();
            Ok(Reply::Extents(extents_from(offset, len as u64, &ranges)))
        })
    }
}

/// Turns allocated ranges (sorted, possibly extending outside the window)
/// into extents covering exactly `[offset, offset+len)`: allocated ranges
/// are data, the gaps are holes that read as zeroes.
fn extents_from(offset: u64, len: u64, ranges: &[(u64, u64)]) -> Vec<Extent> {
    let end = offset + len;
    let mut out: Vec<Extent> = Vec::new();
    let mut push = |n: u64, hole: bool| {
        if n == 0 {
            return;
        }
        match out.last_mut() {
            Some(e) if e.hole == hole => e.len += n,
            _ => out.push(Extent {
                len: n,
                hole,
                zero: hole,
            }),
        }
    };
    let mut pos = offset;
    for &(o, l) in ranges {
        let (s, e) = (o.max(pos), (o + l).min(end));
        if e <= s {
            continue;
        }
        push(s - pos, true);
        push(e - s, false);
        pos = e;
    }
    push(end - pos, true);
    out
}

impl BlockDev for RbdDev {
    fn info(&self) -> DevInfo {
        let mut i = DevInfo::full(self.size);
        i.read_only = self.read_only;
        i.can_cache = false;
        i.can_fast_zero = self.h.api.rbd_aio_write_zeroes.is_some();
        i.pref_block = 4096;
        i
    }

    fn native_callbacks(&self) -> bool {
        true
    }

    /// Reads and plain (non-FUA) writes call back from librbd's completion
    /// thread; everything else goes through [`submit`](Self::submit).
    fn submit_cb(&self, req: Request, cb: Callback) {
        if let Err(e) = self.admit(&req) {
            return cb(Err(e));
        }
        match req {
            Request::Read { offset, len } => {
                let len = len as usize;
                aio_call(
                    &self.h,
                    AioBuf::Read(Vec::with_capacity(len)),
                    move |r, buf| cb(read_done(r, buf, len)),
                    read_op(offset, len),
                );
            }
            Request::Write {
                offset,
                data,
                flags,
            } if !flags.fua => {
                let len = data.len();
                aio_call(
                    &self.h,
                    AioBuf::Write(data),
                    move |r, _| cb(rc(r).map(|_| Reply::Done(len as u64))),
                    write_op(offset, len),
                );
            }
            req => crate::block::drive(self.submit(req), cb),
        }
    }

    fn submit(&self, req: Request) -> IoFuture {
        if let Err(e) = self.admit(&req) {
            return crate::block::ready(Err(e));
        }
        match req {
            Request::Read { offset, len } => self.read(offset, len),
            Request::Write {
                offset,
                data,
                flags,
            } => {
                let n = data.len() as u64;
                then_flush(
                    self.h.clone(),
                    write_aio(&self.h, offset, data),
                    flags.fua,
                    n,
                )
            }
            Request::Flush => then_flush(self.h.clone(), flush_aio(&self.h), false, 0),
            Request::Trim { offset, len, flags } => {
                // SAFETY: open image and a fresh completion.
                let rx = aio(&self.h, AioBuf::None, |api, img, c, _| unsafe {
                    (api.rbd_aio_discard)(img, offset, len as u64, c)
                });
                then_flush(self.h.clone(), rx, flags.fua, 0)
            }
            Request::WriteZeroes { offset, len, flags } => {
                self.write_zeroes(offset, len, flags.no_hole, flags.fast_zero, flags.fua)
            }
            Request::Cache { .. } => crate::block::ready(Ok(Reply::Done(0))),
            Request::BlockStatus { offset, len } => self.block_status(offset, len),
        }
    }

    fn name(&self) -> String {
        format!("rbd({})", self.label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> Result<RbdSpec> {
        RbdSpec::parse(&BackendSpec::parse(s)?)
    }

    #[test]
    fn parse_specs() {
        let s = spec("rbd:pool/img,conf=/x/ceph.conf,id=me,keyring=/k,timeout=3").unwrap();
        assert_eq!(s.pool, "pool");
        assert_eq!(s.image, "img");
        assert_eq!(s.conf.as_deref(), Some("/x/ceph.conf"));
        assert_eq!(s.id.as_deref(), Some("me"));
        assert_eq!(s.keyring.as_deref(), Some("/k"));
        assert_eq!(s.cluster, "ceph");
        assert_eq!(s.timeout_s, 3);
        assert!(!s.read_only);
        let s = spec("rbd:p/i@snap1").unwrap();
        assert_eq!(
            (s.image.as_str(), s.snap.as_deref(), s.read_only),
            ("i", Some("snap1"), true)
        );
        for bad in [
            "rbd:pool",
            "rbd:/img",
            "rbd:pool/",
            "rbd:a/b/c",
            "rbd:p/i,timeout=0",
            "rbd:p/i,conf=",
            "rbd:p/i,bogus=1",
            "rbd:p/i@",
        ] {
            assert!(spec(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn extents() {
        let e = extents_from(0, 100, &[]);
        assert_eq!(
            e,
            vec![Extent {
                len: 100,
                hole: true,
                zero: true
            }]
        );
        let e = extents_from(10, 100, &[(0, 20), (50, 10), (55, 10), (100, 50)]);
        let lens: Vec<(u64, bool)> = e.iter().map(|x| (x.len, x.hole)).collect();
        assert_eq!(
            lens,
            vec![
                (10, false),
                (30, true),
                (15, false),
                (35, true),
                (10, false)
            ]
        );
        assert_eq!(e.iter().map(|x| x.len).sum::<u64>(), 100);
    }
}
