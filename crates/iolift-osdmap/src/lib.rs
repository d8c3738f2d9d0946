//! Ceph's OSDMap logic, on top of the CRUSH mapper of `iolift-crush`.
//! Today the client's placement path: object name -> PG -> placement seed
//! -> OSDs (`placement`), as `OSDMap::object_locator_to_pg` and
//! `_pg_to_raw_osds` compute it (no upmap, pg_temp or primary affinity).
//! CRUSH maps inputs to devices; which input a PG uses, and which PG an
//! object falls in, is the OSDMap's business, so it lives here.

mod error;
pub mod placement;

pub use error::{OsdMapError, Result};
pub use placement::{map_object, pg_mask, pg_to_pps, stable_mod, Placement, Pool};
