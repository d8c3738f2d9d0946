//! A data path: serves reads and in-place writes through its own mapping
//! cache, straight to the image file on a hit, without the control
//! plane's lock. On a miss it asks the control plane to translate; writes
//! that need a new cluster (or copy-on-write) go to the control plane.
//!
//! A pin is held only while the I/O of one cluster runs and is dropped
//! before any call into the control plane, so an invalidation waiting for
//! pins can always finish.

use crate::cache::Pinned;
use crate::control::ControlPlane;
use crate::error::{io_ctx, Error, Result};
use crate::mapping::Mapping;
use std::sync::Arc;

/// Which path served a request, for per-path latency: every cluster
/// from the cache, at least one translated by the control plane (a miss),
/// or the request ran under the control plane's lock (no cache, or a
/// write that allocated or copied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Hit,
    Miss,
    Control,
}

impl Served {
    pub const ALL: [Served; 3] = [Served::Hit, Served::Miss, Served::Control];

    pub fn name(self) -> &'static str {
        match self {
            Served::Hit => "hit",
            Served::Miss => "miss",
            Served::Control => "control",
        }
    }

    /// The slower of two (a request is as slow as its slowest piece).
    fn worst(self, o: Served) -> Served {
        match (self, o) {
            (Served::Control, _) | (_, Served::Control) => Served::Control,
            (Served::Miss, _) | (_, Served::Miss) => Served::Miss,
            _ => Served::Hit,
        }
    }
}

pub struct DataPath {
    cp: Arc<ControlPlane>,
    /// The cache this path uses; `None` when the image has no caches.
    id: Option<usize>,
}

impl DataPath {
    /// Data path `id` (modulo the number of caches).
    pub fn new(cp: Arc<ControlPlane>, id: usize) -> DataPath {
        let n = cp.caches().len();
        let id = (n > 0).then(|| id % n);
        DataPath { cp, id }
    }

    pub fn control(&self) -> &Arc<ControlPlane> {
        &self.cp
    }

    /// The cache this path uses (`None`: the image has no caches).
    pub fn cache_id(&self) -> Option<usize> {
        self.id
    }

    fn check(&self, off: u64, len: usize) -> Result<()> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.cp.size() => Ok(()),
            _ => Err(Error::Invalid(format!(
                "range {off}+{len} is past the end of the image ({} bytes)",
                self.cp.size()
            ))),
        }
    }

    fn pin(&self, id: usize, c: u64) -> Result<(Pinned<'_>, Served)> {
        match self.cp.caches()[id].get_pinned(c) {
            Some(p) => Ok((p, Served::Hit)),
            None => Ok((self.cp.translate(id, c)?, Served::Miss)),
        }
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.read_served(off, buf).map(drop)
    }

    /// [`DataPath::read`], saying which path served it.
    pub fn read_served(&self, off: u64, buf: &mut [u8]) -> Result<Served> {
        self.check(off, buf.len())?;
        let Some(id) = self.id else {
            self.cp.read_locked(off, buf)?;
            return Ok(Served::Control);
        };
        let mut how = Served::Hit;
        for (c, at, r) in crate::pieces(off, buf.len(), self.cp.cluster_bits()) {
            let (pin, h) = self.pin(id, c)?;
            how = how.worst(h);
            self.cp.read_mapped(pin.mapping(), c, at, &mut buf[r])?;
        }
        Ok(how)
    }

    /// Writes `data` at `off`; with `fua`, durable when it returns.
    pub fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_served(off, data, fua).map(drop)
    }

    /// [`DataPath::write`], saying which path served it.
    pub fn write_served(&self, off: u64, data: &[u8], fua: bool) -> Result<Served> {
        if self.cp.read_only() {
            return Err(Error::ReadOnly("opened read-only".into()));
        }
        self.check(off, data.len())?;
        let mut how = Served::Hit;
        for (c, at, r) in crate::pieces(off, data.len(), self.cp.cluster_bits()) {
            let piece = &data[r];
            if let Some(id) = self.id {
                let (pin, h) = self.pin(id, c)?;
                if let Mapping::Data {
                    host,
                    writable: true,
                } = pin.mapping()
                {
                    how = how.worst(h);
                    self.cp
                        .write_mapped(host + at, piece)
                        .map_err(io_ctx(format!("writing guest cluster {c}")))?;
                    continue;
                }
            }
            how = Served::Control;
            self.cp.write_cluster(c, at, piece)?;
        }
        if fua {
            self.cp.flush()?;
        }
        Ok(how)
    }
}
