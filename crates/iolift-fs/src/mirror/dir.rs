//! Directory listings of the mirror: a directory fd per opendir, read with
//! getdents64 from the cookie the kernel gives back.

use super::files::Handle;
use super::{sys, MirrorFs};
use crate::model::*;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStringExt;
use std::sync::{Arc, Mutex};

/// Bytes of one getdents64 batch.
const BATCH: usize = 32 << 10;

impl MirrorFs {
    pub(super) fn open_dir(&self, ino: u64) -> FsResult<Opened> {
        let node = self.dir_node(ino)?;
        let fd = sys::reopen(
            self.proc_fd.as_fd(),
            node.fd.as_raw_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        let fh = self.handles.add(Handle {
            fd: Arc::new(fd),
            dir_lock: Some(Mutex::new(())),
        })?;
        Ok(Opened::handle(fh))
    }

    pub(super) fn list(&self, fh: u64, off: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        let h = self.handles.get(fh)?;
        let Some(lock) = &h.dir_lock else {
            return Err(Errno::ENOTDIR);
        };
        // About 32 bytes an entry for short names: do not read (and
        // convert) far more than `max` entries only to drop them.
        let mut buf = vec![0u8; BATCH.min(max.max(16) * 64)];
        let raw = {
            let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
            sys::getdents(h.fd.as_fd(), off, &mut buf)?
        };
        let mut raw = raw;
        raw.truncate(max.max(1));
        let mut ids: Vec<u64> = raw.iter().map(|e| e.0).collect();
        self.nodes.ids_for(self.nodes_dev(), &mut ids);
        Ok(raw
            .into_iter()
            .zip(ids)
            .map(|((_, off, ty, name), ino)| DirEntry {
                ino,
                offset: off,
                kind: sys::dtype_mode(ty),
                name: OsString::from_vec(name),
            })
            .collect())
    }

    pub(super) fn list_plus(
        &self,
        ino: u64,
        fh: u64,
        off: u64,
        max: usize,
    ) -> FsResult<Vec<(DirEntry, Option<Entry>)>> {
        let dir = self.dir_node(ino)?;
        let mut out = Vec::new();
        for e in self.list(fh, off, max)? {
            let b = std::os::unix::ffi::OsStrExt::as_bytes(e.name.as_os_str());
            if b == b"." || b == b".." {
                out.push((e, None));
                continue;
            }
            match self.lookup_in(&dir, &e.name) {
                Ok(entry) => out.push((e, Some(entry))),
                // Gone (or replaced by something we refuse) since getdents.
                Err(_) => continue,
            }
        }
        Ok(out)
    }

    fn nodes_dev(&self) -> u64 {
        self.nodes.root_dev()
    }
}
