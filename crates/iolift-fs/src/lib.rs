//! File-system virtualization: one FUSE-shaped request model
//! ([`FileSystem`], [`model`]), backends that implement it ([`null`],
//! [`mirror`], [`nfs`], [`kv`]) and front-ends that serve one to the
//! kernel's FUSE client ([`kernel`]) or to a virtual machine over
//! vhost-user ([`virtio`]). See docs/fs.md.
//!
//! ```text
//!  application -> kernel VFS -> FUSE client -> /dev/fuse (one cloned fd per worker)
//!    -> kernel::adapter (fuser request -> FileSystem call + Done)
//!    -> backend (null | mirror:DIR | nfs://HOST/EXPORT | kv:rados:POOL)
//!    -> Done -> reply written to /dev/fuse
//!  guest virtio-fs client -> virtqueue -> virtio::session (FUSE request decoded)
//!    -> the same FileSystem call -> reply written into the guest's buffers
//! ```

pub mod batch;
pub mod devfuse;
pub mod fs;
pub mod handles;
pub mod kernel;
pub mod kv;
pub mod mirror;
pub mod model;
pub mod nfs;
pub mod node_ids;
pub mod null;
pub mod stats;
pub mod virtio;

pub use fs::FileSystem;
pub use model::{Attr, Ctx, Done, Entry, Errno, FsResult, Opened, ROOT};

use std::path::Path;
use std::sync::Arc;

/// What `open_backend` needs besides the spec.
#[derive(Clone, Debug, Default)]
pub struct BackendOptions {
    pub mirror: mirror::MirrorOptions,
}

/// Opens a backend from its spec: `null`, `null:SIZE` (bytes, with an
/// optional K/M/G/T suffix; every file claims this size, 1G by default)
/// or `mirror:DIR`.
pub fn open_backend(spec: &str, o: &BackendOptions) -> Result<Arc<dyn FileSystem>, String> {
    let (kind, arg) = match spec.split_once(':') {
        Some((k, a)) => (k, Some(a)),
        None => (spec, None),
    };
    match (kind, arg) {
        ("null", None) => Ok(Arc::new(null::NullFs::new(1 << 30))),
        ("null", Some(a)) => {
            let size = parse_size(a).ok_or_else(|| {
                format!(
                    "null:{a}: SIZE must be a number of bytes with an optional K, M, G or T suffix"
                )
            })?;
            Ok(Arc::new(null::NullFs::new(size)))
        }
        ("mirror", Some(d)) if !d.is_empty() => {
            let fs = mirror::MirrorFs::open(Path::new(d), o.mirror.clone())
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(fs))
        }
        ("mirror", _) => Err("mirror needs a directory: mirror:DIR".into()),
        // The mirror's node and handle budgets apply to nfs too.
        ("nfs", Some(_)) => Ok(Arc::new(nfs::NfsFs::open(
            spec,
            nfs::NfsOptions {
                max_nodes: o.mirror.max_nodes,
                max_handles: o.mirror.max_handles,
                ttl: o.mirror.ttl,
                ..nfs::NfsOptions::default()
            },
        )?)),
        ("kv", Some(a)) => Ok(Arc::new(kv::KvFs::open(a, o.mirror.ttl)?)),
        ("kv", None) => Err(format!("kv needs a store: {}", kv::spec::USAGE)),
        _ => Err(format!(
            "unknown file-system backend {kind:?} (known: null, null:SIZE, mirror:DIR, nfs://HOST/EXPORT, kv:rados:POOL)"
        )),
    }
}

/// `4096`, `64K`, `1G`: bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_parsed_or_refused_by_name() {
        let o = BackendOptions::default();
        assert_eq!(open_backend("null", &o).unwrap().name(), "null");
        assert!(open_backend("null:64K", &o).is_ok());
        assert!(open_backend("null:x", &o).err().unwrap().contains("null:x"));
        assert!(open_backend("mirror:", &o)
            .err()
            .unwrap()
            .contains("mirror:DIR"));
        assert!(open_backend("mirror:/nonexistent/dir", &o)
            .err()
            .unwrap()
            .contains("/nonexistent/dir"));
        assert!(open_backend("nfs://h", &o)
            .err()
            .unwrap()
            .contains("nfs://HOST/EXPORT"));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("99999999999T"), None);
    }
}
