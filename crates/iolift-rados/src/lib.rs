//! librados, loaded at run time, for every part of iolift that talks to
//! Ceph: the block device's rbd backend (in the iolift crate, which adds
//! librbd on top) and the file system's kv backend (in iolift-fs). Both
//! share one process-wide table of entry points ([`api`]), one way of
//! connecting ([`Cluster::connect`]) and one set of error texts.
//!
//! librados.so.2 is opened with `libloading` the first time something asks
//! for it, so building needs neither Ceph headers nor Ceph libraries, and
//! only a feature that talks to Ceph needs them installed. The entry points
//! are resolved once into a table, and the library stays loaded for the
//! life of the process (completion callbacks and the table point into
//! it). `$IOLIFT_LIBRADOS` names another file to load.
//!
//! - [`api`]: the table ([`RadosApi`]).
//! - [`cluster`]: [`Cluster`] (a connection) and [`IoCtx`] (a pool).
//! - [`objects`]: object, xattr and omap calls on an [`IoCtx`], returning
//!   librados's errno.
//! - here: the loader helpers other Ceph tables use (librbd's, in the
//!   iolift crate): [`load`], [`sym`], [`opt_sym`], [`table`], and
//!   [`errtext`], [`cstr`].
//!
//! Errors from here say what failed without naming the feature that
//! asked; callers add that as context (`rbd backend: ...`, `kv:...: ...`).

pub mod api;
pub mod cluster;
pub mod objects;

pub use api::{api, RadosApi};
pub use cluster::{Cluster, ClusterConfig, IoCtx, IoctxT, RadosT};

use anyhow::{anyhow, Result};
use libloading::Library;
use std::ffi::CString;
use std::sync::OnceLock;

/// A negative return code as text, e.g. `No such file or directory (os error 2)`.
pub fn errtext(r: i64) -> String {
    let e = (-r).clamp(0, i32::MAX as i64) as i32;
    std::io::Error::from_raw_os_error(e).to_string()
}

/// `s` as a C string; `what` names it in the error if it holds a NUL byte.
pub fn cstr(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| anyhow!("{what} {s:?} contains a NUL byte"))
}

/// The table in `cell`, loaded by `load` on first use; a failure is kept
/// and returned to every caller.
pub fn table<T>(
    cell: &'static OnceLock<Result<T, String>>,
    load: fn() -> Result<T, String>,
) -> Result<&'static T> {
    cell.get_or_init(load).as_ref().map_err(|e| anyhow!("{e}"))
}

/// Opens the library named by `$env`, else `default`; `install` is the
/// hint printed when it cannot be loaded. Returns the library and the name
/// it was loaded by.
pub fn load(env: &str, default: &str, install: &str) -> Result<(Library, String), String> {
    let name = std::env::var(env).unwrap_or_else(|_| default.into());
    // SAFETY: loading Ceph's client libraries runs their initialisers,
    // which have no preconditions.
    let lib = unsafe { Library::new(&name) }
        .map_err(|e| format!("cannot load {name} ({install}): {e}"))?;
    Ok((lib, name))
}

/// Resolves a required symbol of `lib` (loaded as `libname`).
///
/// # Safety
///
/// `T` must be the symbol's C type (its prototype in librados.h/librbd.h).
pub unsafe fn sym<T: Copy>(lib: &Library, libname: &str, name: &str) -> Result<T, String> {
    // SAFETY: the caller gives the right type.
    unsafe { lib.get::<T>(name) }
        .map(|s| *s)
        .map_err(|e| format!("{libname} lacks {name}: {e}"))
}

/// Resolves an optional symbol: `None` if the library lacks it.
///
/// # Safety
///
/// As for [`sym`].
pub unsafe fn opt_sym<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    // SAFETY: the caller gives the right type.
    unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_what_failed() {
        assert_eq!(
            errtext(-2),
            std::io::Error::from_raw_os_error(2).to_string()
        );
        assert!(errtext(-2).contains("No such file"), "{}", errtext(-2));
        let e = cstr("pool", "a\0b").unwrap_err().to_string();
        assert_eq!(e, "pool \"a\\0b\" contains a NUL byte");
        assert_eq!(cstr("pool", "rbd").unwrap().as_bytes(), b"rbd");
    }

    #[test]
    fn a_missing_library_says_which_and_how_to_install() {
        let Err(e) = load(
            "IOLIFT_RADOS_TEST_UNSET_VARIABLE",
            "libiolift-no-such-library.so.7",
            "install it",
        ) else {
            panic!("a library that does not exist loaded");
        };
        assert!(
            e.starts_with("cannot load libiolift-no-such-library.so.7 (install it): "),
            "{e}"
        );
    }
}
