//! A new map as `osdmaptool --createsimple N` makes it (Ceph 16.2's
//! `OSDMap::build_simple`): N OSDs that do not exist yet (state 0, out),
//! a crush map with every OSD (weight 1.0) in host `localhost`, rack
//! `localrack`, root `default` (straw2, jewel tunables) and the rule
//! `replicated_rule` (chooseleaf firstn over hosts), the `default`
//! erasure-code profile, and with `default_pool` the pool `rbd` (id 1,
//! size 3, N << pg_bits PGs, N << pgp_bits placement seeds). The fsid is
//! all zero, as osdmaptool leaves it. The map is written in Ceph's
//! encoding and read back with [`crate::decode`].

use crate::codec::{
    begin_struct, crc32c, end_struct, put_i32, put_i64, put_string, put_u32, put_u64, put_u8,
};
use crate::types::{OsdMap, UTime};
use crate::{OsdMapError, Result};
use iolift_crush::map::{
    Bucket, CrushMap, Rule, Step, Tunables, OP_CHOOSELEAF_FIRSTN, OP_EMIT, OP_TAKE,
};
use std::collections::BTreeMap;

/// The CRUSH types `build_simple` defines, by id.
const TYPES: &[&str] = &[
    "osd",
    "host",
    "chassis",
    "rack",
    "row",
    "pdu",
    "pod",
    "room",
    "datacenter",
    "zone",
    "region",
    "root",
];

/// Largest OSD count accepted (Ceph's `mon_max_osd` default is 10000;
/// osdmaptool itself takes more, so this only bounds memory).
pub const MAX_SIMPLE_OSDS: i32 = 1 << 20;

/// The crush map `build_simple_crush_map` makes for `n` OSDs.
pub fn simple_crush(n: i32) -> Result<CrushMap> {
    if !(1..=MAX_SIMPLE_OSDS).contains(&n) {
        return Err(OsdMapError::Invalid(format!(
            "osd count {n}: must be 1..={MAX_SIMPLE_OSDS}"
        )));
    }
    let w = 0x10000u32;
    let total = w.checked_mul(n as u32).ok_or_else(|| {
        OsdMapError::Invalid(format!("osd count {n}: total weight overflows 16.16"))
    })?;
    let host = Bucket::straw2(-2, 1, (0..n).collect(), vec![w; n as usize]);
    let rack = Bucket::straw2(-3, 3, vec![-2], vec![total]);
    let root = Bucket::straw2(-1, 11, vec![-3], vec![total]);
    let mut tunables = Tunables::LEGACY;
    tunables
        .set_profile("jewel")
        .map_err(|e| OsdMapError::Invalid(e.to_string()))?;
    tunables.straw_calc_version = 1;
    let mut names: BTreeMap<i32, String> = (0..n).map(|o| (o, format!("osd.{o}"))).collect();
    names.insert(-1, "default".into());
    names.insert(-2, "localhost".into());
    names.insert(-3, "localrack".into());
    let step = |op, arg1, arg2| Step { op, arg1, arg2 };
    Ok(CrushMap {
        max_devices: n,
        // crush_add_bucket allocates bucket slots 8 at a time at first
        buckets: vec![
            Some(root),
            Some(host),
            Some(rack),
            None,
            None,
            None,
            None,
            None,
        ],
        rules: vec![Some(Rule {
            ruleset: 0,
            rule_type: 1,
            min_size: 1,
            max_size: 10,
            steps: vec![
                step(OP_TAKE, -1, 0),
                step(OP_CHOOSELEAF_FIRSTN, 0, 1),
                step(OP_EMIT, 0, 0),
            ],
        })],
        type_names: TYPES
            .iter()
            .enumerate()
            .map(|(i, s)| (i as i32, s.to_string()))
            .collect(),
        names,
        rule_names: BTreeMap::from([(0, "replicated_rule".to_string())]),
        tunables,
        class_map: BTreeMap::new(),
        class_names: BTreeMap::new(),
        class_bucket: BTreeMap::new(),
        choose_args: BTreeMap::new(),
        optional_groups: 8,
    })
}

fn put_utime(out: &mut Vec<u8>, t: UTime) {
    put_u32(out, t.sec);
    put_u32(out, t.nsec);
}

/// `pg_pool_t` (v29) of the default pool.
fn rbd_pool(out: &mut Vec<u8>, pg_num: u32, pgp_num: u32) {
    let at = begin_struct(out, 29, 5);
    out.extend_from_slice(&[1, 3, 0, 2]); // replicated, size 3, rule 0, rjenkins
    put_u32(out, pg_num);
    put_u32(out, pgp_num);
    put_u32(out, 0); // lpg_num
    put_u32(out, 0); // lpgp_num
    put_u32(out, 0); // last_change
    put_u64(out, 0); // snap_seq
    put_u32(out, 0); // snap_epoch
    put_u32(out, 0); // snaps
    put_u32(out, 0); // removed_snaps
    put_u64(out, 0); // auid
    put_u64(out, 1); // flags: hashpspool
    put_u32(out, 0); // crash_replay_interval
    put_u8(out, 2); // min_size
    put_u64(out, 0); // quota_max_bytes
    put_u64(out, 0); // quota_max_objects
    put_u32(out, 0); // tiers
    put_i64(out, -1); // tier_of
    put_u8(out, 0); // cache_mode
    put_i64(out, -1); // read_tier
    put_i64(out, -1); // write_tier
    put_u32(out, 0); // properties
    let h = begin_struct(out, 1, 1); // hit_set_params: none
    put_u8(out, 0);
    end_struct(out, h);
    put_u32(out, 0); // hit_set_period
    put_u32(out, 0); // hit_set_count
    put_u32(out, 0); // stripe_width
    put_u64(out, 0); // target_max_bytes
    put_u64(out, 0); // target_max_objects
    for _ in 0..4 {
        put_u32(out, 0); // cache ratios and ages
    }
    put_string(out, ""); // erasure_code_profile
    put_u32(out, 0); // last_force_op_resend_preluminous
    put_u32(out, 0); // min_read_recency_for_promote
    put_u64(out, 0); // expected_num_objects
    put_u32(out, 0); // cache_target_dirty_high_ratio_micro
    put_u32(out, 0); // min_write_recency_for_promote
    put_u8(out, 1); // use_gmt_hitset
    put_u8(out, 0); // fast_read
    put_u32(out, 0); // hit_set_grade_decay_rate
    put_u32(out, 0); // hit_set_search_last_n
    let o = begin_struct(out, 2, 1); // opts: none
    put_u32(out, 0);
    end_struct(out, o);
    put_u32(out, 0); // last_force_op_resend_prenautilus
    put_u32(out, 1); // application_metadata: {rbd: {}}
    put_string(out, "rbd");
    put_u32(out, 0);
    put_utime(out, UTime::default()); // create_time
    put_u32(out, pg_num); // pg_num_target
    put_u32(out, pgp_num); // pgp_num_target
    put_u32(out, pg_num); // pg_num_pending
    put_u32(out, 0); // old merge last_epoch_started
    put_u32(out, 0); // old merge last_epoch_clean
    put_u32(out, 0); // last_force_op_resend
    put_u8(out, 2); // pg_autoscale_mode: on
    let m = begin_struct(out, 1, 1); // last_pg_merge_meta
    put_u8(out, 1); // source_pgid 0.0
    put_u64(out, 0);
    put_u32(out, 0);
    put_i32(out, -1);
    out.extend_from_slice(&[0; 12 + 12 + 12]); // epochs, source and target versions
    end_struct(out, m);
    end_struct(out, at);
}

/// `osdmaptool --createsimple n [--with-default-pool] [--pg_bits B]
/// [--pgp_bits B]`, epoch 0 (osdmaptool writes it as epoch 1), created and
/// modified at `now`.
pub fn build_simple(
    n: i32,
    pg_bits: u32,
    pgp_bits: u32,
    default_pool: bool,
    now: UTime,
) -> Result<OsdMap> {
    let crush = iolift_crush::encode(&simple_crush(n)?);
    let pgp_bits = pgp_bits.min(pg_bits);
    let shift = |bits: u32| -> Result<u32> {
        (n as u64)
            .checked_shl(bits)
            .filter(|&v| v <= u32::MAX as u64)
            .map(|v| v as u32)
            .ok_or_else(|| {
                OsdMapError::Invalid(format!("{n} << {bits} PGs does not fit a pool's pg_num"))
            })
    };
    let (pg_num, pgp_num) = (shift(pg_bits)?, shift(pgp_bits)?);
    let nu = n as usize;
    let mut out = Vec::with_capacity(2048 + crush.len() + 200 * nu);
    let wrapper = begin_struct(&mut out, 8, 7);
    let client = begin_struct(&mut out, 9, 1);
    out.extend_from_slice(&[0; 16]); // fsid
    put_u32(&mut out, 0); // epoch
    put_utime(&mut out, now);
    put_utime(&mut out, now);
    put_u32(&mut out, u32::from(default_pool));
    if default_pool {
        put_i64(&mut out, 1);
        rbd_pool(&mut out, pg_num, pgp_num);
        put_u32(&mut out, 1);
        put_i64(&mut out, 1);
        put_string(&mut out, "rbd");
    } else {
        put_u32(&mut out, 0);
    }
    put_i32(&mut out, i32::from(default_pool)); // pool_max
    put_u32(&mut out, 0); // flags
    put_i32(&mut out, n);
    for _ in 0..2 {
        put_u32(&mut out, n as u32); // osd_state, osd_weight: all 0
        out.resize(out.len() + 4 * nu, 0);
    }
    let empty_addrvecs = |out: &mut Vec<u8>| {
        put_u32(out, n as u32);
        for _ in 0..n {
            put_u8(out, 2);
            put_u32(out, 0);
        }
    };
    empty_addrvecs(&mut out); // client_addrs
    put_u32(&mut out, 0); // pg_temp
    put_u32(&mut out, 0); // primary_temp
    put_u32(&mut out, 0); // primary affinity
    put_u32(&mut out, crush.len() as u32);
    out.extend_from_slice(&crush);
    put_u32(&mut out, 1); // erasure_code_profiles: default
    put_string(&mut out, "default");
    put_u32(&mut out, 4);
    for (k, v) in [
        ("k", "2"),
        ("m", "2"),
        ("plugin", "jerasure"),
        ("technique", "reed_sol_van"),
    ] {
        put_string(&mut out, k);
        put_string(&mut out, v);
    }
    put_u32(&mut out, 0); // pg_upmap
    put_u32(&mut out, 0); // pg_upmap_items
    put_i32(&mut out, 1); // crush_version
    put_u32(&mut out, 0); // new_removed_snaps
    put_u32(&mut out, 0); // new_purged_snaps
    put_utime(&mut out, UTime::default()); // last_up_change
    put_utime(&mut out, UTime::default()); // last_in_change
    end_struct(&mut out, client);

    let osd = begin_struct(&mut out, 9, 1);
    empty_addrvecs(&mut out); // hb_back_addrs
    put_u32(&mut out, n as u32); // osd_info
    for _ in 0..n {
        put_u8(&mut out, 1);
        out.extend_from_slice(&[0; 24]);
    }
    put_u32(&mut out, 0); // blocklist
    empty_addrvecs(&mut out); // cluster_addrs
    put_u32(&mut out, 0); // cluster_snapshot_epoch
    put_string(&mut out, ""); // cluster_snapshot
    put_u32(&mut out, n as u32); // osd_uuid
    out.resize(out.len() + 16 * nu, 0);
    put_u32(&mut out, n as u32); // osd_xinfo
    for _ in 0..n {
        let x = begin_struct(&mut out, 4, 1);
        out.extend_from_slice(&[0; 40]);
        end_struct(&mut out, x);
    }
    empty_addrvecs(&mut out); // hb_front_addrs
    out.extend_from_slice(&[0; 12]); // nearfull, full, backfillfull ratios
    out.extend_from_slice(&[0, 0]); // require_min_compat_client, require_osd_release
    put_u32(&mut out, 0); // removed_snaps_queue
    put_u32(&mut out, 0); // crush_node_flags
    put_u32(&mut out, 0); // device_class_flags
    end_struct(&mut out, osd);
    let crc_at = out.len();
    put_u32(&mut out, 0);
    end_struct(&mut out, wrapper);
    let crc = crc32c(u32::MAX, &out[..crc_at]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    crate::decode(&out)
}
