//! The nfs backend's node table: one node per server file the kernel
//! knows, keyed by the NFS fileid (the server's inode number), with the
//! names it is known by so a path to it can be built for libnfs's
//! path-based calls.
//!
//! A node's identity is its fileid, never a path: every hard link of a
//! file is the same node, and a rename through this mount moves the
//! node's name (and with a directory, every node beneath it, since each
//! node names its parent by id), so node ids stay right across renames.
//! A node keeps up to [`MAX_NAMES`] names (hard links looked up through
//! different names); a path is built from its first. A node whose last
//! known name was removed or renamed over is detached: path operations on
//! it fail with ESTALE (open files keep working through their NFS open).
//! A rename done on the server behind this mount's back is seen as a
//! stale name too: lookups check the fileid they get back.
//!
//! Node ids are fileids where they can be (so `stat`, `readdir` and
//! `ls -i` agree), except the root (FUSE's 1) and fileids that would
//! collide, which get ids from a private range above 2^63.

use crate::model::{Errno, FsResult, ROOT};
use crate::node_ids::{own_id_ok, NodeIds, PRIVATE};
use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Mutex, MutexGuard};

/// Names (hard links) remembered per node.
pub const MAX_NAMES: usize = 4;

struct Node {
    fileid: u64,
    kind: u32,
    refs: u64,
    /// (parent id, name); empty for the root and for detached nodes.
    names: Vec<(u64, OsString)>,
    /// Names of other nodes that sit in this one (keeps it in the table).
    children: u64,
}

struct Table {
    by_id: HashMap<u64, Node>,
    by_fileid: HashMap<u64, u64>,
    /// (parent id, name) -> node id, for every name of every node.
    by_name: HashMap<(u64, OsString), u64>,
    ids: NodeIds,
}

/// The table, bounded by `max` nodes (lookups beyond fail with ENFILE).
pub struct Nodes {
    t: Mutex<Table>,
    max: usize,
}

impl Nodes {
    pub fn new(root_fileid: u64, max: usize) -> Nodes {
        let mut by_id = HashMap::new();
        by_id.insert(
            ROOT,
            Node {
                fileid: root_fileid,
                kind: libc::S_IFDIR,
                refs: 1,
                names: Vec::new(),
                children: 0,
            },
        );
        let mut by_fileid = HashMap::new();
        by_fileid.insert(root_fileid, ROOT);
        Nodes {
            t: Mutex::new(Table {
                by_id,
                by_fileid,
                by_name: HashMap::new(),
                ids: NodeIds::default(),
            }),
            max: max.max(2),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.t.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The type bits of node `id` (ENOENT for an id the kernel does not
    /// hold: a stale or made-up id).
    pub fn kind(&self, id: u64) -> FsResult<u32> {
        self.lock()
            .by_id
            .get(&id)
            .map(|n| n.kind)
            .ok_or(Errno::ENOENT)
    }

    /// The fileid of node `id`.
    pub fn fileid(&self, id: u64) -> FsResult<u64> {
        self.lock()
            .by_id
            .get(&id)
            .map(|n| n.fileid)
            .ok_or(Errno::ENOENT)
    }

    /// The path of node `id` beneath the export (`/` for the root).
    pub fn path(&self, id: u64) -> FsResult<CString> {
        let t = self.lock();
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = id;
        while cur != ROOT {
            let n = t.by_id.get(&cur).ok_or(Errno::ENOENT)?;
            let (p, name) = n.names.first().ok_or(Errno(libc::ESTALE))?;
            parts.push(name);
            cur = *p;
            if parts.len() > 4096 {
                return Err(Errno::ELOOP);
            }
        }
        let mut b = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum::<usize>() + 1);
        for p in parts.iter().rev() {
            b.push(b'/');
            b.extend_from_slice(p.as_bytes());
        }
        if b.is_empty() {
            b.push(b'/');
        }
        CString::new(b).map_err(|_| Errno::EINVAL)
    }

    /// The path of `name` in directory node `parent`.
    pub fn child_path(&self, parent: u64, name: &OsStr) -> FsResult<CString> {
        let p = self.path(parent)?;
        let mut b = p.into_bytes();
        if b != b"/" {
            b.push(b'/');
        }
        b.extend_from_slice(name.as_bytes());
        CString::new(b).map_err(|_| Errno::EINVAL)
    }

    /// The id that fileid has or would get, as readdir shows it.
    pub fn id_for(&self, fileid: u64) -> u64 {
        let t = self.lock();
        match t.by_fileid.get(&fileid) {
            Some(&id) => id,
            None if own_id_ok(fileid, |id| t.by_id.contains_key(&id)) => fileid,
            None => PRIVATE - 1,
        }
    }

    /// Counts one lookup of the file `fileid` found as `name` in `parent`.
    pub fn insert(&self, parent: u64, name: &OsStr, fileid: u64, kind: u32) -> FsResult<u64> {
        let mut t = self.lock();
        if !t.by_id.contains_key(&parent) {
            return Err(Errno::ENOENT);
        }
        if let Some(&id) = t.by_fileid.get(&fileid) {
            if id == ROOT {
                return Err(Errno::ELOOP);
            }
            let has = {
                let n = t.by_id.get_mut(&id).expect("by_fileid and by_id agree");
                n.refs += 1;
                n.kind = kind;
                n.names.iter().any(|(p, s)| *p == parent && s == name)
            };
            if !has {
                add_name(&mut t, id, parent, name);
            }
            return Ok(id);
        }
        if t.by_id.len() >= self.max {
            return Err(Errno::ENFILE);
        }
        let t = &mut *t;
        let id = t.ids.pick(Some(fileid), |id| t.by_id.contains_key(&id));
        t.by_id.insert(
            id,
            Node {
                fileid,
                kind,
                refs: 1,
                names: Vec::new(),
                children: 0,
            },
        );
        t.by_fileid.insert(fileid, id);
        add_name(t, id, parent, name);
        Ok(id)
    }

    /// Gives back `n` lookups of `id`; the node goes when none are left
    /// and no other node sits in it.
    pub fn forget(&self, id: u64, n: u64) {
        if id == ROOT {
            return;
        }
        let mut t = self.lock();
        if let Some(node) = t.by_id.get_mut(&id) {
            node.refs = node.refs.saturating_sub(n);
        }
        reap(&mut t, id);
    }

    /// `name` in `parent` is gone (unlink, rmdir): the node known by it
    /// loses that name.
    pub fn removed(&self, parent: u64, name: &OsStr) {
        let mut t = self.lock();
        if let Some(id) = named(&t, parent, name) {
            drop_name(&mut t, id, parent, name);
            reap(&mut t, id);
        }
    }

    /// `name` in `parent` was renamed to `newname` in `newparent` (and
    /// what was there before lost that name).
    pub fn renamed(&self, parent: u64, name: &OsStr, newparent: u64, newname: &OsStr) {
        let mut t = self.lock();
        let moved = named(&t, parent, name);
        if let Some(old) = named(&t, newparent, newname) {
            if Some(old) != moved {
                drop_name(&mut t, old, newparent, newname);
                reap(&mut t, old);
            }
        }
        if let Some(id) = moved {
            drop_name(&mut t, id, parent, name);
            add_name(&mut t, id, newparent, newname);
        }
    }

    /// Nodes held now (the root included).
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }
}

fn named(t: &Table, parent: u64, name: &OsStr) -> Option<u64> {
    t.by_name.get(&(parent, name.to_os_string())).copied()
}

fn add_name(t: &mut Table, id: u64, parent: u64, name: &OsStr) {
    let Some(n) = t.by_id.get_mut(&id) else {
        return;
    };
    let dropped = if n.names.len() >= MAX_NAMES {
        Some(n.names.remove(MAX_NAMES - 1))
    } else {
        None
    };
    // The newest name goes first: it is the one the kernel used last.
    n.names.insert(0, (parent, name.to_os_string()));
    if let Some(p) = t.by_id.get_mut(&parent) {
        p.children += 1;
    }
    // A name belongs to one node: one that had it loses it.
    if let Some(prev) = t.by_name.insert((parent, name.to_os_string()), id) {
        if prev != id {
            if let Some(pn) = t.by_id.get_mut(&prev) {
                let before = pn.names.len();
                pn.names.retain(|(p, s)| !(*p == parent && s == name));
                if pn.names.len() < before {
                    if let Some(pp) = t.by_id.get_mut(&parent) {
                        pp.children = pp.children.saturating_sub(1);
                    }
                }
            }
            reap(t, prev);
        }
    }
    if let Some((p, s)) = dropped {
        if t.by_name.get(&(p, s.clone())) == Some(&id) {
            t.by_name.remove(&(p, s));
        }
        if let Some(pn) = t.by_id.get_mut(&p) {
            pn.children = pn.children.saturating_sub(1);
        }
        reap(t, p);
    }
}

fn drop_name(t: &mut Table, id: u64, parent: u64, name: &OsStr) {
    let Some(n) = t.by_id.get_mut(&id) else {
        return;
    };
    let before = n.names.len();
    n.names.retain(|(p, s)| !(*p == parent && s == name));
    if n.names.len() < before {
        let key = (parent, name.to_os_string());
        if t.by_name.get(&key) == Some(&id) {
            t.by_name.remove(&key);
        }
        if let Some(p) = t.by_id.get_mut(&parent) {
            p.children = p.children.saturating_sub(1);
        }
        reap(t, parent);
    }
}

/// Removes node `id` if nothing holds it, then its parents in turn.
fn reap(t: &mut Table, id: u64) {
    let mut cur = id;
    loop {
        if cur == ROOT {
            return;
        }
        let gone = t
            .by_id
            .get(&cur)
            .is_some_and(|n| n.refs == 0 && n.children == 0);
        if !gone {
            return;
        }
        let n = t.by_id.remove(&cur).expect("checked above");
        t.by_fileid.remove(&n.fileid);
        let mut next = None;
        for (p, s) in &n.names {
            let key = (*p, s.clone());
            if t.by_name.get(&key) == Some(&cur) {
                t.by_name.remove(&key);
            }
            if let Some(pn) = t.by_id.get_mut(p) {
                pn.children = pn.children.saturating_sub(1);
                next = Some(*p);
            }
        }
        // Every parent but the last is reaped by recursion; the last by
        // the loop (a node has at most MAX_NAMES names).
        let parents: Vec<u64> = n.names.iter().map(|(p, _)| *p).collect();
        for p in parents.iter().filter(|&&p| Some(p) != next) {
            reap(t, *p);
        }
        match next {
            Some(p) => cur = p,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> &OsStr {
        OsStr::new(x)
    }

    #[test]
    fn paths_follow_renames_and_links_and_nodes_go_when_forgotten() {
        let n = Nodes::new(500, 100);
        assert_eq!(n.path(ROOT).unwrap().to_bytes(), b"/");
        let d = n.insert(ROOT, s("d"), 10, libc::S_IFDIR).unwrap();
        let f = n.insert(d, s("f"), 11, libc::S_IFREG).unwrap();
        assert_eq!((d, f), (10, 11));
        assert_eq!(n.path(f).unwrap().to_bytes(), b"/d/f");
        n.renamed(ROOT, s("d"), ROOT, s("e"));
        assert_eq!(n.path(f).unwrap().to_bytes(), b"/e/f");
        // A hard link: the same node, the newest name first.
        assert_eq!(n.insert(ROOT, s("g"), 11, libc::S_IFREG).unwrap(), f);
        assert_eq!(n.path(f).unwrap().to_bytes(), b"/g");
        n.removed(ROOT, s("g"));
        assert_eq!(n.path(f).unwrap().to_bytes(), b"/e/f");
        n.removed(d, s("f"));
        assert_eq!(n.path(f), Err(Errno(libc::ESTALE)));
        // The root's own fileid and collisions get private ids.
        assert_eq!(
            n.insert(ROOT, s("x"), 500, libc::S_IFDIR),
            Err(Errno::ELOOP)
        );
        let one = n.insert(ROOT, s("one"), 1, libc::S_IFREG).unwrap();
        assert!(one >= PRIVATE);
        n.forget(f, 2);
        assert_eq!(n.kind(f), Err(Errno::ENOENT));
        n.forget(one, 1);
        assert_eq!(n.len(), 2);
        n.forget(d, 1);
        assert_eq!(n.len(), 1);
    }

    #[test]
    fn a_parent_stays_while_a_child_is_held_and_the_table_is_bounded() {
        let n = Nodes::new(2, 3);
        let d = n.insert(ROOT, s("d"), 10, libc::S_IFDIR).unwrap();
        let f = n.insert(d, s("f"), 11, libc::S_IFREG).unwrap();
        assert_eq!(
            n.insert(ROOT, s("z"), 12, libc::S_IFREG),
            Err(Errno::ENFILE)
        );
        n.forget(d, 1);
        assert_eq!(n.path(f).unwrap().to_bytes(), b"/d/f");
        n.forget(f, 1);
        assert_eq!(n.len(), 1);
        // Renaming over a held node detaches it.
        let a = n.insert(ROOT, s("a"), 20, libc::S_IFREG).unwrap();
        let b = n.insert(ROOT, s("b"), 21, libc::S_IFREG).unwrap();
        n.renamed(ROOT, s("a"), ROOT, s("b"));
        assert_eq!(n.path(a).unwrap().to_bytes(), b"/b");
        assert_eq!(n.path(b), Err(Errno(libc::ESTALE)));
    }
}
