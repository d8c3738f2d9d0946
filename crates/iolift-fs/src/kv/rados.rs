//! The kv backend's pool: the iolift-rados crate's cluster connection and
//! object calls (librados loaded at run time, one table per process,
//! shared with the block device's rbd backend), with failures as this
//! crate's [`Errno`].
//!
//! Contract: [`Pool::connect`] connects as Ceph's tools do (`conf`, else
//! `$CEPH_CONF`, else Ceph's search path, then `$CEPH_ARGS`), bounds
//! connecting, monitor and OSD operations by the timeout (an OSD that
//! does not answer fails the file operation with ETIMEDOUT rather than
//! blocking it), and opens one pool; every failure is one line saying what
//! is wrong. The object calls return librados's errno as an [`Errno`]. A
//! [`Pool`] may be used from any thread.

use crate::model::Errno;
use iolift_rados::objects::OmapPairs;
use iolift_rados::{Cluster, ClusterConfig, IoCtx};

/// How to reach the cluster and which pool to open.
#[derive(Clone, Debug, Default)]
pub struct Target {
    pub pool: String,
    pub conf: Option<String>,
    /// Client name without `client.` (default `admin`).
    pub id: Option<String>,
    pub timeout_s: u32,
}

/// A connected cluster and an I/O context on one pool (dropping it
/// destroys the context, then shuts the connection down).
pub struct Pool {
    io: IoCtx,
}

impl Pool {
    /// Loads librados if needed, connects and opens `t.pool`.
    pub fn connect(t: &Target) -> Result<Pool, String> {
        let cfg = ClusterConfig {
            cluster: "ceph".into(),
            id: t.id.clone(),
            conf: t.conf.clone(),
            keyring: None,
            timeout_s: t.timeout_s,
        };
        let timeout = t.timeout_s.to_string();
        let cluster = Cluster::connect_with(&cfg, &[("rados_osd_op_timeout", &timeout)])
            .map_err(|e| format!("{e:#}"))?;
        let io = cluster.ioctx(&t.pool).map_err(|e| format!("{e:#}"))?;
        Ok(Pool { io })
    }

    /// Reads up to `buf.len()` bytes at `off` of `oid`; the count read.
    pub fn read(&self, oid: &str, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
        self.io.read(oid, buf, off).map_err(Errno)
    }

    pub fn write(&self, oid: &str, data: &[u8], off: u64) -> Result<(), Errno> {
        self.io.write(oid, data, off).map_err(Errno)
    }

    pub fn trunc(&self, oid: &str, size: u64) -> Result<(), Errno> {
        self.io.trunc(oid, size).map_err(Errno)
    }

    pub fn remove(&self, oid: &str) -> Result<(), Errno> {
        self.io.remove(oid).map_err(Errno)
    }

    /// An xattr of `oid` (at most 64 bytes).
    pub fn getxattr(&self, oid: &str, name: &str) -> Result<Vec<u8>, Errno> {
        self.io.getxattr(oid, name).map_err(Errno)
    }

    pub fn setxattr(&self, oid: &str, name: &str, value: &[u8]) -> Result<(), Errno> {
        self.io.setxattr(oid, name, value).map_err(Errno)
    }

    /// Sets the `set` keys and removes the `rm` keys of `oid`'s omap in
    /// one atomic operation (creating the object if needed).
    pub fn omap_update(
        &self,
        oid: &str,
        set: &[(&[u8], &[u8])],
        rm: &[&[u8]],
    ) -> Result<(), Errno> {
        self.io.omap_update(oid, set, rm).map_err(Errno)
    }

    /// The value of omap key `key` of `oid`, `None` if the key (or the
    /// object) does not exist.
    pub fn omap_get(&self, oid: &str, key: &[u8]) -> Result<Option<Vec<u8>>, Errno> {
        self.io.omap_get(oid, key).map_err(Errno)
    }

    /// At most `max` omap pairs of `oid` after key `after` (from the
    /// start if `None`), in key order, and whether more follow.
    pub fn omap_list(
        &self,
        oid: &str,
        after: Option<&[u8]>,
        max: u64,
    ) -> Result<(OmapPairs, bool), Errno> {
        self.io.omap_list(oid, after, max).map_err(Errno)
    }

    /// (total, available) bytes and the number of objects in the cluster.
    pub fn cluster_stat(&self) -> Result<(u64, u64, u64), Errno> {
        self.io.cluster().stat().map_err(Errno)
    }
}
