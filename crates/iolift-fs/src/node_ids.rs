//! How the mirror and nfs node tables number their nodes: a file's own
//! inode number (host inode or NFS fileid) where it can be, so `stat`,
//! `readdir` and `ls -i` agree, else an id from a private range above
//! 2^63 that no inode number of the backing store is taken to reach.

use crate::model::ROOT;

/// First id of the private range.
pub const PRIVATE: u64 = 1 << 63;

/// Whether inode number `ino` can be its own node id: above the root's
/// (FUSE's 1), below the private range, and not `taken` by another node.
pub fn own_id_ok(ino: u64, taken: impl Fn(u64) -> bool) -> bool {
    ino > ROOT && ino < PRIVATE && !taken(ino)
}

/// Hands out node ids: an inode's own number where [`own_id_ok`], else
/// the next private id not taken (wrapping within the private range).
#[derive(Debug)]
pub struct NodeIds {
    next_private: u64,
}

impl Default for NodeIds {
    fn default() -> NodeIds {
        NodeIds {
            next_private: PRIVATE,
        }
    }
}

impl NodeIds {
    /// The id for a new node of inode number `ino` (`None`: the inode
    /// cannot keep its number, e.g. it is on another device). `taken`
    /// says whether an id is in use; the table is bounded below 2^63
    /// entries, so a free private id is always found.
    pub fn pick(&mut self, ino: Option<u64>, taken: impl Fn(u64) -> bool) -> u64 {
        if let Some(ino) = ino.filter(|&i| own_id_ok(i, &taken)) {
            return ino;
        }
        loop {
            let id = self.next_private;
            self.next_private = if id == u64::MAX { PRIVATE } else { id + 1 };
            if !taken(id) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn own_numbers_where_free_else_private_ids_that_wrap() {
        let mut taken: HashSet<u64> = HashSet::from([ROOT, 7, PRIVATE]);
        let mut ids = NodeIds::default();
        assert_eq!(ids.pick(Some(5), |i| taken.contains(&i)), 5);
        // Taken, the root's number, in the private range, or not offered:
        // private ids, skipping those in use.
        assert_eq!(ids.pick(Some(7), |i| taken.contains(&i)), PRIVATE + 1);
        assert_eq!(ids.pick(Some(ROOT), |i| taken.contains(&i)), PRIVATE + 2);
        assert_eq!(
            ids.pick(Some(PRIVATE + 9), |i| taken.contains(&i)),
            PRIVATE + 3
        );
        assert_eq!(ids.pick(None, |i| taken.contains(&i)), PRIVATE + 4);
        // After u64::MAX the range starts again from its bottom.
        ids.next_private = u64::MAX;
        taken.insert(PRIVATE + 1);
        assert_eq!(ids.pick(None, |i| taken.contains(&i)), u64::MAX);
        assert_eq!(ids.pick(None, |i| taken.contains(&i)), PRIVATE + 2);
        assert!(!own_id_ok(0, |_| false));
        assert!(own_id_ok(2, |_| false));
    }
}
