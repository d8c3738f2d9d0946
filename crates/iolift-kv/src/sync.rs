//! [`SyncMode`]: what the key-value store's sync does on AccelFS (its
//! own module: the environment and its file handles both use it).

/// What the engine's sync (`Write::flush` of a log, table or manifest
/// file) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// AccelFS's hard sync: the file's dirty blocks, its inode, then a
    /// device flush. The synced bytes survive a power loss (what
    /// fdatasync(2) gives on a host file system).
    #[default]
    Hard,
    /// AccelFS's soft sync: the file's dirty blocks, then its inode,
    /// each written and completed before the call returns, no device
    /// flush. The synced bytes survive the process being killed (they
    /// are in the kernel or on the device, not in this process), not a
    /// power loss: what rusty-leveldb's own POSIX environment gives,
    /// whose sync is a write(2) into the page cache without fsync.
    /// The order of the engine's syncs (a table before the manifest
    /// that names it, the manifest before CURRENT) is kept: each waits
    /// for its writes.
    Soft,
}
