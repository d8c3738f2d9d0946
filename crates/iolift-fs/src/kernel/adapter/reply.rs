//! How the adapter answers: the [`Done`] each request's fuser reply is
//! wrapped in (converts the backend's result, counts it in [`OpStats`]
//! and sends it), and the passthrough registrations an open's reply
//! carries (one backing id per node while it has open files).
//!
//! [`OpStats`]: crate::stats::OpStats

use super::super::convert::{attr, errno};
use super::Adapter;
use crate::model::{self, Attr, Done, Entry, Opened, Xattr};
use crate::stats::op;
use fuser::{
    BackingId, FopenFlags, Generation, ReplyAttr, ReplyEmpty, ReplyEntry, ReplyWrite, ReplyXattr,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Passthrough registrations: one backing id per node while it has open
/// files (the kernel requires the same id for every open of an inode).
#[derive(Default)]
pub(super) struct Backing {
    by_node: HashMap<u64, (Arc<BackingId>, u64)>,
    by_fh: HashMap<u64, u64>,
}

impl Adapter {
    /// A `Done` that records `name`'s latency and then runs `f`.
    pub(super) fn done<T: 'static>(
        &self,
        name: &str,
        f: impl FnOnce(model::FsResult<T>) + Send + 'static,
    ) -> Done<T> {
        let (stats, i, t) = (self.stats.clone(), op(name), Instant::now());
        Done::new(move |r: model::FsResult<T>| {
            stats.record(i, t, r.is_ok());
            f(r)
        })
    }

    pub(super) fn entry_done(&self, name: &str, reply: ReplyEntry) -> Done<Entry> {
        self.done(name, move |r: model::FsResult<Entry>| match r {
            Ok(e) => reply.entry(&e.ttl, &attr(&e.attr), Generation(e.generation)),
            Err(e) => reply.error(errno(e)),
        })
    }

    pub(super) fn empty_done(&self, name: &str, reply: ReplyEmpty) -> Done<()> {
        self.done(name, move |r: model::FsResult<()>| match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        })
    }

    pub(super) fn attr_done(
        &self,
        name: &str,
        reply: ReplyAttr,
        ttl: std::time::Duration,
    ) -> Done<Attr> {
        self.done(name, move |r: model::FsResult<Attr>| match r {
            Ok(a) => reply.attr(&ttl, &attr(&a)),
            Err(e) => reply.error(errno(e)),
        })
    }

    /// For write and copy_file_range: the byte count as fuser's `written`.
    pub(super) fn written_done(&self, name: &str, reply: ReplyWrite) -> Done<u32> {
        self.done(name, move |r: model::FsResult<u32>| match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        })
    }

    pub(super) fn xattr_done(&self, name: &str, reply: ReplyXattr) -> Done<Xattr> {
        self.done(name, move |r: model::FsResult<Xattr>| match r {
            Ok(Xattr::Size(n)) => reply.size(n),
            Ok(Xattr::Data(d)) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        })
    }

    /// The open flags and, with passthrough, the backing id to answer with.
    pub(super) fn open_reply(
        &self,
        ino: u64,
        o: &Opened,
        register: impl FnOnce(&std::os::fd::OwnedFd) -> std::io::Result<BackingId>,
    ) -> (FopenFlags, Option<Arc<BackingId>>) {
        let mut flags = FopenFlags::empty();
        if o.direct_io {
            flags |= FopenFlags::FOPEN_DIRECT_IO;
        }
        if o.keep_cache {
            flags |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        let Some(fd) = o.passthrough.as_ref().filter(|_| self.opts.passthrough) else {
            return (flags, None);
        };
        let mut b = self.backing.lock().unwrap_or_else(|e| e.into_inner());
        let id = match b.by_node.get_mut(&ino) {
            Some((id, n)) => {
                *n += 1;
                id.clone()
            }
            None => match register(fd) {
                Ok(id) => {
                    let id = Arc::new(id);
                    b.by_node.insert(ino, (id.clone(), 1));
                    id
                }
                Err(e) => {
                    tracing::warn!("FUSE passthrough: cannot register node {ino}: {e}; serving it");
                    return (flags, None);
                }
            },
        };
        b.by_fh.insert(o.fh, ino);
        (flags, Some(id))
    }

    /// Gives back `fh`'s share of its node's passthrough registration
    /// (the registration goes with the node's last open file).
    pub(super) fn drop_backing(&self, fh: u64) {
        let mut b = self.backing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ino) = b.by_fh.remove(&fh) {
            if let Some((_, n)) = b.by_node.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    b.by_node.remove(&ino);
                }
            }
        }
    }

    /// What a completion needs of the adapter (passthrough registrations).
    pub(super) fn clone_for_reply(&self) -> Adapter {
        Adapter {
            fs: self.fs.clone(),
            stats: self.stats.clone(),
            opts: self.opts.clone(),
            backing: self.backing.clone(),
        }
    }
}
