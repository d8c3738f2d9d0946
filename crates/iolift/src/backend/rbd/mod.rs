//! `rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,keyring=PATH][,cluster=NAME][,snap=SNAP][,ro][,timeout=SECS]`:
//! a Ceph RBD image through librbd.
//!
//! librbd.so.1 and librados.so.2 are loaded at run time by [`crate::ceph`],
//! so building iolift needs neither Ceph headers nor Ceph libraries; only
//! opening an `rbd:` backend does. Options follow Ceph's conventions (as
//! `rbd-nbd` takes them): `conf` (else `$CEPH_CONF`, else Ceph's default
//! search path), `id` (client name without `client.`, default `admin`),
//! `keyring`, `cluster` (default `ceph`); `$CEPH_ARGS` is honoured too.
//! `timeout` bounds connecting and monitor operations (default 10 s), so an
//! unreachable cluster fails with one error line instead of hanging.
//!
//! Every request maps to one librbd aio call (`aio.rs`) whose completion
//! callback (run on a librbd thread) delivers the return value to a future
//! or, for reads and plain writes through `submit_cb`, straight to the
//! caller's callback: bytes for reads and writes, 0 for flush/discard/zero,
//! or a negative errno (DeLiBA's completion semantics). FUA is a write
//! followed by `rbd_aio_flush`.
//!
//! This file: the spec, opening the image, the checks every request
//! passes, and the mapping of each request kind to its aio calls.

mod aio;

use super::{BackendSpec, Kind, OptHelp};
use crate::block::extents::from_allocated;
use crate::block::{BlockDev, Callback, DevInfo, DevRef, Errno, Extent, IoFuture, Reply, Request};
use crate::ceph::rados::{Cluster, ClusterConfig};
use crate::ceph::rbd::{self as librbd, Image, WRITE_ZEROES_THICK};
use crate::ceph::{cstr, errtext};
use aio::{
    aio, aio_call, flush_aio, rc, read_done, read_op, then_flush, wait, write_aio, write_op, AioBuf,
};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

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

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "conf",
        kind: Kind::Text("PATH"),
        default: "$CEPH_CONF, else Ceph's search path",
        help: "ceph.conf to read",
    },
    OptHelp {
        name: "id",
        kind: Kind::Text("NAME"),
        default: "admin",
        help: "client id (client.NAME)",
    },
    OptHelp {
        name: "keyring",
        kind: Kind::Text("PATH"),
        default: "Ceph's default",
        help: "keyring file",
    },
    OptHelp {
        name: "cluster",
        kind: Kind::Text("NAME"),
        default: "ceph",
        help: "cluster name",
    },
    OptHelp {
        name: "snap",
        kind: Kind::Text("SNAP"),
        default: "none",
        help: "open this snapshot, read-only (also POOL/IMAGE@SNAP)",
    },
    OptHelp {
        name: "ro",
        kind: Kind::Flag,
        default: "off",
        help: "read-only",
    },
    OptHelp {
        name: "timeout",
        kind: Kind::Count,
        default: "10",
        help: "seconds allowed to connect and for monitor operations, 1..3600",
    },
];

const USAGE: &str = "rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,keyring=PATH][,cluster=NAME][,snap=SNAP][,ro][,timeout=SECS]";

impl RbdSpec {
    pub fn parse(s: &BackendSpec) -> Result<Self> {
        let o = &s.opts;
        o.check(OPTIONS)?;
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
        let text = |k: &str| o.get(k).map(str::to_string);
        let snap = text("snap").or(at_snap);
        let timeout_s = match o.u64("timeout", 10)? {
            n @ 1..=3600 => n as u32,
            n => {
                return Err(o.err(
                    "timeout",
                    format_args!("{n}: expected whole seconds, 1..3600"),
                ))
            }
        };
        Ok(RbdSpec {
            pool: pool.to_string(),
            image: image.to_string(),
            read_only: o.flag("ro")? || snap.is_some(),
            snap,
            conf: text("conf"),
            id: text("id"),
            keyring: text("keyring"),
            cluster: text("cluster").unwrap_or_else(|| "ceph".into()),
            timeout_s,
        })
    }

    /// The cluster part of the spec.
    pub fn cluster_config(&self) -> ClusterConfig {
        ClusterConfig {
            cluster: self.cluster.clone(),
            id: self.id.clone(),
            conf: self.conf.clone(),
            keyring: self.keyring.clone(),
            timeout_s: self.timeout_s,
        }
    }
}

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let spec = RbdSpec::parse(s)?;
    Ok(Arc::new(RbdDev::open(&spec)?))
}

/// The rbd backend.
pub struct RbdDev {
    /// The open image; dropping the last reference closes it (librbd waits
    /// for its in-flight aio) and disconnects.
    h: Arc<Image>,
    size: u64,
    read_only: bool,
    label: String,
}

impl RbdDev {
    pub fn open(spec: &RbdSpec) -> Result<Self> {
        const WHO: &str = "rbd backend";
        let api = librbd::api().context(WHO)?;
        let label = format!("{}/{}", spec.pool, spec.image);
        let cluster = Cluster::connect(&spec.cluster_config()).context(WHO)?;
        let ioctx = cluster.ioctx(&spec.pool).context(WHO)?;
        let image = cstr("image", &spec.image).context(WHO)?;
        let snap = spec
            .snap
            .as_deref()
            .map(|s| cstr("snap", s))
            .transpose()
            .context(WHO)?;
        let h = match Image::open(api, ioctx, &image, snap.as_deref(), spec.read_only) {
            Ok(h) => h,
            Err(r) if r == -libc::ENOENT => match &spec.snap {
                Some(sn) => {
                    bail!("rbd backend: image {label} or its snapshot {sn:?} does not exist")
                }
                None => bail!(
                    "rbd backend: image {label} does not exist in pool {:?}",
                    spec.pool
                ),
            },
            Err(r) => bail!(
                "rbd backend: cannot open image {label}: {}",
                errtext(r as i64)
            ),
        };
        let size = match h.size() {
            Ok(n) => n,
            Err(r) => bail!("rbd backend: size of {label}: {}", errtext(r as i64)),
        };
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

    /// The checks every request passes before it reaches librbd: in range,
    /// and no change to a read-only image.
    fn admit(&self, req: &Request) -> Result<(), Errno> {
        req.admit(self.size, self.read_only)
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
        match self.h.api().rbd_aio_write_zeroes {
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
        let Some(diff) = self.h.api().rbd_diff_iterate2 else {
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
                        h.handle(),
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
            Ok(Reply::Extents(from_allocated(offset, len as u64, &ranges)))
        })
    }
}

impl BlockDev for RbdDev {
    fn info(&self) -> DevInfo {
        let mut i = DevInfo::full(self.size);
        i.read_only = self.read_only;
        i.can_cache = false;
        i.can_fast_zero = self.h.api().rbd_aio_write_zeroes.is_some();
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
        let c = s.cluster_config();
        assert_eq!(
            (c.cluster.as_str(), c.id.as_deref(), c.timeout_s),
            ("ceph", Some("me"), 3)
        );
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
}
