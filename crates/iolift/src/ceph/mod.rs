//! Ceph's client libraries, loaded at run time: librados ([`rados`], the
//! iolift-rados crate, shared with the file system's kv backend: the
//! cluster connection and pool I/O contexts) and librbd ([`rbd`]: images).
//!
//! librbd.so.1 is opened with `libloading` the first time something asks
//! for it, after librados, with iolift-rados's loader helpers, so building
//! iolift needs neither Ceph headers nor Ceph libraries, and only a feature
//! that talks to Ceph needs them installed. Its entry points are resolved
//! once into a process-wide table, and the library stays loaded for the
//! life of the process (completion callbacks and the table point into
//! it). `$IOLIFT_LIBRADOS` and `$IOLIFT_LIBRBD` name other files to load.
//!
//! Errors from here say what failed without naming the feature that asked;
//! callers add that as context (the rbd backend's `rbd backend: ...`).

pub use iolift_rados as rados;
pub mod rbd;

pub use iolift_rados::{cstr, errtext};
