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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn meta(id: u64) -> Meta {
        Meta {
            id,
            size: 10,
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
        }
    }

    #[test]
    fn the_table_is_bounded_and_unlinked_files_wait_for_their_last_close() {
        let mut t = Table::default();
        let a = OsStr::new("a");
        assert_eq!(t.add_ref(a, meta(20), 1, 2).unwrap().id, 20);
        // A second lookup of a held file counts, whatever the index says.
        assert_eq!(t.add_ref(a, meta(20), 1, 2).unwrap().size, 10);
        assert_eq!(t.nodes[&20].lookups, 2);
        t.add_ref(OsStr::new("b"), meta(21), 1, 2).unwrap();
        assert_eq!(
            t.add_ref(OsStr::new("c"), meta(22), 1, 2),
            Err(Errno::ENFILE)
        );
        // Open and unlinked: the data stays until the last close.
        t.nodes.get_mut(&20).unwrap().opens = 1;
        assert_eq!(t.unlinked(a), Some(false));
        assert!(t.by_name(a).is_none());
        assert_eq!(t.unlinked(OsStr::new("b")), Some(true));
        assert_eq!(t.unlinked(OsStr::new("zz")), None);
        t.nodes.get_mut(&20).unwrap().lookups = 0;
        t.maybe_drop(20);
        assert!(t.nodes.contains_key(&20), "still open");
        t.nodes.get_mut(&20).unwrap().opens = 0;
        t.maybe_drop(20);
        assert!(!t.nodes.contains_key(&20));
    }
}
