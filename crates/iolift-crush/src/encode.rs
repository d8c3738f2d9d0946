//! Binary crush map encoding, byte-identical to what `crushtool -c` writes.

use crate::decode::MAGIC;
use crate::map::*;
use std::collections::BTreeMap;

fn put_u32(o: &mut Vec<u8>, v: u32) {
    o.extend_from_slice(&v.to_le_bytes());
}

fn put_string_map(o: &mut Vec<u8>, m: &BTreeMap<i32, String>) {
    put_u32(o, m.len() as u32);
    for (k, v) in m {
        put_u32(o, *k as u32);
        put_u32(o, v.len() as u32);
        o.extend_from_slice(v.as_bytes());
    }
}

/// Encode `map` (all optional groups it was decoded with).
pub fn encode(map: &CrushMap) -> Vec<u8> {
    let mut o = Vec::with_capacity(4096);
    put_u32(&mut o, MAGIC);
    put_u32(&mut o, map.buckets.len() as u32);
    put_u32(&mut o, map.rules.len() as u32);
    put_u32(&mut o, map.max_devices as u32);
    for b in &map.buckets {
        let Some(b) = b else {
            put_u32(&mut o, 0);
            continue;
        };
        put_u32(&mut o, b.alg as u32);
        put_u32(&mut o, b.id as u32);
        o.extend_from_slice(&b.type_id.to_le_bytes());
        o.push(b.alg);
        o.push(b.hash);
        put_u32(&mut o, b.weight);
        put_u32(&mut o, b.items.len() as u32);
        for &it in &b.items {
            put_u32(&mut o, it as u32);
        }
        match b.alg {
            ALG_UNIFORM => put_u32(&mut o, b.uniform_weight),
            ALG_LIST => {
                for (w, s) in b.item_weights.iter().zip(&b.sum_weights) {
                    put_u32(&mut o, *w);
                    put_u32(&mut o, *s);
                }
            }
            ALG_TREE => {
                o.push(b.node_weights.len() as u8);
                for &w in &b.node_weights {
                    put_u32(&mut o, w);
                }
            }
            ALG_STRAW => {
                for (w, s) in b.item_weights.iter().zip(&b.straws) {
                    put_u32(&mut o, *w);
                    put_u32(&mut o, *s);
                }
            }
            _ => {
                for &w in &b.item_weights {
                    put_u32(&mut o, w);
                }
            }
        }
    }
    for r in &map.rules {
        let Some(r) = r else {
            put_u32(&mut o, 0);
            continue;
        };
        put_u32(&mut o, 1);
        put_u32(&mut o, r.steps.len() as u32);
        o.extend_from_slice(&[r.ruleset, r.rule_type, r.min_size, r.max_size]);
        for s in &r.steps {
            put_u32(&mut o, s.op);
            put_u32(&mut o, s.arg1 as u32);
            put_u32(&mut o, s.arg2 as u32);
        }
    }
    put_string_map(&mut o, &map.type_names);
    put_string_map(&mut o, &map.names);
    put_string_map(&mut o, &map.rule_names);
    let t = &map.tunables;
    let g = map.optional_groups;
    if g >= 1 {
        put_u32(&mut o, t.choose_local_tries);
        put_u32(&mut o, t.choose_local_fallback_tries);
        put_u32(&mut o, t.choose_total_tries);
    }
    if g >= 2 {
        put_u32(&mut o, t.chooseleaf_descend_once);
    }
    if g >= 3 {
        o.push(t.chooseleaf_vary_r);
    }
    if g >= 4 {
        o.push(t.straw_calc_version);
    }
    if g >= 5 {
        put_u32(&mut o, t.allowed_bucket_algs);
    }
    if g >= 6 {
        o.push(t.chooseleaf_stable);
    }
    if g >= 7 {
        put_u32(&mut o, map.class_map.len() as u32);
        for (k, v) in &map.class_map {
            put_u32(&mut o, *k as u32);
            put_u32(&mut o, *v as u32);
        }
        put_string_map(&mut o, &map.class_names);
        put_u32(&mut o, map.class_bucket.len() as u32);
        for (k, inner) in &map.class_bucket {
            put_u32(&mut o, *k as u32);
            put_u32(&mut o, inner.len() as u32);
            for (a, b) in inner {
                put_u32(&mut o, *a as u32);
                put_u32(&mut o, *b as u32);
            }
        }
    }
    if g >= 8 {
        put_u32(&mut o, map.choose_args.len() as u32);
        for (idx, cam) in &map.choose_args {
            o.extend_from_slice(&idx.to_le_bytes());
            let used: Vec<(usize, &ChooseArg)> = cam
                .args
                .iter()
                .enumerate()
                .filter(|(_, a)| !a.ids.is_empty() || !a.weight_set.is_empty())
                .collect();
            put_u32(&mut o, used.len() as u32);
            for (i, a) in used {
                put_u32(&mut o, i as u32);
                put_u32(&mut o, a.weight_set.len() as u32);
                for ws in &a.weight_set {
                    put_u32(&mut o, ws.len() as u32);
                    for &w in ws {
                        put_u32(&mut o, w);
                    }
                }
                put_u32(&mut o, a.ids.len() as u32);
                for &id in &a.ids {
                    put_u32(&mut o, id as u32);
                }
            }
        }
    }
    o
}
