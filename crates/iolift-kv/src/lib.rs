//! A key-value store on AccelFS, as HAYAGUI ported LevelDB onto its file
//! system: the LSM engine is rusty-leveldb, whose storage environment
//! (the `Env` trait) is implemented here on iolift-direct's file system.
//!
//! - [`env`]: [`AccelEnv`], the environment on AccelFS (files through the
//!   per-file buffer cache; a sync is AccelFS's hard sync, or its soft
//!   sync with [`SyncMode::Soft`]);
//! - [`posix`]: [`PosixSyncEnv`], the engine's own POSIX environment with
//!   a sync that is fdatasync(2) (for comparisons of equal durability);
//! - [`bench`]: db_bench's workloads and report lines;
//! - [`logcheck`]: the write-ahead logs checked before a database opens
//!   (the engine drops a damaged log's tail without a word);
//! - [`tablecheck`]: the tables checked before a dump (the engine skips
//!   a damaged block without a word).
//!
//! See docs/kv.md.

pub mod bench;
pub mod env;
mod handle;
pub mod logcheck;
pub mod posix;
mod sync;
pub mod tablecheck;

pub use env::{AccelEnv, EnvConfig, SyncMode, KV_CACHE_BLOCKS, KV_WRITE_BEHIND};
pub use posix::PosixSyncEnv;
