//! Ceph CRUSH on the CPU, bit-exact with Ceph 16.2 (Pacific): binary map
//! decode/encode, decompile, the mapper and a `crushtool --test` compatible
//! tester. Object -> PG -> OSD placement is OSDMap logic: `iolift-osdmap`.

mod choose;
pub mod decode;
pub mod decompile;
pub mod encode;
mod error;
pub mod hash;
pub mod ln;
mod ln_tables;
pub mod map;
pub mod mapper;
pub mod tester;

pub use decode::decode;
pub use encode::encode;
pub use error::{CrushError, Result};
pub use map::CrushMap;
pub use mapper::{do_rule, map_batch, Workspace};
