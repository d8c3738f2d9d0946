//! The kv backend's table of the files the kernel knows: node id (the
//! file's id) to name, metadata, lookup and open counts, bounded by
//! `max_nodes`; and the positions of open directory listings.

use super::meta::Meta;
use crate::model::{Errno, FsResult};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};

/// One file the kernel holds a reference to or has open.
pub struct Node {
    /// Its name in the index; `None` once unlinked (then it lives on
    /// until the last open file is released and its data is removed).
    pub name: Option<OsString>,
    pub meta: Meta,
    pub lookups: u64,
    pub opens: u32,
    /// `meta` changed since it was last written to the index.
    pub dirty: bool,
}

/// Where a directory listing stopped: the cookie of its last entry and
/// the name it had, so the next call resumes after that key.
#[derive(Default)]
pub struct DirPos {
    pub off: u64,
    pub after: Option<Vec<u8>>,
}

/// Open directory listings kept at most (each holds one name).
pub const MAX_DIRS: usize = 4096;

#[derive(Default)]
pub struct Table {
    pub nodes: HashMap<u64, Node>,
    pub names: HashMap<OsString, u64>,
    pub dirs: HashMap<u64, DirPos>,
    pub next_dir: u64,
    /// Next file id to hand out, and the first one not yet reserved in
    /// the index object.
    pub next_id: u64,
    pub reserved: u64,
}

impl Table {
    /// The node of `name`, if the table has it.
    pub fn by_name(&self, name: &OsStr) -> Option<&Node> {
        self.names.get(name).and_then(|i| self.nodes.get(i))
    }

    /// Counts `n` lookups of the file `meta` names `name`, adding its node
    /// (ENFILE when the table is full). Returns the metadata the kernel
    /// should see: the table's, which may be newer than the index's.
    pub fn add_ref(&mut self, name: &OsStr, meta: Meta, n: u64, max: usize) -> FsResult<Meta> {
        if let Some(node) = self.nodes.get_mut(&meta.id) {
            node.lookups += n;
            return Ok(node.meta);
        }
        if self.nodes.len() >= max {
            tracing::warn!("kv: node table full ({max} files held by the kernel; max_nodes=)");
            return Err(Errno::ENFILE);
        }
        self.nodes.insert(
            meta.id,
            Node {
                name: Some(name.to_os_string()),
                meta,
                lookups: n,
                opens: 0,
                dirty: false,
            },
        );
        self.names.insert(name.to_os_string(), meta.id);
        Ok(meta)
    }

    /// Drops `id`'s node if nothing holds it any more.
    pub fn maybe_drop(&mut self, id: u64) {
        let gone = matches!(self.nodes.get(&id), Some(n) if n.lookups == 0 && n.opens == 0);
        if gone {
            let n = self.nodes.remove(&id).unwrap();
            if n.dirty {
                tracing::warn!("kv: file {id} dropped with unsaved metadata");
            }
            if let Some(name) = n.name {
                if self.names.get(&name) == Some(&id) {
                    self.names.remove(&name);
                }
            }
        }
    }

    /// Marks the file named `name` unlinked. `None`: the table does not
    /// hold it; `Some(true)`: no open files, its data can go now;
    /// `Some(false)`: the last release removes it.
    pub fn unlinked(&mut self, name: &OsStr) -> Option<bool> {
        let id = self.names.remove(name)?;
        let n = self.nodes.get_mut(&id)?;
        n.name = None;
        n.dirty = false;
        Some(n.opens == 0)
    }
}
