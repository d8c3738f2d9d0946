//! Ceph's OSDMap, on top of the CRUSH mapper of `iolift-crush`: the full
//! binary map as Ceph 16.2 writes it (`decode`, `encode`: byte-identical
//! for an unchanged map), and placement exactly as `OSDMap` computes it:
//! object -> PG -> raw CRUSH set -> upmaps -> up set and primary (primary
//! affinity) -> acting set (pg_temp, primary_temp) (`mapping`), for every
//! PG of every pool on all cores (`bulk`). `placement` keeps the client
//! path for a bare crush map (no OSDMap).

pub mod addr;
pub mod balancer;
pub mod bulk;
pub mod codec;
pub mod create;
pub mod crush_edit;
mod decode;
pub mod diff;
mod edit;
mod encode;
mod error;
pub mod mapping;
mod osdpart;
pub mod pgdump;
pub mod placement;
pub mod pool_detail;
mod print;
pub mod types;
pub mod whatif;

pub use decode::decode;
pub use encode::encode;
pub use error::{OsdMapError, Result};
pub use mapping::{find_rule, Mapper, PgPlacement};
pub use osdpart::OsdPart;
pub use placement::{map_object, pg_mask, pg_to_pps, stable_mod, Placement, Pool};
pub use print::{fmt_utime, fmt_uuid, map_flags_string, release_name};
pub use types::{OsdMap, PgId};
