//! The librados entry points iolift uses, resolved once per process.

use crate::{load, sym, table};
use anyhow::Result;
use libloading::Library;
use std::ffi::{c_char, c_int, c_uchar, c_void};
use std::sync::OnceLock;

/// Any librados handle: `rados_t`, `rados_ioctx_t`, a read or write op,
/// an omap iterator.
pub type Handle = *mut c_void;

/// `struct rados_cluster_stat_t`.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct ClusterStat {
    pub kb: u64,
    pub kb_used: u64,
    pub kb_avail: u64,
    pub num_objects: u64,
}

/// librados's entry points, each with its prototype from librados.h.
pub struct RadosApi {
    pub rados_create2:
        unsafe extern "C" fn(*mut Handle, *const c_char, *const c_char, u64) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    pub rados_conf_parse_env: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int,
    pub rados_conf_get: unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize) -> c_int,
    pub rados_connect: unsafe extern "C" fn(Handle) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(Handle),
    pub rados_cluster_stat: unsafe extern "C" fn(Handle, *mut ClusterStat) -> c_int,
    pub rados_ioctx_create: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(Handle),
    pub rados_read: unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize, u64) -> c_int,
    pub rados_write:
        unsafe extern "C" fn(Handle, *const c_char, *const c_char, usize, u64) -> c_int,
    pub rados_trunc: unsafe extern "C" fn(Handle, *const c_char, u64) -> c_int,
    pub rados_remove: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    pub rados_getxattr:
        unsafe extern "C" fn(Handle, *const c_char, *const c_char, *mut c_char, usize) -> c_int,
    pub rados_setxattr:
        unsafe extern "C" fn(Handle, *const c_char, *const c_char, *const c_char, usize) -> c_int,
    pub rados_create_write_op: unsafe extern "C" fn() -> Handle,
    pub rados_release_write_op: unsafe extern "C" fn(Handle),
    pub rados_write_op_omap_set: unsafe extern "C" fn(
        Handle,
        *const *const c_char,
        *const *const c_char,
        *const usize,
        usize,
    ),
    pub rados_write_op_omap_rm_keys: unsafe extern "C" fn(Handle, *const *const c_char, usize),
    pub rados_write_op_operate:
        unsafe extern "C" fn(Handle, Handle, *const c_char, *mut i64, c_int) -> c_int,
    pub rados_create_read_op: unsafe extern "C" fn() -> Handle,
    pub rados_release_read_op: unsafe extern "C" fn(Handle),
    pub rados_read_op_omap_get_vals2: unsafe extern "C" fn(
        Handle,
        *const c_char,
        *const c_char,
        u64,
        *mut Handle,
        *mut c_uchar,
        *mut c_int,
    ),
    pub rados_read_op_omap_get_vals_by_keys:
        unsafe extern "C" fn(Handle, *const *const c_char, usize, *mut Handle, *mut c_int),
    pub rados_read_op_operate: unsafe extern "C" fn(Handle, Handle, *const c_char, c_int) -> c_int,
    pub rados_omap_get_next:
        unsafe extern "C" fn(Handle, *mut *mut c_char, *mut *mut c_char, *mut usize) -> c_int,
    pub rados_omap_get_end: unsafe extern "C" fn(Handle),
    /// Keeps the library mapped for the life of the process (the function
    /// pointers above point into it).
    _lib: Library,
}

static API: OnceLock<Result<RadosApi, String>> = OnceLock::new();

/// librados, loaded on first use (`$IOLIFT_LIBRADOS`, default
/// `librados.so.2`).
pub fn api() -> Result<&'static RadosApi> {
    table(&API, load_api)
}

fn load_api() -> Result<RadosApi, String> {
    let (lib, name) = load(
        "IOLIFT_LIBRADOS",
        "librados.so.2",
        "install Ceph's client libraries, e.g. apt-get install librados2 librbd1",
    )?;
    // SAFETY (every sym! below): the field's type is the C prototype from
    // librados.h.
    macro_rules! sym {
        ($name:ident) => {
            unsafe { sym(&lib, &name, stringify!($name)) }?
        };
    }
    Ok(RadosApi {
        rados_create2: sym!(rados_create2),
        rados_conf_read_file: sym!(rados_conf_read_file),
        rados_conf_parse_env: sym!(rados_conf_parse_env),
        rados_conf_set: sym!(rados_conf_set),
        rados_conf_get: sym!(rados_conf_get),
        rados_connect: sym!(rados_connect),
        rados_shutdown: sym!(rados_shutdown),
        rados_cluster_stat: sym!(rados_cluster_stat),
        rados_ioctx_create: sym!(rados_ioctx_create),
        rados_ioctx_destroy: sym!(rados_ioctx_destroy),
        rados_read: sym!(rados_read),
        rados_write: sym!(rados_write),
        rados_trunc: sym!(rados_trunc),
        rados_remove: sym!(rados_remove),
        rados_getxattr: sym!(rados_getxattr),
        rados_setxattr: sym!(rados_setxattr),
        rados_create_write_op: sym!(rados_create_write_op),
        rados_release_write_op: sym!(rados_release_write_op),
        rados_write_op_omap_set: sym!(rados_write_op_omap_set),
        rados_write_op_omap_rm_keys: sym!(rados_write_op_omap_rm_keys),
        rados_write_op_operate: sym!(rados_write_op_operate),
        rados_create_read_op: sym!(rados_create_read_op),
        rados_release_read_op: sym!(rados_release_read_op),
        rados_read_op_omap_get_vals2: sym!(rados_read_op_omap_get_vals2),
        rados_read_op_omap_get_vals_by_keys: sym!(rados_read_op_omap_get_vals_by_keys),
        rados_read_op_operate: sym!(rados_read_op_operate),
        rados_omap_get_next: sym!(rados_omap_get_next),
        rados_omap_get_end: sym!(rados_omap_get_end),
        _lib: lib,
    })
}
