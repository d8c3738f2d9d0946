//! Write-behind, for a file written from its start to its end and synced
//! once at the end (the key-value store's tables): as soon as a run of
//! whole dirty blocks lies behind the write point, it is started on the
//! disk without waiting, through the same path as an eviction's
//! write-back (inflight.rs: new blocks marked used first, the data
//! started, the pointers written once it landed). The disk writes while
//! the caller goes on computing, and the sync at the end waits only for
//! the last run, the tail, the pointers and the inode, where without it
//! the whole file is written (and waited for) at the sync. The blocks
//! stay cached, clean.
//!
//! Memory: nothing beyond the write-back's own copies, one run (at most
//! [`WRITE_RUN_MAX`] bytes) out at a time.
//!
//! The crash order is that of any write-back: what a killed process
//! leaves is consistent, the size on disk grows only at a sync (rule 5),
//! so bytes written behind and never synced are not the file's.

use super::writeback::WRITE_RUN_MAX;
use super::{File, Fs};
use std::io;

impl Fs {
    /// Turns write-behind on for `f`, with runs of `blocks` blocks (at
    /// most [`WRITE_RUN_MAX`] bytes' worth; 0 turns it off), counted from
    /// its size now.
    pub fn set_write_behind(&self, f: &mut File, blocks: usize) {
        let bs = self.dev.bs as u64;
        f.behind = blocks.min(WRITE_RUN_MAX / self.dev.bs);
        f.behind_next = f.inode.size / bs;
    }

    /// After a write that ended at `end`: starts the dirty blocks below
    /// the block holding `end` that write-behind has not looked at yet,
    /// once there are at least a run of them.
    pub(super) fn write_behind(&mut self, f: &mut File, end: u64) -> io::Result<()> {
        let upto = end / self.dev.bs as u64;
        if upto < f.behind_next + f.behind as u64 {
            return Ok(());
        }
        let blocks: Vec<u64> = (f.behind_next..upto)
            .filter(|&b| f.cache.is_dirty(b))
            .collect();
        f.behind_next = upto;
        if blocks.is_empty() {
            return Ok(());
        }
        self.write_back_batch(f, blocks, false)
    }
}
