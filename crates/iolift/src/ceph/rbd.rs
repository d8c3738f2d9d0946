//! librbd: its entry points ([`RbdApi`]) and an open image ([`Image`]).
//!
//! Contract: [`api`] loads librados first (librbd is a librados client),
//! then librbd, once per process; a failure is remembered and returned to
//! every caller. An [`Image`] owns the I/O context it was opened in:
//! dropping it closes the image (librbd waits for its in-flight aio), then
//! destroys the context and, with the last context, the cluster
//! connection. Asynchronous I/O on the image is the caller's: it calls the
//! `rbd_aio_*` entry points with [`Image::handle`].

use anyhow::Result;
use iolift_rados::{self as rados, load, opt_sym, sym, table, IoCtx, IoctxT};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::OnceLock;

/// `rbd_image_t`: an open image.
pub type ImageT = *mut c_void;
/// `rbd_completion_t`: one aio's completion.
pub type CompletionT = *mut c_void;
/// `rbd_callback_t`: called on librbd's thread when an aio completes.
pub type RbdCallback = unsafe extern "C" fn(CompletionT, *mut c_void);
/// The callback of `rbd_diff_iterate2`: offset, length, exists, argument.
pub type DiffCallback = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// `RBD_WRITE_ZEROES_FLAG_THICK_PROVISION`: keep the zeroed range allocated.
pub const WRITE_ZEROES_THICK: c_int = 1;

/// The librbd entry points iolift uses, resolved once per process.
pub struct RbdApi {
    pub rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    pub rbd_open_read_only:
        unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, RbdCallback, *mut CompletionT) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(CompletionT),
    pub rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    pub rbd_aio_write:
        unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(ImageT, u64, u64, CompletionT) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
    /// Since librbd 1.13 (Ceph 14); absent in older libraries.
    pub rbd_aio_write_zeroes:
        Option<unsafe extern "C" fn(ImageT, u64, usize, CompletionT, c_int, c_int) -> c_int>,
    pub rbd_diff_iterate2: Option<
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
    /// Keeps the library mapped for the life of the process (callbacks and
    /// the function pointers above point into it).
    _lib: Library,
}

static API: OnceLock<Result<RbdApi, String>> = OnceLock::new();

/// librados and librbd, loaded on first use (`$IOLIFT_LIBRBD`, default
/// `librbd.so.1`).
pub fn api() -> Result<&'static RbdApi> {
    rados::api()?;
    table(&API, load_api)
}

/// The table if [`api`] has loaded it; for completion callbacks, which
/// only exist once it has.
pub fn loaded() -> Option<&'static RbdApi> {
    API.get().and_then(|r| r.as_ref().ok())
}

fn load_api() -> Result<RbdApi, String> {
    let (lib, name) = load(
        "IOLIFT_LIBRBD",
        "librbd.so.1",
        "install librbd1, e.g. apt-get install librbd1",
    )?;
    // SAFETY (every sym! and opt_sym! below): the type is the C prototype
    // from librbd.h; a missing optional symbol is fine.
    macro_rules! sym {
        ($name:ident) => {
            unsafe { sym(&lib, &name, stringify!($name)) }?
        };
    }
    macro_rules! opt_sym {
        ($name:ident) => {
            unsafe { opt_sym(&lib, stringify!($name)) }
        };
    }
    Ok(RbdApi {
        rbd_open: sym!(rbd_open),
        rbd_open_read_only: sym!(rbd_open_read_only),
        rbd_close: sym!(rbd_close),
        rbd_get_size: sym!(rbd_get_size),
        rbd_aio_create_completion: sym!(rbd_aio_create_completion),
        rbd_aio_get_return_value: sym!(rbd_aio_get_return_value),
        rbd_aio_release: sym!(rbd_aio_release),
        rbd_aio_read: sym!(rbd_aio_read),
        rbd_aio_write: sym!(rbd_aio_write),
        rbd_aio_discard: sym!(rbd_aio_discard),
        rbd_aio_flush: sym!(rbd_aio_flush),
        rbd_aio_write_zeroes: opt_sym!(rbd_aio_write_zeroes),
        rbd_diff_iterate2: opt_sym!(rbd_diff_iterate2),
        _lib: lib,
    })
}

/// An open image; it keeps its I/O context (and cluster) open.
pub struct Image {
    api: &'static RbdApi,
    handle: ImageT,
    /// Destroyed after the image is closed (fields drop after `drop`).
    _ioctx: IoCtx,
}

// SAFETY: librbd image handles are thread-safe for the calls made on them
// (aio submission, diff_iterate, close).
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: opened successfully and closed once.
        unsafe { (self.api.rbd_close)(self.handle) };
    }
}

impl Image {
    /// Opens image `name` in `ioctx` with the table from [`api`], at
    /// snapshot `snap` if given, read-only or not. On failure, librbd's
    /// negative return code.
    pub fn open(
        api: &'static RbdApi,
        ioctx: IoCtx,
        name: &CStr,
        snap: Option<&CStr>,
        read_only: bool,
    ) -> Result<Image, c_int> {
        let opener = if read_only {
            api.rbd_open_read_only
        } else {
            api.rbd_open
        };
        let snap_ptr = snap.map_or(ptr::null(), |s| s.as_ptr());
        let mut handle: ImageT = ptr::null_mut();
        // SAFETY: valid ioctx, out-pointer we own, NUL-terminated names.
        let r = unsafe { opener(ioctx.handle(), name.as_ptr(), &mut handle, snap_ptr) };
        if r < 0 {
            return Err(r);
        }
        Ok(Image {
            api,
            handle,
            _ioctx: ioctx,
        })
    }

    /// The image's size in bytes, or librbd's negative return code.
    pub fn size(&self) -> Result<u64, c_int> {
        let mut size = 0u64;
        // SAFETY: open image, out-pointer we own.
        let r = unsafe { (self.api.rbd_get_size)(self.handle, &mut size) };
        if r < 0 {
            return Err(r);
        }
        Ok(size)
    }

    /// The raw `rbd_image_t`, valid while `self` lives.
    pub fn handle(&self) -> ImageT {
        self.handle
    }

    pub fn api(&self) -> &'static RbdApi {
        self.api
    }
}
