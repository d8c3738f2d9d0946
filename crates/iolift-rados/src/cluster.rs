//! The cluster connection ([`Cluster`]) and a pool's I/O context
//! ([`IoCtx`]).
//!
//! Contract: [`Cluster::connect`] loads librados if needed, reads the Ceph
//! config the way Ceph's tools do (`conf`, else `$CEPH_CONF`, else Ceph's
//! search path; then `$CEPH_ARGS`), bounds connecting and monitor
//! operations by the given timeout, keeps librados quiet on stderr, and
//! fails with one line saying what is wrong. An [`IoCtx`] keeps its
//! cluster connected; dropping the last handle destroys the context, then
//! shuts the connection down. Both handles may be used from any thread.

use crate::api::{api, ClusterStat, Handle, RadosApi};
use crate::{cstr, errtext};
use anyhow::{bail, Result};
use std::ffi::c_char;
use std::ptr;
use std::sync::Arc;

/// `rados_t`: a cluster handle.
pub type RadosT = Handle;
/// `rados_ioctx_t`: a pool I/O context.
pub type IoctxT = Handle;

/// How to reach a cluster, in Ceph's terms (as `rbd-nbd` takes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Cluster name (Ceph's default is `ceph`).
    pub cluster: String,
    /// Client name without `client.` (default `admin`).
    pub id: Option<String>,
    /// Config file; else `$CEPH_CONF`, else Ceph's search path.
    pub conf: Option<String>,
    pub keyring: Option<String>,
    /// Bounds connecting and monitor operations, in seconds.
    pub timeout_s: u32,
}

/// A connected cluster. Dropping the last reference shuts it down.
pub struct Cluster {
    api: &'static RadosApi,
    handle: RadosT,
}

// SAFETY: librados cluster handles are thread-safe.
unsafe impl Send for Cluster {}
// SAFETY: as above.
unsafe impl Sync for Cluster {}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            // SAFETY: created by rados_create2 and shut down once.
            unsafe { (self.api.rados_shutdown)(self.handle) };
        }
    }
}

impl Cluster {
    /// Loads librados if needed, configures a handle and connects.
    pub fn connect(cfg: &ClusterConfig) -> Result<Arc<Cluster>> {
        Self::connect_with(cfg, &[])
    }

    /// As [`Cluster::connect`], with more librados options `(name, value)`
    /// set after the config is read (e.g. `rados_osd_op_timeout`).
    pub fn connect_with(cfg: &ClusterConfig, options: &[(&str, &str)]) -> Result<Arc<Cluster>> {
        let api = api()?;
        let mut h = Cluster {
            api,
            handle: ptr::null_mut(),
        };
        let cluster_name = cstr("cluster", &cfg.cluster)?;
        let client = cstr(
            "id",
            &format!("client.{}", cfg.id.as_deref().unwrap_or("admin")),
        )?;
        // SAFETY: out-pointer to a handle we own; names are NUL-terminated.
        let r = unsafe {
            (api.rados_create2)(&mut h.handle, cluster_name.as_ptr(), client.as_ptr(), 0)
        };
        if r < 0 {
            h.handle = ptr::null_mut();
            bail!("rados_create2 failed: {}", errtext(r as i64));
        }
        // Config file: conf=, else $CEPH_CONF, else Ceph's search path.
        let conf = cfg
            .conf
            .clone()
            .or_else(|| std::env::var("CEPH_CONF").ok().filter(|c| !c.is_empty()));
        match &conf {
            Some(path) => {
                let c = cstr("conf", path)?;
                // SAFETY: valid handle and path.
                let r = unsafe { (api.rados_conf_read_file)(h.handle, c.as_ptr()) };
                if r < 0 {
                    bail!("cannot read Ceph config {path}: {}", errtext(r as i64));
                }
            }
            None => {
                // SAFETY: NULL asks for the default search path.
                let r = unsafe { (api.rados_conf_read_file)(h.handle, ptr::null()) };
                if r < 0 {
                    bail!("no Ceph config found (give conf=PATH or set CEPH_CONF; searched /etc/ceph/{}.conf, ~/.ceph/config, ./ceph.conf): {}", cfg.cluster, errtext(r as i64));
                }
            }
        }
        // SAFETY: NULL means $CEPH_ARGS.
        unsafe { (api.rados_conf_parse_env)(h.handle, ptr::null()) };
        let t = cfg.timeout_s.to_string();
        let set = |k: &str, v: &str| -> Result<()> {
            let (kc, vc) = (cstr("option", k)?, cstr("value", v)?);
            // SAFETY: valid handle and NUL-terminated strings.
            let r = unsafe { (api.rados_conf_set)(h.handle, kc.as_ptr(), vc.as_ptr()) };
            if r < 0 {
                bail!("cannot set {k}={v}: {}", errtext(r as i64));
            }
            Ok(())
        };
        set("client_mount_timeout", &t)?;
        set("rados_mon_op_timeout", &t)?;
        // Our own error line says what failed; keep librados quiet on stderr.
        set("log_to_stderr", "false")?;
        set("err_to_stderr", "false")?;
        for (k, v) in options {
            set(k, v)?;
        }
        if let Some(k) = &cfg.keyring {
            if !std::path::Path::new(k).exists() {
                bail!("keyring {k} does not exist");
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
                h.handle,
                key.as_ptr(),
                mon.as_mut_ptr() as *mut c_char,
                mon.len(),
            )
        };
        if r == 0 && mon[0] == 0 {
            bail!(
                "no monitors configured (no \"mon host\" in {})",
                conf.as_deref().unwrap_or("the default Ceph config")
            );
        }
        // SAFETY: configured handle; blocks at most client_mount_timeout.
        let r = unsafe { (api.rados_connect)(h.handle) };
        if r < 0 {
            let hint = if r == -libc::ETIMEDOUT {
                format!(
                    " within {}s (is the cluster up? monitors from {})",
                    cfg.timeout_s,
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
                "cannot connect to Ceph cluster {:?} as {}: {}{hint}",
                cfg.cluster,
                client.to_string_lossy(),
                errtext(r as i64)
            );
        }
        Ok(Arc::new(h))
    }

    /// The raw `rados_t`, valid while `self` lives.
    pub fn handle(&self) -> RadosT {
        self.handle
    }

    pub fn api(&self) -> &'static RadosApi {
        self.api
    }

    /// (total bytes, available bytes, objects) of the whole cluster; a
    /// failure is librados's errno.
    pub fn stat(&self) -> Result<(u64, u64, u64), i32> {
        let mut s = ClusterStat::default();
        // SAFETY: connected handle and an out-struct of librados's layout.
        let r = unsafe { (self.api.rados_cluster_stat)(self.handle, &mut s) };
        if r < 0 {
            return Err(-r);
        }
        Ok((s.kb << 10, s.kb_avail << 10, s.num_objects))
    }

    /// Opens an I/O context on `pool`.
    pub fn ioctx(self: &Arc<Self>, pool: &str) -> Result<IoCtx> {
        let name = cstr("pool", pool)?;
        let mut io: IoctxT = ptr::null_mut();
        // SAFETY: connected handle, out-pointer we own.
        let r = unsafe { (self.api.rados_ioctx_create)(self.handle, name.as_ptr(), &mut io) };
        if r < 0 {
            if r == -libc::ENOENT {
                bail!(
                    "pool {pool:?} does not exist (create it with `ceph osd pool create {pool}`)"
                );
            }
            bail!("cannot open pool {pool:?}: {}", errtext(r as i64));
        }
        Ok(IoCtx {
            api: self.api,
            handle: io,
            cluster: self.clone(),
        })
    }
}

/// An I/O context on one pool; it keeps its cluster connected.
pub struct IoCtx {
    api: &'static RadosApi,
    handle: IoctxT,
    /// Dropped after the context is destroyed (fields drop after `drop`).
    cluster: Arc<Cluster>,
}

// SAFETY: librados I/O contexts are thread-safe for the calls made on them
// (aio submission, image opening).
unsafe impl Send for IoCtx {}
// SAFETY: as above.
unsafe impl Sync for IoCtx {}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create and destroyed once.
        unsafe { (self.api.rados_ioctx_destroy)(self.handle) };
    }
}

impl IoCtx {
    /// The raw `rados_ioctx_t`, valid while `self` lives.
    pub fn handle(&self) -> IoctxT {
        self.handle
    }

    pub fn api(&self) -> &'static RadosApi {
        self.api
    }

    /// The cluster this context keeps connected.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }
}
