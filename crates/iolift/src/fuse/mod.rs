//! FUSE front-end: one device appears as one regular file on a FUSE mount.
//!
//! The mount holds a single file (e.g. `/run/iolift/disk0/disk.img`) whose
//! size is the device size. Its reads, writes, fsync/flush and fallocate go
//! straight into the device's [`BlockDev::submit`]:
//!
//! | file operation                    | block request                     |
//! | --------------------------------- | --------------------------------- |
//! | read                              | `Read` (clamped at end of file)   |
//! | write                             | `Write` (ENOSPC past the end)     |
//! | fsync, fdatasync, flush (close)   | `Flush`                           |
//! | fallocate PUNCH_HOLE\|KEEP_SIZE   | `Trim`                            |
//! | fallocate ZERO_RANGE              | `WriteZeroes` (no_hole)           |
//! | fallocate 0 / KEEP_SIZE           | nothing (the range exists)        |
//! | truncate to another size          | EPERM                             |
//!
//! The file is opened with `FOPEN_DIRECT_IO` (the kernel page cache is
//! bypassed, so NBD clients of the same export see the same bytes) and
//! `FOPEN_PARALLEL_DIRECT_WRITES` (writes are not serialised on the inode
//! lock); `FUSE_ASYNC_DIO` lets the loop driver's asynchronous direct I/O
//! keep many requests in flight.
//!
//! Threads: the `fuser` session runs `threads` reader threads, each with its
//! own cloned `/dev/fuse` fd. A reader submits the request and polls the
//! returned future once in place: a device that completes at once (memory,
//! null) is answered from the same thread without a hand-off; otherwise the
//! future is moved to a task on the tokio runtime, which writes the reply
//! when it completes, so the reader goes straight back to `/dev/fuse`.
//!
//! Mounting ([`mount()`], in `mount.rs`): we open `/dev/fuse` and call
//! `mount(2)` ourselves (root only), then hand the fd to
//! `fuser::Session::from_fd`; no libfuse, no `fusermount3`. The file
//! system's operations are in `blockfile.rs`. Which exports `iolift serve`
//! mounts, and `iolift attach`'s loop device, are front-ends in
//! `crate::frontend::fuse`. See `docs/fuse.md`.

mod blockfile;
pub mod loopdev;
mod mount;

pub use mount::{is_our_mount, mount, open_dev_fuse, umount, FuseMount};
