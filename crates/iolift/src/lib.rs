//! iolift: a user-space block I/O stack with accelerator offload.
//!
//! Layers, top to bottom (see `docs/design.md`):
//! - front-ends ([`frontend`]: [`nbd`], [`fuse`]) turn wire requests into
//!   [`block::Request`]s on the [`export`]s' devices;
//! - stages ([`stage`]) wrap a device and add caching, scheduling, stats;
//! - backends ([`backend`]) store the data.

pub mod backend;
pub mod block;
pub mod ceph;
pub mod cli;
pub mod config;
pub mod export;
pub mod frontend;
pub mod fuse;
pub mod metrics;
pub mod nbd;
pub mod spec;
pub mod stage;
pub mod ublk;
pub mod util;
