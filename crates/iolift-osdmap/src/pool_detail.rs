//! Every field of a pool (`pg_pool_t`, struct versions 27..=29), read
//! from the encoding kept at decode time, and the pool line `osdmaptool
//! --print` shows (`pool 1 'rbd' replicated size 3 ...`). Placement needs
//! only the leading fields (`types::Pool`); this is for reports.

use crate::codec::Reader;
use crate::types::{Pool, UTime, POOL_ERASURE};
use crate::Result;
use iolift_crush::tester::fmt_g;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A pool snapshot (`pool_snap_info_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSnap {
    pub id: u64,
    pub stamp: UTime,
    pub name: String,
}

/// A pool option value (`pool_opts_t`): string, integer or double.
#[derive(Debug, Clone, PartialEq)]
pub enum OptValue {
    Str(String),
    Int(i64),
    Double(f64),
}

/// The printed fields of `pg_pool_t`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolDetail {
    pub struct_v: u8,
    pub snap_seq: u64,
    pub snaps: Vec<PoolSnap>,
    /// `removed_snaps` intervals (start, length).
    pub removed_snaps: Vec<(u64, u64)>,
    pub auid: u64,
    pub quota_max_bytes: u64,
    pub quota_max_objects: u64,
    pub tiers: Vec<u64>,
    pub tier_of: i64,
    pub cache_mode: u8,
    pub read_tier: i64,
    pub write_tier: i64,
    /// `HitSet::Params` type (0 none, 1 explicit_hash, 2 explicit_object, 3 bloom).
    pub hit_set_type: u8,
    pub hit_set_period: u32,
    pub hit_set_count: u32,
    pub stripe_width: u32,
    pub target_max_bytes: u64,
    pub target_max_objects: u64,
    pub erasure_code_profile: String,
    pub lfor_preluminous: u32,
    pub min_read_recency_for_promote: u32,
    pub expected_num_objects: u64,
    pub min_write_recency_for_promote: u32,
    pub fast_read: bool,
    pub hit_set_grade_decay_rate: u32,
    pub hit_set_search_last_n: u32,
    /// Options by key number.
    pub opts: BTreeMap<i32, OptValue>,
    pub lfor_prenautilus: u32,
    pub application_metadata: BTreeMap<String, BTreeMap<String, String>>,
    pub create_time: UTime,
    pub pg_num_target: u32,
    pub pgp_num_target: u32,
    pub pg_num_pending: u32,
    pub last_force_op_resend: u32,
    /// 0 off, 1 warn, 2 on, 255 unknown.
    pub pg_autoscale_mode: u8,
}

/// `pool_opts_t` key numbers and names, as Ceph 16.2 numbers them.
const OPT_NAMES: &[(i32, &str)] = &[
    (0, "scrub_min_interval"),
    (1, "scrub_max_interval"),
    (2, "deep_scrub_interval"),
    (3, "recovery_priority"),
    (4, "recovery_op_priority"),
    (5, "scrub_priority"),
    (6, "compression_mode"),
    (7, "compression_algorithm"),
    (8, "compression_required_ratio"),
    (9, "compression_max_blob_size"),
    (10, "compression_min_blob_size"),
    (11, "csum_type"),
    (12, "csum_max_block"),
    (13, "csum_min_block"),
    (14, "fingerprint_algorithm"),
    (15, "pg_num_min"),
    (16, "target_size_bytes"),
    (17, "target_size_ratio"),
    (18, "pg_autoscale_bias"),
    (19, "read_lease_interval"),
    (20, "dedup_tier"),
    (21, "dedup_chunk_algorithm"),
    (22, "dedup_cdc_chunk_size"),
    (23, "pg_num_max"),
];

/// `pg_pool_t::FLAG_*` names by bit, as `get_flags_string` prints them.
const FLAG_NAMES: &[&str] = &[
    "hashpspool",
    "full",
    "ec_overwrites",
    "incomplete_clones",
    "nodelete",
    "nopgchange",
    "nosizechange",
    "write_fadvise_dontneed",
    "noscrub",
    "nodeep-scrub",
    "full_quota",
    "nearfull",
    "backfillfull",
    "selfmanaged_snaps",
    "pool_snaps",
    "creating",
    "eio",
    "bulk",
];

fn utime(r: &mut Reader, field: &str) -> Result<UTime> {
    Ok(UTime {
        sec: r.u32(field)?,
        nsec: r.u32(field)?,
    })
}

fn string_map(r: &mut Reader, field: &str) -> Result<BTreeMap<String, String>> {
    let n = r.count(field, 8)?;
    let mut m = BTreeMap::new();
    for _ in 0..n {
        let k = r.string(field)?;
        m.insert(k, r.string(field)?);
    }
    Ok(m)
}

fn opts(r: &mut Reader) -> Result<BTreeMap<i32, OptValue>> {
    let (_, _, mut o) = r.header("pool opts")?;
    let n = o.count("pool opts", 8)?;
    let mut m = BTreeMap::new();
    for _ in 0..n {
        let key = o.i32("pool opts key")?;
        let at = o.offset();
        let v = match o.i32("pool opts type")? {
            0 => OptValue::Str(o.string("pool opts value")?),
            1 => OptValue::Int(o.i64("pool opts value")?),
            2 => OptValue::Double(f64::from_bits(o.u64("pool opts value")?)),
            t => return Err(o.corrupt(at, "pool opts type", format!("type {t}"))),
        };
        m.insert(key, v);
    }
    Ok(m)
}

impl PoolDetail {
    /// Read every field of the pool's kept encoding.
    pub fn read(pool: &Pool) -> Result<PoolDetail> {
        let field = format!("pool {}", pool.id);
        let mut top = Reader::new(&pool.raw);
        let (v, _, mut p) = top.header(&field)?;
        let mut d = PoolDetail {
            struct_v: v,
            ..PoolDetail::default()
        };
        p.take(4 + 4 + 4 + 4 + 4, "pool type..lpgp_num")?;
        p.u32("pool last_change")?;
        d.snap_seq = p.u64("pool snap_seq")?;
        p.u32("pool snap_epoch")?;
        let n = p.count("pool snaps", 9)?;
        for _ in 0..n {
            p.u64("pool snap id")?;
            let (_, _, mut s) = p.header("pool snap info")?;
            let id = s.u64("pool snap id")?;
            let stamp = utime(&mut s, "pool snap stamp")?;
            let name = s.string("pool snap name")?;
            d.snaps.push(PoolSnap { id, stamp, name });
        }
        let n = p.count("pool removed_snaps", 16)?;
        for _ in 0..n {
            d.removed_snaps
                .push((p.u64("pool removed_snaps")?, p.u64("pool removed_snaps")?));
        }
        d.auid = p.u64("pool auid")?;
        p.u64("pool flags")?;
        p.u32("pool crash_replay_interval")?;
        p.u8("pool min_size")?;
        d.quota_max_bytes = p.u64("pool quota_max_bytes")?;
        d.quota_max_objects = p.u64("pool quota_max_objects")?;
        let n = p.count("pool tiers", 8)?;
        for _ in 0..n {
            d.tiers.push(p.u64("pool tiers")?);
        }
        d.tier_of = p.i64("pool tier_of")?;
        d.cache_mode = p.u8("pool cache_mode")?;
        d.read_tier = p.i64("pool read_tier")?;
        d.write_tier = p.i64("pool write_tier")?;
        string_map(&mut p, "pool properties")?;
        let (_, _, mut h) = p.header("pool hit_set_params")?;
        d.hit_set_type = h.u8("pool hit_set_params type")?;
        d.hit_set_period = p.u32("pool hit_set_period")?;
        d.hit_set_count = p.u32("pool hit_set_count")?;
        d.stripe_width = p.u32("pool stripe_width")?;
        d.target_max_bytes = p.u64("pool target_max_bytes")?;
        d.target_max_objects = p.u64("pool target_max_objects")?;
        p.take(16, "pool cache ratios and ages")?;
        d.erasure_code_profile = p.string("pool erasure_code_profile")?;
        d.lfor_preluminous = p.u32("pool last_force_op_resend_preluminous")?;
        d.min_read_recency_for_promote = p.u32("pool min_read_recency_for_promote")?;
        d.expected_num_objects = p.u64("pool expected_num_objects")?;
        p.u32("pool cache_target_dirty_high_ratio_micro")?;
        d.min_write_recency_for_promote = p.u32("pool min_write_recency_for_promote")?;
        p.u8("pool use_gmt_hitset")?;
        d.fast_read = p.u8("pool fast_read")? != 0;
        d.hit_set_grade_decay_rate = p.u32("pool hit_set_grade_decay_rate")?;
        d.hit_set_search_last_n = p.u32("pool hit_set_search_last_n")?;
        d.opts = opts(&mut p)?;
        d.lfor_prenautilus = p.u32("pool last_force_op_resend_prenautilus")?;
        let n = p.count("pool application_metadata", 8)?;
        for _ in 0..n {
            let k = p.string("pool application_metadata")?;
            let m = string_map(&mut p, "pool application_metadata")?;
            d.application_metadata.insert(k, m);
        }
        d.create_time = utime(&mut p, "pool create_time")?;
        if v >= 28 {
            d.pg_num_target = p.u32("pool pg_num_target")?;
            d.pgp_num_target = p.u32("pool pgp_num_target")?;
            d.pg_num_pending = p.u32("pool pg_num_pending")?;
            p.take(8, "pool old merge epochs")?;
            d.last_force_op_resend = p.u32("pool last_force_op_resend")?;
            d.pg_autoscale_mode = p.u8("pool pg_autoscale_mode")?;
        } else {
            d.pg_num_target = pool.pg_num;
            d.pgp_num_target = pool.pgp_num;
            d.pg_num_pending = pool.pg_num;
            d.last_force_op_resend = d.lfor_prenautilus;
            d.pg_autoscale_mode = 1;
        }
        Ok(d)
    }
}

/// `pg_pool_t::get_flags_string`.
pub fn pool_flags_string(flags: u64) -> String {
    let mut s = String::new();
    for bit in 0..64 {
        if flags & (1u64 << bit) != 0 {
            if !s.is_empty() {
                s.push(',');
            }
            s.push_str(FLAG_NAMES.get(bit).copied().unwrap_or("???"));
        }
    }
    s
}

fn join<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The text after `pool ID 'NAME' ` on a `--print` pool line
/// (`operator<<(ostream&, const pg_pool_t&)`).
pub fn pool_line(p: &Pool, d: &PoolDetail) -> String {
    let mut o = String::with_capacity(256);
    o.push_str(p.type_name());
    if p.pool_type == POOL_ERASURE {
        let _ = write!(o, " profile {}", d.erasure_code_profile);
    }
    let hash = match p.object_hash {
        1 => "linux",
        2 => "rjenkins",
        _ => "???",
    };
    let _ = write!(
        o,
        " size {} min_size {} crush_rule {} object_hash {hash} pg_num {} pgp_num {}",
        p.size, p.min_size, p.crush_rule, p.pg_num, p.pgp_num
    );
    if d.pg_num_target != p.pg_num {
        let _ = write!(o, " pg_num_target {}", d.pg_num_target);
    }
    if d.pgp_num_target != p.pgp_num {
        let _ = write!(o, " pgp_num_target {}", d.pgp_num_target);
    }
    if d.pg_num_pending != p.pg_num {
        let _ = write!(o, " pg_num_pending {}", d.pg_num_pending);
    }
    let mode = match d.pg_autoscale_mode {
        0 => Some("off"),
        1 => Some("warn"),
        2 => Some("on"),
        255 => None,
        _ => Some("???"),
    };
    if let Some(m) = mode {
        let _ = write!(o, " autoscale_mode {m}");
    }
    let _ = write!(o, " last_change {}", p.last_change);
    if d.last_force_op_resend != 0 || d.lfor_prenautilus != 0 || d.lfor_preluminous != 0 {
        let _ = write!(
            o,
            " lfor {}/{}/{}",
            d.last_force_op_resend, d.lfor_prenautilus, d.lfor_preluminous
        );
    }
    if d.auid != 0 {
        let _ = write!(o, " owner {}", d.auid);
    }
    if p.flags != 0 {
        let _ = write!(o, " flags {}", pool_flags_string(p.flags));
    }
    if d.quota_max_bytes != 0 {
        let _ = write!(o, " max_bytes {}", d.quota_max_bytes);
    }
    if d.quota_max_objects != 0 {
        let _ = write!(o, " max_objects {}", d.quota_max_objects);
    }
    if !d.tiers.is_empty() {
        let _ = write!(o, " tiers {}", join(&d.tiers));
    }
    if d.tier_of >= 0 {
        let _ = write!(o, " tier_of {}", d.tier_of);
    }
    if d.read_tier >= 0 {
        let _ = write!(o, " read_tier {}", d.read_tier);
    }
    if d.write_tier >= 0 {
        let _ = write!(o, " write_tier {}", d.write_tier);
    }
    if d.cache_mode != 0 {
        let name = match d.cache_mode {
            1 => "writeback",
            2 => "forward",
            3 => "readonly",
            4 => "readforward",
            5 => "readproxy",
            6 => "proxy",
            _ => "unknown",
        };
        let _ = write!(o, " cache_mode {name}");
    }
    if d.target_max_bytes != 0 {
        let _ = write!(o, " target_bytes {}", d.target_max_bytes);
    }
    if d.target_max_objects != 0 {
        let _ = write!(o, " target_objects {}", d.target_max_objects);
    }
    if d.hit_set_type != 0 {
        let name = match d.hit_set_type {
            1 => "explicit_hash",
            2 => "explicit_object",
            3 => "bloom",
            _ => "???",
        };
        let _ = write!(
            o,
            " hit_set {name} {}s x{} decay_rate {} search_last_n {}",
            d.hit_set_period, d.hit_set_count, d.hit_set_grade_decay_rate, d.hit_set_search_last_n
        );
    }
    if d.min_read_recency_for_promote != 0 {
        let _ = write!(
            o,
            " min_read_recency_for_promote {}",
            d.min_read_recency_for_promote
        );
    }
    if d.min_write_recency_for_promote != 0 {
        let _ = write!(
            o,
            " min_write_recency_for_promote {}",
            d.min_write_recency_for_promote
        );
    }
    let _ = write!(o, " stripe_width {}", d.stripe_width);
    if d.expected_num_objects != 0 {
        let _ = write!(o, " expected_num_objects {}", d.expected_num_objects);
    }
    if d.fast_read {
        o.push_str(" fast_read 1");
    }
    // options, sorted by name as Ceph's name table is
    let mut named: Vec<(&str, &OptValue)> = d
        .opts
        .iter()
        .filter_map(|(k, v)| {
            OPT_NAMES
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, name)| (*name, v))
        })
        .collect();
    named.sort_by_key(|(n, _)| *n);
    for (name, v) in named {
        let _ = match v {
            OptValue::Str(s) => write!(o, " {name} {s}"),
            OptValue::Int(i) => write!(o, " {name} {i}"),
            OptValue::Double(f) => write!(o, " {name} {}", fmt_g(*f)),
        };
    }
    if !d.application_metadata.is_empty() {
        let names: Vec<&str> = d.application_metadata.keys().map(|s| s.as_str()).collect();
        let _ = write!(o, " application {}", names.join(","));
    }
    o
}

impl crate::OsdMap {
    /// The key/value pairs of the erasure-code profile `name`, if the map
    /// has one.
    pub fn ec_profile(&self, name: &str) -> Option<Vec<(String, String)>> {
        let mut r = Reader::new(&self.enc.ec_profiles);
        let n = r.count("erasure_code_profiles", 8).ok()?;
        for _ in 0..n {
            let pname = r.string("erasure_code_profiles name").ok()?;
            let m = r.count("erasure_code_profiles entries", 8).ok()?;
            let mut kv = Vec::with_capacity(m);
            for _ in 0..m {
                let k = r.string("erasure_code_profiles key").ok()?;
                kv.push((k, r.string("erasure_code_profiles value").ok()?));
            }
            if pname == name {
                return Some(kv);
            }
        }
        None
    }
}
