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
use crate::io::write_all;
use crate::mapping::Mapping;
use std::sync::Arc;

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

    fn check(&self, off: u64, len: usize) -> Result<()> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.cp.size() => Ok(()),
            _ => Err(Error::Invalid(format!(
                "range {off}+{len} is past the end of the image ({} bytes)",
                self.cp.size()
            ))),
        }
    }

    fn pin(&self, id: usize, c: u64) -> Result<Pinned<'_>> {
        match self.cp.caches()[id].get_pinned(c) {
            Some(p) => Ok(p),
            None => self.cp.translate(id, c),
        }
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.check(off, buf.len())?;
        let Some(id) = self.id else {
            return self.cp.read_locked(off, buf);
        };
        for (c, at, r) in crate::pieces(off, buf.len(), self.cp.cluster_bits()) {
            let pin = self.pin(id, c)?;
            self.cp.read_mapped(pin.mapping(), c, at, &mut buf[r])?;
        }
        Ok(())
    }

    /// Writes `data` at `off`; with `fua`, durable when it returns.
    pub fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<()> {
        if self.cp.read_only() {
            return Err(Error::ReadOnly("opened read-only".into()));
        }
        self.check(off, data.len())?;
        for (c, at, r) in crate::pieces(off, data.len(), self.cp.cluster_bits()) {
            let piece = &data[r];
            if let Some(id) = self.id {
                let pin = self.pin(id, c)?;
                if let Mapping::Data {
                    host,
                    writable: true,
                } = pin.mapping()
                {
                    write_all(&self.cp.file, host + at, piece)
                        .map_err(io_ctx(format!("writing guest cluster {c}")))?;
                    continue;
                }
            }
            self.cp.write_cluster(c, at, piece)?;
        }
        if fua {
            self.cp.flush()?;
        }
        Ok(())
    }
}
