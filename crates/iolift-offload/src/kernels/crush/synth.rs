//! Synthetic straw2 maps (root -> racks -> hosts -> OSDs) for benchmarks
//! and the GPU check when crushtool is not installed.

use iolift_crush::map::*;
use iolift_crush::CrushMap;
use std::collections::BTreeMap;

/// Rule 0: replicated (chooseleaf firstn 0 type host). Rule 1: erasure
/// (chooseleaf indep 0 type host).
pub const RULE_REPLICATED: i32 = 0;
pub const RULE_EC: i32 = 1;

/// `osds` OSDs, `per_host` per host, `hosts_per_rack` hosts per rack;
/// OSD weights vary deterministically in 1.0..=2.0 (16.16), jewel tunables.
pub fn straw2_map(osds: usize, per_host: usize, hosts_per_rack: usize) -> CrushMap {
    let per_host = per_host.max(1);
    let hosts_per_rack = hosts_per_rack.max(1);
    let nhosts = osds.div_ceil(per_host);
    let nracks = nhosts.div_ceil(hosts_per_rack);
    let mut buckets: Vec<Option<Bucket>> = Vec::new();
    let mut names = BTreeMap::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    let mk = Bucket::straw2;
    // ids: root -1, racks -2.., hosts after.
    let root_id = -1;
    let rack_id = |r: usize| -2 - r as i32;
    let host_id = |h: usize| -2 - nracks as i32 - h as i32;
    buckets.resize((1 + nracks + nhosts).max(1), None);
    let mut host_w = vec![0u32; nhosts];
    #[allow(clippy::needless_range_loop)]
    for h in 0..nhosts {
        let lo = h * per_host;
        let hi = (lo + per_host).min(osds);
        let items: Vec<i32> = (lo..hi).map(|d| d as i32).collect();
        let ws: Vec<u32> = items.iter().map(|_| 0x10000 + (next() % 0x10001)).collect();
        for &d in &items {
            names.insert(d, format!("osd.{d}"));
        }
        let b = mk(host_id(h), 1, items, ws);
        host_w[h] = b.weight;
        names.insert(b.id, format!("host{h}"));
        let slot = (-1 - b.id) as usize;
        buckets[slot] = Some(b);
    }
    let mut rack_w = vec![0u32; nracks];
    #[allow(clippy::needless_range_loop)]
    for r in 0..nracks {
        let hs: Vec<usize> = (r * hosts_per_rack..((r + 1) * hosts_per_rack).min(nhosts)).collect();
        let b = mk(
            rack_id(r),
            2,
            hs.iter().map(|&h| host_id(h)).collect(),
            hs.iter().map(|&h| host_w[h]).collect(),
        );
        rack_w[r] = b.weight;
        names.insert(b.id, format!("rack{r}"));
        let slot = (-1 - b.id) as usize;
        buckets[slot] = Some(b);
    }
    let root = mk(root_id, 3, (0..nracks).map(rack_id).collect(), rack_w);
    names.insert(root_id, "default".into());
    buckets[0] = Some(root);
    let rule = |t: u8, op: u32| Rule {
        ruleset: 0,
        rule_type: t,
        min_size: 1,
        max_size: 20,
        steps: vec![
            Step {
                op: OP_TAKE,
                arg1: root_id,
                arg2: 0,
            },
            Step {
                op,
                arg1: 0,
                arg2: 1,
            },
            Step {
                op: OP_EMIT,
                arg1: 0,
                arg2: 0,
            },
        ],
    };
    let mut tunables = Tunables::LEGACY;
    tunables.set_profile("jewel").expect("known profile");
    let mut type_names = BTreeMap::new();
    for (i, n) in ["osd", "host", "rack", "root"].iter().enumerate() {
        type_names.insert(i as i32, n.to_string());
    }
    let mut rule_names = BTreeMap::new();
    rule_names.insert(0, "replicated".to_string());
    rule_names.insert(1, "ec".to_string());
    CrushMap {
        max_devices: osds as i32,
        buckets,
        rules: vec![
            Some(rule(1, OP_CHOOSELEAF_FIRSTN)),
            Some(rule(3, OP_CHOOSELEAF_INDEP)),
        ],
        type_names,
        names,
        rule_names,
        tunables,
        class_map: BTreeMap::new(),
        class_names: BTreeMap::new(),
        class_bucket: BTreeMap::new(),
        choose_args: BTreeMap::new(),
        optional_groups: 8,
    }
}
