//! The decoded OSDMap: the fields placement needs, parsed; everything
//! else kept as the exact bytes it was read from, so that encoding an
//! unchanged map gives back the input byte for byte.

use crate::{OsdMapError, Result};
use iolift_crush::CrushMap;
use std::collections::BTreeMap;
use std::fmt;

/// `CEPH_OSD_EXISTS`, `CEPH_OSD_UP` (osd_state bits).
pub const OSD_EXISTS: u32 = 1;
pub const OSD_UP: u32 = 2;
/// Reweight values: 0x10000 is fully in, 0 is out.
pub const OSD_IN: u32 = 0x10000;
pub const OSD_OUT: u32 = 0;
/// Primary affinity: 0x10000 is the default (and the maximum).
pub const DEFAULT_PRIMARY_AFFINITY: u32 = 0x10000;
/// `pg_pool_t` types.
pub const POOL_REPLICATED: u8 = 1;
pub const POOL_ERASURE: u8 = 3;
/// `pg_pool_t::FLAG_HASHPSPOOL`.
pub const FLAG_HASHPSPOOL: u64 = 1;
/// Placeholder for an empty slot of an erasure-coded set.
pub const ITEM_NONE: i32 = iolift_crush::map::ITEM_NONE;

/// A placement group id: pool and seed (`pg_t`; `m_preferred` is always -1
/// on the wire). Ordered as Ceph orders them: pool, then seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgId {
    pub pool: u64,
    pub seed: u32,
}

impl fmt::Display for PgId {
    /// `1.1f`: pool in decimal, seed in hex, as Ceph prints a pg_t.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:x}", self.pool as i64, self.seed)
    }
}

impl std::str::FromStr for PgId {
    type Err = OsdMapError;
    fn from_str(s: &str) -> Result<PgId> {
        let bad = || OsdMapError::Invalid(format!("bad pg id '{s}' (want POOL.SEEDHEX)"));
        let (p, x) = s.split_once('.').ok_or_else(bad)?;
        let pool: u64 = p.parse().map_err(|_| bad())?;
        let seed = u32::from_str_radix(x, 16).map_err(|_| bad())?;
        Ok(PgId { pool, seed })
    }
}

/// Seconds and nanoseconds (`utime_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UTime {
    pub sec: u32,
    pub nsec: u32,
}

/// A pool (`pg_pool_t`): the fields placement reads, plus the struct's
/// full encoding. The fields are written back over the encoding at the
/// positions they were read from, so changing one re-encodes correctly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub id: i64,
    pub name: String,
    pub pool_type: u8,
    pub size: u8,
    pub crush_rule: u8,
    pub object_hash: u8,
    pub pg_num: u32,
    pub pgp_num: u32,
    pub last_change: u32,
    pub flags: u64,
    pub min_size: u8,
    /// The pool's encoding as read (header included).
    pub(crate) raw: Vec<u8>,
    /// Offsets in `raw` of the flags (and their width) and of min_size.
    pub(crate) flags_at: (usize, usize),
    pub(crate) min_size_at: usize,
}

impl Pool {
    pub fn is_erasure(&self) -> bool {
        self.pool_type == POOL_ERASURE
    }

    /// Replicated pools drop missing OSDs and shift the rest left
    /// (`can_shift_osds`); erasure pools keep positions (holes are NONE).
    pub fn can_shift_osds(&self) -> bool {
        self.pool_type == POOL_REPLICATED
    }

    pub fn hashpspool(&self) -> bool {
        self.flags & FLAG_HASHPSPOOL != 0
    }

    pub fn type_name(&self) -> &'static str {
        match self.pool_type {
            POOL_REPLICATED => "replicated",
            POOL_ERASURE => "erasure",
            _ => "???",
        }
    }
}

/// A decoded full OSDMap (the Ceph 16.2 encoding).
#[derive(Debug, Clone, PartialEq)]
pub struct OsdMap {
    pub fsid: [u8; 16],
    pub epoch: u32,
    pub created: UTime,
    pub modified: UTime,
    /// Pools by id, with their names (`pool_name`) filled in.
    pub pools: BTreeMap<i64, Pool>,
    pub pool_max: i32,
    pub flags: u32,
    pub max_osd: i32,
    /// Per OSD: state bits (`OSD_EXISTS`, `OSD_UP`, ...), reweight (16.16).
    pub osd_state: Vec<u32>,
    pub osd_weight: Vec<u32>,
    pub pg_temp: BTreeMap<PgId, Vec<i32>>,
    pub primary_temp: BTreeMap<PgId, i32>,
    /// Empty when the map carries none (every OSD at the default).
    pub primary_affinity: Vec<u32>,
    pub crush: CrushMap,
    pub pg_upmap: BTreeMap<PgId, Vec<i32>>,
    pub pg_upmap_items: BTreeMap<PgId, Vec<(i32, i32)>>,
    pub crush_version: i32,
    pub(crate) enc: Encoding,
}

/// What is carried through unparsed, and the versions read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Encoding {
    pub wrapper_v: (u8, u8),
    pub client_v: (u8, u8),
    /// Pool names as encoded (a name may exist without a pool).
    pub pool_names: Vec<(i64, String)>,
    /// `client_addrs`: count and entries, as read.
    pub client_addrs: Vec<u8>,
    /// The crush map's bytes as read; `None` once the map was changed.
    pub crush_raw: Option<Vec<u8>>,
    pub ec_profiles: Vec<u8>,
    /// Client fields after crush_version (removed/purged snaps, last
    /// up/in change, ...).
    pub client_tail: Vec<u8>,
    /// The whole osd-only struct (header included).
    pub osd_part: Vec<u8>,
    /// Bytes inside the wrapper after the crc.
    pub wrapper_tail: Vec<u8>,
}

impl OsdMap {
    pub fn exists(&self, osd: i32) -> bool {
        osd >= 0 && osd < self.max_osd && self.state(osd) & OSD_EXISTS != 0
    }

    pub fn is_up(&self, osd: i32) -> bool {
        self.exists(osd) && self.state(osd) & OSD_UP != 0
    }

    pub fn is_down(&self, osd: i32) -> bool {
        !self.is_up(osd)
    }

    /// Reweight of an OSD (0 for ids outside the map).
    pub fn weight(&self, osd: i32) -> u32 {
        if osd < 0 {
            return 0;
        }
        self.osd_weight.get(osd as usize).copied().unwrap_or(0)
    }

    pub fn is_out(&self, osd: i32) -> bool {
        !self.exists(osd) || self.weight(osd) == OSD_OUT
    }

    pub fn is_in(&self, osd: i32) -> bool {
        !self.is_out(osd)
    }

    fn state(&self, osd: i32) -> u32 {
        self.osd_state.get(osd as usize).copied().unwrap_or(0)
    }

    pub fn primary_affinity_of(&self, osd: i32) -> u32 {
        if osd < 0 {
            return DEFAULT_PRIMARY_AFFINITY;
        }
        self.primary_affinity
            .get(osd as usize)
            .copied()
            .unwrap_or(DEFAULT_PRIMARY_AFFINITY)
    }

    /// Replace the crush map (as `--import-crush` does); it is re-encoded
    /// from the model on the next `encode`.
    pub fn set_crush(&mut self, crush: CrushMap) {
        self.crush = crush;
        self.enc.crush_raw = None;
    }

    /// Use these exact bytes for the crush map (they must decode to `crush`).
    pub fn set_crush_bytes(&mut self, crush: CrushMap, raw: Vec<u8>) {
        self.crush = crush;
        self.enc.crush_raw = Some(raw);
    }

    /// The crush map as encoded in this OSDMap.
    pub fn crush_bytes(&self) -> Vec<u8> {
        match &self.enc.crush_raw {
            Some(b) => b.clone(),
            None => iolift_crush::encode(&self.crush),
        }
    }

    pub fn pool_by_name(&self, name: &str) -> Option<&Pool> {
        self.pools.values().find(|p| p.name == name)
    }
}
