//! Direct storage access for iolift (HAYAGUI's shape, with io_uring as the
//! direct I/O engine).
//!
//! - [`target`]: open a raw block device or an image file, with O_DIRECT
//!   where the file system allows it;
//! - [`buf`]: aligned buffers, the registered-buffer pool, the page-locking
//!   hook for a GPU;
//! - [`engine`]: the io_uring engine (registered file and buffers, optional
//!   SQPOLL and IOPOLL, batched submissions, completions as bytes / 0 /
//!   -errno);
//! - [`fs`]: AccelFS, a small file system with a per-file buffer cache on
//!   the engine (mkfs, fsck, files and directories, soft and hard sync);
//! - [`stream`]: the streaming application (a FASTA-like file read in
//!   chunks, records and lines counted);
//! - [`lat`]: request latency in a tight loop (engine, POSIX, AccelFS);
//! - [`blockhash`]: the block-number hasher of the block caches.
//!
//! See docs/direct.md.

pub mod blockhash;
pub mod buf;
pub mod engine;
pub mod fs;
pub mod lat;
mod slot;
pub mod stream;
pub mod target;

pub use buf::{AlignedBuf, Buf, FixedBuf, FixedPool, PinHook, SharedBytes, ALIGN};
pub use engine::{Callback, Config, Done, Engine, Op, Stats};
pub use slot::Pending;
pub use target::{Direct, Open, Target};
