//! The mirror's node table: one node per host inode the kernel knows,
//! each holding an O_PATH fd of that inode and the number of lookups the
//! kernel has not yet forgotten.
//!
//! Nodes are keyed by the host's (st_dev, st_ino), never by path: every
//! hard link of a file is the same node, so link counts and times agree
//! through every name, and a rename changes nothing here. Because a node
//! holds an fd, its host inode cannot be freed (and its number reused by
//! the host) while the kernel still knows the node; once the last lookup
//! is forgotten the fd is closed and the number may come back, for a new
//! file, as a new node.
//!
//! Node ids are the host inode numbers where they can be (so `stat`,
//! `readdir` and `ls -i` agree), except the root, which FUSE calls 1, and
//! inodes of another device or whose number would collide (1, or the
//! root's own), which get ids from a private range above 2^63.

use crate::model::{Errno, FsResult, ROOT};
use crate::node_ids::NodeIds;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// One host inode the kernel holds references to.
#[derive(Debug)]
pub struct Node {
    pub id: u64,
    /// O_PATH fd of the inode (for a symlink: of the link itself).
    pub fd: OwnedFd,
    /// Type bits of st_mode: decides what may be done through `fd`.
    pub kind: u32,
}

struct Slot {
    node: Arc<Node>,
    refs: u64,
    key: (u64, u64),
}

struct Table {
    by_id: HashMap<u64, Slot>,
    by_key: HashMap<(u64, u64), u64>,
    ids: NodeIds,
}

/// The table, bounded by `max` nodes (lookups beyond fail with ENFILE).
pub struct Nodes {
    t: Mutex<Table>,
    max: usize,
    root_key: (u64, u64),
}

impl Nodes {
    /// A table holding the root (never forgotten).
    pub fn new(root: OwnedFd, root_key: (u64, u64), max: usize) -> Nodes {
        let mut by_id = HashMap::new();
        by_id.insert(
            ROOT,
            Slot {
                node: Arc::new(Node {
                    id: ROOT,
                    fd: root,
                    kind: libc::S_IFDIR,
                }),
                refs: 1,
                key: root_key,
            },
        );
        let mut by_key = HashMap::new();
        by_key.insert(root_key, ROOT);
        Nodes {
            t: Mutex::new(Table {
                by_id,
                by_key,
                ids: NodeIds::default(),
            }),
            max: max.max(1),
            root_key,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.t.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node `id`, if the kernel holds it (ENOENT otherwise: a stale or
    /// made-up id from a malformed request).
    pub fn get(&self, id: u64) -> FsResult<Arc<Node>> {
        self.lock()
            .by_id
            .get(&id)
            .map(|s| s.node.clone())
            .ok_or(Errno::ENOENT)
    }

    /// Replaces each host inode number in `inos` (all of device `dev`)
    /// by the id it has or would get, taking the table's lock once.
    pub fn ids_for(&self, dev: u64, inos: &mut [u64]) {
        let t = self.lock();
        for ino in inos {
            if (dev, *ino) == self.root_key {
                *ino = ROOT;
            } else if let Some(id) = t.by_key.get(&(dev, *ino)) {
                *ino = *id;
            }
        }
    }

    /// Counts one lookup of the inode `key` if it has a node already
    /// (which then needs no new fd) and returns that node.
    pub fn find(&self, key: (u64, u64)) -> Option<Arc<Node>> {
        let mut t = self.lock();
        let id = *t.by_key.get(&key)?;
        let slot = t.by_id.get_mut(&id).expect("by_key and by_id agree");
        slot.refs += 1;
        Some(slot.node.clone())
    }

    /// Counts one lookup of the inode `key` whose O_PATH fd is `fd`
    /// (dropped if the inode already has a node). Returns the node.
    pub fn insert(&self, key: (u64, u64), fd: OwnedFd, kind: u32) -> FsResult<Arc<Node>> {
        let mut g = self.lock();
        let t = &mut *g;
        if let Some(&id) = t.by_key.get(&key) {
            let slot = t.by_id.get_mut(&id).expect("by_key and by_id agree");
            slot.refs += 1;
            return Ok(slot.node.clone());
        }
        if t.by_id.len() >= self.max {
            return Err(Errno::ENFILE);
        }
        // Only inodes of the mirrored directory's device keep their number.
        let own = (key.0 == self.root_key.0).then_some(key.1);
        let id = t.ids.pick(own, |id| t.by_id.contains_key(&id));
        let node = Arc::new(Node { id, fd, kind });
        t.by_id.insert(
            id,
            Slot {
                node: node.clone(),
                refs: 1,
                key,
            },
        );
        t.by_key.insert(key, id);
        Ok(node)
    }

    /// Gives back `n` lookups of `id`; the node goes when none are left
    /// (its fd closes when the last request using it finishes).
    pub fn forget(&self, id: u64, n: u64) {
        if id == ROOT {
            return;
        }
        let mut t = self.lock();
        let gone = match t.by_id.get_mut(&id) {
            Some(s) => {
                s.refs = s.refs.saturating_sub(n);
                s.refs == 0
            }
            None => false,
        };
        if gone {
            if let Some(s) = t.by_id.remove(&id) {
                t.by_key.remove(&s.key);
            }
        }
    }

    /// The device of the mirrored directory.
    pub fn root_dev(&self) -> u64 {
        self.root_key.0
    }

    /// Nodes held now (the root included).
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }
}
