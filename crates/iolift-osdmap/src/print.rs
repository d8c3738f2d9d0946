//! `osdmaptool --print`: the map summary exactly as Ceph 16.2's
//! `OSDMap::print` writes it (header, pools, OSDs, upmaps, temps,
//! blocklist). Times are printed in UTC (Ceph uses the local time zone;
//! both agree where TZ is UTC).

use crate::addr::AddrVec;
use crate::osdpart::OsdPart;
use crate::pool_detail::{pool_line, PoolDetail};
use crate::types::{OsdMap, UTime, DEFAULT_PRIMARY_AFFINITY};
use crate::Result;
use iolift_crush::map::ALG_STRAW2;
use iolift_crush::tester::fmt_g;
use std::fmt::Write as _;

/// `CEPH_OSDMAP_*` flag names in the order `get_flag_string` tests them.
const MAP_FLAGS: &[(u32, &str)] = &[
    (1 << 0, "nearfull"),
    (1 << 1, "full"),
    (1 << 2, "pauserd"),
    (1 << 3, "pausewr"),
    (1 << 4, "pauserec"),
    (1 << 5, "noup"),
    (1 << 6, "nodown"),
    (1 << 7, "noout"),
    (1 << 8, "noin"),
    (1 << 9, "nobackfill"),
    (1 << 14, "norebalance"),
    (1 << 10, "norecover"),
    (1 << 11, "noscrub"),
    (1 << 12, "nodeep-scrub"),
    (1 << 13, "notieragent"),
    (1 << 21, "nosnaptrim"),
    (1 << 15, "sortbitwise"),
    (1 << 16, "require_jewel_osds"),
    (1 << 17, "require_kraken_osds"),
    (1 << 18, "require_luminous_osds"),
    (1 << 19, "recovery_deletes"),
    (1 << 20, "purged_snapdirs"),
    (1 << 22, "pglog_hardlimit"),
];

/// `CEPH_OSD_*` state bit names (`ceph_osd_state_name`).
const OSD_STATES: &[&str] = &[
    "exists",
    "up",
    "autoout",
    "new",
    "full",
    "nearfull",
    "backfillfull",
    "destroyed",
    "noup",
    "nodown",
    "noin",
    "noout",
    "stop",
];

/// `ceph_release_name`.
pub fn release_name(r: u8) -> &'static str {
    match r {
        1 => "argonaut",
        2 => "bobtail",
        3 => "cuttlefish",
        4 => "dumpling",
        5 => "emperor",
        6 => "firefly",
        7 => "giant",
        8 => "hammer",
        9 => "infernalis",
        10 => "jewel",
        11 => "kraken",
        12 => "luminous",
        13 => "mimic",
        14 => "nautilus",
        15 => "octopus",
        16 => "pacific",
        17 => "quincy",
        18 => "reef",
        _ => "unknown",
    }
}

/// `OSDMap::get_flag_string`.
pub fn map_flags_string(flags: u32) -> String {
    let names: Vec<&str> = MAP_FLAGS
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| *n)
        .collect();
    names.join(",")
}

/// Civil date of a count of days since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `utime_t`'s `operator<<`: small values (under ten years) are a
/// relative time `sec.usec`, others an ISO 8601 time (here in UTC).
pub fn fmt_utime(t: UTime) -> String {
    let usec = t.nsec / 1000;
    if (t.sec as i64) < 60 * 60 * 24 * 365 * 10 {
        return format!("{}.{usec:06}", t.sec);
    }
    let s = t.sec as i64;
    let (y, mo, d) = civil(s.div_euclid(86_400));
    let r = s.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{usec:06}+0000",
        r / 3600,
        r / 60 % 60,
        r % 60
    )
}

/// `uuid_d`'s text form.
pub fn fmt_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn intervals(v: &[(u64, u64)]) -> String {
    let parts: Vec<String> = v.iter().map(|(s, l)| format!("{s:x}~{l:x}")).collect();
    format!("[{}]", parts.join(","))
}

fn vec_i32(v: &[i32]) -> String {
    let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(","))
}

impl OsdMap {
    /// `OSDMap::get_min_compat_client`: the oldest client release that
    /// understands this map (CRUSH tunables and buckets, upmaps, primary
    /// affinity, rules, pool flags).
    pub fn min_compat_client(&self) -> u8 {
        let c = &self.crush;
        let t = &c.tunables;
        let incompat_choose_args = match c.choose_args.len() {
            0 => false,
            1 => {
                let (k, m) = c.choose_args.iter().next().expect("one");
                *k != -1
                    || m.args.iter().any(|a| {
                        !(a.weight_set.is_empty() && a.ids.is_empty())
                            && (a.weight_set.len() != 1 || !a.ids.is_empty())
                    })
            }
            _ => true,
        };
        if !self.pg_upmap.is_empty() || !self.pg_upmap_items.is_empty() || incompat_choose_args {
            return 12;
        }
        let rule_ops = |op: u32| {
            self.pools.values().any(|p| {
                c.rules
                    .get(p.crush_rule as usize)
                    .and_then(|r| r.as_ref())
                    .is_some_and(|r| r.steps.iter().any(|s| s.op == op))
            })
        };
        if t.chooseleaf_stable != 0 || rule_ops(13) {
            return 10;
        }
        if c.buckets.iter().flatten().any(|b| b.alg == ALG_STRAW2) {
            return 8;
        }
        let affinity = self
            .primary_affinity
            .iter()
            .any(|&a| a != DEFAULT_PRIMARY_AFFINITY);
        let cachepool = self
            .pools
            .values()
            .any(|p| PoolDetail::read(p).is_ok_and(|d| !d.tiers.is_empty() || d.tier_of >= 0));
        if affinity || t.chooseleaf_vary_r != 0 || rule_ops(12) || cachepool {
            return 6;
        }
        if t.chooseleaf_descend_once != 0 || self.pools.values().any(|p| p.hashpspool()) {
            return 4;
        }
        1
    }

    /// The text `osdmaptool --print` writes for this map.
    pub fn print_text(&self) -> Result<String> {
        let op: OsdPart = self.osd_part()?;
        let mut o = String::with_capacity(4096 + 256 * self.max_osd as usize);
        let _ = writeln!(o, "epoch {}", self.epoch);
        let _ = writeln!(o, "fsid {}", fmt_uuid(&self.fsid));
        let _ = writeln!(o, "created {}", fmt_utime(self.created));
        let _ = writeln!(o, "modified {}", fmt_utime(self.modified));
        let _ = writeln!(o, "flags {}", map_flags_string(self.flags));
        let _ = writeln!(o, "crush_version {}", self.crush_version);
        let _ = writeln!(o, "full_ratio {}", fmt_g(op.full_ratio as f64));
        let _ = writeln!(
            o,
            "backfillfull_ratio {}",
            fmt_g(op.backfillfull_ratio as f64)
        );
        let _ = writeln!(o, "nearfull_ratio {}", fmt_g(op.nearfull_ratio as f64));
        if op.require_min_compat_client > 0 {
            let _ = writeln!(
                o,
                "require_min_compat_client {}",
                release_name(op.require_min_compat_client)
            );
        }
        let _ = writeln!(
            o,
            "min_compat_client {}",
            release_name(self.min_compat_client())
        );
        if op.require_osd_release > 0 {
            let _ = writeln!(
                o,
                "require_osd_release {}",
                release_name(op.require_osd_release)
            );
        }
        let _ = writeln!(o, "stretch_mode_enabled {}", op.stretch_mode_enabled);
        if op.stretch_mode_enabled {
            let _ = writeln!(o, "stretch_bucket_count {}", op.stretch_bucket_count);
            let _ = writeln!(o, "degraded_stretch_mode {}", op.degraded_stretch_mode);
            let _ = writeln!(o, "recovering_stretch_mode {}", op.recovering_stretch_mode);
            let _ = writeln!(o, "stretch_mode_bucket {}", op.stretch_mode_bucket);
        }
        if !op.cluster_snapshot.is_empty() {
            let _ = writeln!(o, "cluster_snapshot {}", op.cluster_snapshot);
        }
        o.push('\n');

        for (id, p) in &self.pools {
            let d = PoolDetail::read(p)?;
            let name = self
                .enc
                .pool_names
                .iter()
                .find(|(i, _)| i == id)
                .map_or("<unknown>", |(_, n)| n.as_str());
            let _ = writeln!(o, "pool {id} '{name}' {}", pool_line(p, &d));
            for s in &d.snaps {
                let _ = writeln!(o, "\tsnap {:x} '{}' {}", s.id, s.name, fmt_utime(s.stamp));
            }
            if !d.removed_snaps.is_empty() {
                let _ = writeln!(o, "\tremoved_snaps {}", intervals(&d.removed_snaps));
            }
            if let Some((_, q)) = op.removed_snaps_queue.iter().find(|(i, _)| i == id) {
                let _ = writeln!(o, "\tremoved_snaps_queue {}", intervals(q));
            }
        }
        o.push('\n');

        let client_addrs = {
            let mut r = crate::codec::Reader::new(&self.enc.client_addrs);
            AddrVec::read_list(&mut r, "client_addrs")?
        };
        let none = AddrVec::default();
        let _ = writeln!(o, "max_osd {}", self.max_osd);
        for i in 0..self.max_osd {
            if !self.exists(i) {
                continue;
            }
            let u = i as usize;
            let _ = write!(
                o,
                "osd.{i}{}{} weight {}",
                if self.is_up(i) { " up  " } else { " down" },
                if self.is_in(i) { " in " } else { " out" },
                fmt_g(self.weight(i) as f64 / 65536.0)
            );
            let a = self.primary_affinity_of(i);
            if a != DEFAULT_PRIMARY_AFFINITY {
                let _ = write!(o, " primary_affinity {}", fmt_g(a as f64 / 65536.0));
            }
            let info = op.osd_info.get(u).copied().unwrap_or_default();
            let _ = write!(
                o,
                " up_from {} up_thru {} down_at {} last_clean_interval [{},{})",
                info[0], info[1], info[2], info[3], info[4]
            );
            if info[5] != 0 {
                let _ = write!(o, " lost_at {}", info[5]);
            }
            let _ = write!(
                o,
                " {} {}",
                client_addrs.get(u).unwrap_or(&none),
                op.cluster_addrs.get(u).unwrap_or(&none)
            );
            let st = self.osd_state[u];
            let mut names: Vec<&str> = OSD_STATES
                .iter()
                .enumerate()
                .filter(|(b, _)| st & (1 << b) != 0)
                .map(|(_, n)| *n)
                .collect();
            names.sort_unstable();
            let _ = write!(o, " {}", names.join(","));
            if let Some(uuid) = op.osd_uuid.get(u).filter(|x| x.iter().any(|&b| b != 0)) {
                let _ = write!(o, " {}", fmt_uuid(uuid));
            }
            o.push('\n');
        }
        o.push('\n');

        for (pg, v) in &self.pg_upmap {
            let _ = writeln!(o, "pg_upmap {pg} {}", vec_i32(v));
        }
        for (pg, v) in &self.pg_upmap_items {
            let flat: Vec<i32> = v.iter().flat_map(|&(a, b)| [a, b]).collect();
            let _ = writeln!(o, "pg_upmap_items {pg} {}", vec_i32(&flat));
        }
        for (pg, v) in &self.pg_temp {
            let _ = writeln!(o, "pg_temp {pg} {}", vec_i32(v));
        }
        for (pg, p) in &self.primary_temp {
            let _ = writeln!(o, "primary_temp {pg} {p}");
        }
        // Ceph keeps the blocklist in a hash map; decoding inserts each
        // entry in front of the ones before it, so osdmaptool shows the
        // entries in reverse encoded order (exactly so while no two share
        // a hash bucket).
        for (a, t) in op.blocklist.iter().rev() {
            let _ = writeln!(o, "blocklist {a} expires {}", fmt_utime(*t));
        }
        for (a, t) in op.range_blocklist.iter().rev() {
            let _ = writeln!(o, "range_blocklist {a} expires {}", fmt_utime(*t));
        }
        Ok(o)
    }
}
