//! Property tests of the binary codec: random maps built from the crate's
//! own types encode and decode to the same value and the same bytes, and
//! crushtool-compiled random maps re-encode byte-identically.
//!
//! More cases: `PROPTEST_CASES=10000 cargo test --release -p iolift-crush
//! --test roundtrip_prop`.

mod common;
use common::*;
use iolift_crush::decode::{MAX_STEP_NUMREP, MAX_TRIES};
use iolift_crush::map::*;
use iolift_crush::{decode, encode, CrushMap};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Items of the bucket in `slot`: devices, ids of buckets in later slots
/// (so the hierarchy has no cycle), and arbitrary ids (the decoder accepts
/// items that name nothing; the mapper skips them like Ceph's).
fn items(
    slot: usize,
    nslots: usize,
    max_devices: i32,
    max_items: usize,
) -> BoxedStrategy<Vec<i32>> {
    let later = if slot + 1 < nslots {
        (slot + 1..nslots).prop_map(|s| -1 - s as i32).boxed()
    } else {
        Just(ITEM_NONE).boxed()
    };
    let item = prop_oneof![
        4 => 0..max_devices.max(1),
        3 => later,
        1 => any::<i32>(),
    ];
    prop::collection::vec(item, 0..=max_items).boxed()
}

fn bucket(slot: usize, nslots: usize, max_devices: i32) -> BoxedStrategy<Bucket> {
    (
        ALG_UNIFORM..=ALG_STRAW2,
        0u16..12,
        any::<u32>(),
        items(slot, nslots, max_devices, 9),
    )
        .prop_flat_map(move |(alg, type_id, weight, items)| {
            let n = items.len();
            let w = || prop::collection::vec(any::<u32>(), n);
            let base = Bucket {
                id: -1 - slot as i32,
                type_id,
                alg,
                hash: 0,
                weight,
                items,
                ..Default::default()
            };
            match alg {
                ALG_UNIFORM => any::<u32>()
                    .prop_map(move |uw| Bucket {
                        uniform_weight: uw,
                        item_weights: vec![uw; n],
                        ..base.clone()
                    })
                    .boxed(),
                ALG_LIST => (w(), w())
                    .prop_map(move |(iw, sw)| Bucket {
                        item_weights: iw,
                        sum_weights: sw,
                        ..base.clone()
                    })
                    .boxed(),
                ALG_TREE => {
                    // A full tree of 2^k >= 2n nodes (Ceph's num_nodes is a
                    // u8: at most 128); an empty bucket may carry any count.
                    let nodes = if n == 0 {
                        (0usize..6)
                            .prop_map(|k| if k == 0 { 0 } else { 1 << k })
                            .boxed()
                    } else {
                        let min = (2 * n).next_power_of_two();
                        (0u32..=2)
                            .prop_map(move |extra| (min << extra).min(128))
                            .boxed()
                    };
                    nodes
                        .prop_flat_map(|k| prop::collection::vec(any::<u32>(), k))
                        .prop_map(move |nw| Bucket {
                            item_weights: (0..n).map(|i| nw[2 * i + 1]).collect(),
                            node_weights: nw,
                            ..base.clone()
                        })
                        .boxed()
                }
                ALG_STRAW => (w(), w())
                    .prop_map(move |(iw, st)| Bucket {
                        item_weights: iw,
                        straws: st,
                        ..base.clone()
                    })
                    .boxed(),
                _ => w()
                    .prop_map(move |iw| Bucket {
                        item_weights: iw,
                        ..base.clone()
                    })
                    .boxed(),
            }
        })
        .boxed()
}

fn step() -> impl Strategy<Value = Step> {
    (0u32..=14, any::<i32>(), any::<i32>()).prop_map(|(op, a1, arg2)| {
        let arg1 = match op {
            OP_CHOOSE_FIRSTN | OP_CHOOSE_INDEP | OP_CHOOSELEAF_FIRSTN | OP_CHOOSELEAF_INDEP => {
                a1.rem_euclid(2 * MAX_STEP_NUMREP + 1) - MAX_STEP_NUMREP
            }
            OP_SET_CHOOSE_TRIES
            | OP_SET_CHOOSELEAF_TRIES
            | OP_SET_CHOOSE_LOCAL_TRIES
            | OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES => a1.rem_euclid(MAX_TRIES as i32 + 10) - 10,
            _ => a1,
        };
        Step { op, arg1, arg2 }
    })
}

fn rule() -> impl Strategy<Value = Rule> {
    (any::<[u8; 4]>(), prop::collection::vec(step(), 0..8)).prop_map(|(h, steps)| Rule {
        ruleset: h[0],
        rule_type: h[1],
        min_size: h[2],
        max_size: h[3],
        steps,
    })
}

/// Names must be non-empty: Ceph's string map codec reads a zero length as
/// the high half of a 64-bit key.
fn names(keys: impl Strategy<Value = i32>) -> impl Strategy<Value = BTreeMap<i32, String>> {
    prop::collection::btree_map(keys, "\\PC{1,12}", 0..6)
}

fn tunables() -> impl Strategy<Value = Tunables> {
    (
        (0..=MAX_TRIES, 0..=MAX_TRIES, 0..=MAX_TRIES, any::<u32>()),
        (any::<u8>(), any::<u8>(), any::<u32>(), any::<u8>()),
    )
        .prop_map(|((l, f, t, d), (v, s, a, st))| Tunables {
            choose_local_tries: l,
            choose_local_fallback_tries: f,
            choose_total_tries: t,
            chooseleaf_descend_once: d,
            chooseleaf_vary_r: v,
            straw_calc_version: s,
            allowed_bucket_algs: a,
            chooseleaf_stable: st,
        })
}

/// Keep the tunables the encoding carries with `groups` optional groups;
/// the rest decode as the legacy defaults.
fn trim_tunables(t: Tunables, groups: u8) -> Tunables {
    let l = Tunables::LEGACY;
    // The tunables of group `g` come from `t` if the encoding has it.
    let from = |g: u8| if groups >= g { &t } else { &l };
    Tunables {
        choose_local_tries: from(1).choose_local_tries,
        choose_local_fallback_tries: from(1).choose_local_fallback_tries,
        choose_total_tries: from(1).choose_total_tries,
        chooseleaf_descend_once: from(2).chooseleaf_descend_once,
        chooseleaf_vary_r: from(3).chooseleaf_vary_r,
        straw_calc_version: from(4).straw_calc_version,
        allowed_bucket_algs: from(5).allowed_bucket_algs,
        chooseleaf_stable: from(6).chooseleaf_stable,
    }
}

/// choose_args for the buckets present: per chosen bucket, 0..3 weight-set
/// positions and optionally replacement ids, each as long as the bucket.
fn choose_args(buckets: Vec<Option<Bucket>>) -> BoxedStrategy<BTreeMap<i64, ChooseArgMap>> {
    let nb = buckets.len();
    let arg_for = move |b: &Option<Bucket>| -> BoxedStrategy<ChooseArg> {
        let Some(b) = b else {
            return Just(ChooseArg::default()).boxed();
        };
        let n = b.items.len();
        prop_oneof![
            1 => Just(ChooseArg::default()),
            2 => (
                prop::collection::vec(prop::collection::vec(any::<u32>(), n), 0..3),
                prop_oneof![Just(Vec::new()), prop::collection::vec(any::<i32>(), n)],
            )
                .prop_map(|(weight_set, ids)| ChooseArg { ids, weight_set }),
        ]
        .boxed()
    };
    let one_set = buckets.iter().map(arg_for).collect::<Vec<_>>();
    let set = one_set.prop_map(move |args| {
        debug_assert_eq!(args.len(), nb);
        ChooseArgMap { args }
    });
    prop::collection::btree_map(any::<i64>(), set, 0..3).boxed()
}

fn crush_map() -> impl Strategy<Value = CrushMap> {
    (1usize..10, 0i32..40)
        .prop_flat_map(|(nslots, max_devices)| {
            let buckets: Vec<_> = (0..nslots)
                .map(|slot| prop::option::weighted(0.8, bucket(slot, nslots, max_devices)))
                .collect();
            (
                Just(max_devices),
                buckets,
                prop::collection::vec(prop::option::weighted(0.8, rule()), 0..5),
                (names(0i32..12), names(-12i32..40), names(0i32..5)),
                tunables(),
                0u8..=8,
                (
                    prop::collection::btree_map(0i32..40, -5i32..5, 0..5),
                    names(-5i32..5),
                    prop::collection::btree_map(
                        -12i32..0,
                        prop::collection::btree_map(-5i32..5, -40i32..0, 0..3),
                        0..3,
                    ),
                ),
            )
        })
        .prop_flat_map(
            |(max_devices, buckets, rules, (type_names, names, rule_names), t, groups, classes)| {
                let ca = if groups >= 8 {
                    choose_args(buckets.clone())
                } else {
                    Just(BTreeMap::new()).boxed()
                };
                let (class_map, class_names, class_bucket) = if groups >= 7 {
                    classes
                } else {
                    Default::default()
                };
                ca.prop_map(move |choose_args| CrushMap {
                    max_devices,
                    buckets: buckets.clone(),
                    rules: rules.clone(),
                    type_names: type_names.clone(),
                    names: names.clone(),
                    rule_names: rule_names.clone(),
                    tunables: trim_tunables(t, groups),
                    class_map: class_map.clone(),
                    class_names: class_names.clone(),
                    class_bucket: class_bucket.clone(),
                    choose_args,
                    optional_groups: groups,
                })
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_maps_round_trip(map in crush_map()) {
        let bytes = encode(&map);
        let back = decode(&bytes).map_err(|e| TestCaseError::fail(format!("decode: {e}")))?;
        prop_assert_eq!(&back, &map);
        prop_assert_eq!(encode(&back), bytes);
    }
}

/// A corpus map's shape. Device classes only where crushtool accepts them
/// (see iolift_testkit::crushmap: no uniform bucket).
fn shape() -> impl Strategy<Value = Spec> {
    (
        prop::sample::select(&PROFILES[..]),
        [
            prop::sample::select(&ALGS[..]),
            prop::sample::select(&ALGS[..]),
            prop::sample::select(&ALGS[..]),
        ],
        (1usize..4, 1usize..5, 1usize..6, 0u32..3),
        (any::<bool>(), any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |(tunables, algs, (racks, hosts, osds, weights), (classes, choose_args, seed))| Spec {
                tunables,
                algs,
                racks,
                hosts,
                osds,
                weights,
                classes: classes && !algs.contains(&"uniform"),
                choose_args,
                seed,
            },
        )
}

proptest! {
    // Each case runs crushtool: keep the count modest.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn crushtool_compiled_maps_re_encode_identically(s in shape()) {
        let dir = tempfile::tempdir().unwrap();
        let p = compile(dir.path(), "m", &text_map(&s));
        let bytes = std::fs::read(p).unwrap();
        let map = decode(&bytes).map_err(|e| TestCaseError::fail(format!("decode: {e}")))?;
        prop_assert!(encode(&map) == bytes, "re-encoding differs");
        prop_assert_eq!(decode(&encode(&map)).unwrap(), map);
    }
}
