//! The edited maps of decompile_compat: what the text compiler cannot
//! write (unnamed items, unknown step opcodes, odd tunables and weights),
//! made by editing a compiled map and re-encoding it.

use super::*;

/// Maps the text compiler cannot produce, written with our encoder and read
/// by both decompilers.
pub(super) fn edited_maps(dir: &Path) -> Vec<(&'static str, CrushMap)> {
    let base = base_map(dir);
    let mut v = Vec::new();

    // Names removed: buckets print as bucketN, devices as deviceN and are
    // left out of "# devices"; a rule without a name prints "rule  {".
    let mut m = base.clone();
    m.names.remove(&-7);
    m.names.remove(&-2);
    m.names.remove(&4);
    m.names.remove(&7);
    m.rule_names.remove(&4);
    v.push(("unnamed_items", m));

    // Type names: type 0 missing (printed as osd), a bucket type and a step
    // type without names.
    let mut m = base.clone();
    m.type_names.remove(&0);
    m.type_names.remove(&2);
    m.type_names.insert(1000, "far".into());
    bucket_mut(&mut m, -12).type_id = 77;
    v.push(("type_names", m));

    // Rules: other types, ruleset != id, odd sizes, noop and unknown
    // opcodes, negative arguments, a take of a device.
    let mut m = base.clone();
    {
        let r = m.rules[0].as_mut().unwrap();
        r.rule_type = 2;
        r.ruleset = 9;
        r.min_size = 255;
        r.max_size = 0;
        r.steps.insert(
            0,
            Step {
                op: OP_NOOP,
                arg1: 5,
                arg2: 6,
            },
        );
        r.steps.insert(
            1,
            Step {
                op: 5,
                arg1: 1,
                arg2: 2,
            },
        );
        r.steps.insert(
            2,
            Step {
                op: 99,
                arg1: 1,
                arg2: 2,
            },
        );
        r.steps.push(Step {
            op: OP_SET_CHOOSE_TRIES,
            arg1: -7,
            arg2: 3,
        });
        r.steps.push(Step {
            op: OP_TAKE,
            arg1: 3,
            arg2: 0,
        });
        r.steps.push(Step {
            op: OP_CHOOSE_FIRSTN,
            arg1: i32::MIN,
            arg2: 0,
        });
        r.steps.push(Step {
            op: OP_CHOOSELEAF_INDEP,
            arg1: i32::MAX,
            arg2: -3,
        });
        r.steps.push(Step {
            op: OP_EMIT,
            arg1: 1,
            arg2: 1,
        });
        let r = m.rules[1].as_mut().unwrap();
        r.rule_type = 255;
        r.ruleset = 0;
    }
    m.rules.push(None);
    m.rules.push(Some(Rule {
        ruleset: 6,
        rule_type: 0,
        min_size: 0,
        max_size: 0,
        steps: vec![],
    }));
    v.push(("rules_odd", m));

    // Weights: through float (2^24 + 1 rounds), negative as int, ties.
    let mut m = base.clone();
    {
        let b = bucket_mut(&mut m, -5);
        b.weight = u32::MAX;
        b.item_weights = vec![0x0100_0001, 0x7fff_ffff, 0x8000_0000];
        let b = bucket_mut(&mut m, -2);
        b.weight = 0x1000 * 3;
        b.item_weights = vec![0x1000 * 5];
        let b = bucket_mut(&mut m, -9);
        b.uniform_weight = 0x1000 * 7;
        b.item_weights = vec![0x1000 * 7];
        b.hash = 3;
    }
    v.push(("weights_odd", m));

    // Tunables at extremes.
    for (k, fill) in [(0u32, 0u8), (u32::MAX, 255), (0x8000_0000, 128), (22, 1)]
        .into_iter()
        .enumerate()
    {
        let mut m = base.clone();
        m.tunables = Tunables {
            choose_local_tries: fill.0.wrapping_add(k as u32),
            choose_local_fallback_tries: fill.0,
            choose_total_tries: fill.0.wrapping_sub(1),
            chooseleaf_descend_once: fill.0,
            chooseleaf_vary_r: fill.1,
            straw_calc_version: fill.1.wrapping_add(1),
            allowed_bucket_algs: fill.0,
            chooseleaf_stable: fill.1,
        };
        v.push((
            [
                "tunables_0",
                "tunables_max",
                "tunables_high_bit",
                "tunables_legacy_algs",
            ][k],
            m,
        ));
    }

    // choose_args: sets with many positions, ids only, weight sets only,
    // extreme set ids, an empty set, entries on non-straw2 buckets.
    let mut m = base.clone();
    let nb = m.buckets.len();
    let mut cam = ChooseArgMap {
        args: vec![ChooseArg::default(); nb],
    };
    for (i, b) in m.buckets.iter().enumerate() {
        let Some(b) = b else { continue };
        let n = b.items.len();
        cam.args[i] = ChooseArg {
            ids: if i % 2 == 0 {
                (0..n as i32).map(|k| -5000 - k * 3 - i as i32).collect()
            } else {
                vec![]
            },
            weight_set: (0..(i % 4))
                .map(|p| {
                    (0..n)
                        .map(|k| (k as u32 + 1) * 0x1000 * (p as u32 + 1) + i as u32)
                        .collect()
                })
                .collect(),
        };
    }
    m.choose_args.insert(i64::MIN, cam.clone());
    m.choose_args.insert(i64::MAX, cam.clone());
    m.choose_args.insert(
        -2,
        ChooseArgMap {
            args: vec![ChooseArg::default(); nb],
        },
    );
    m.choose_args.insert(3, cam);
    v.push(("choose_args_many", m));

    // Names: a device id far beyond any bucket item, names for missing
    // buckets, characters the text form never allows (a bucket whose name
    // is not a valid crush name is skipped, like a shadow bucket).
    let mut m = base.clone();
    m.names.insert(100_000, "lonely".into());
    m.names.insert(-500, "ghost".into());
    m.names.insert(-7, "chassis one".into());
    m.names.insert(0, "osd zero".into());
    v.push(("names_odd", m));
    // A name at id i32::MAX: one past it wraps, so no device prints.
    let mut m = base.clone();
    m.names.insert(i32::MAX, "maxid".into());
    v.push(("name_max_id", m));

    // Items referring to buckets that do not exist, an empty bucket of
    // each algorithm, a bucket slot left empty.
    let mut m = base.clone();
    {
        let b = bucket_mut(&mut m, -9);
        b.items.push(-4000);
        b.item_weights.push(b.uniform_weight);
        let b = bucket_mut(&mut m, -7);
        b.items.push(-300);
        b.item_weights.push(0x20000);
        b.sum_weights.push(0x40000);
    }
    let first_new = m.buckets.len() as i32;
    m.buckets.push(None);
    for (k, alg) in [ALG_UNIFORM, ALG_LIST, ALG_TREE, ALG_STRAW, ALG_STRAW2]
        .into_iter()
        .enumerate()
    {
        let id = -1 - (first_new + 1 + k as i32);
        m.buckets.push(Some(Bucket {
            id,
            type_id: 1,
            alg,
            hash: 0,
            node_weights: if alg == ALG_TREE { vec![0] } else { vec![] },
            ..Default::default()
        }));
        m.names.insert(id, format!("empty_{}", alg_name(alg)));
    }
    for cam in m.choose_args.values_mut() {
        cam.args.resize(m.buckets.len(), ChooseArg::default());
    }
    v.push(("buckets_sparse", m));

    // Duplicate names and a take of a shadow bucket by id: the split into
    // item and class goes by name, the largest id wins.
    let mut m = base.clone();
    let shadow_h1_hdd = m.class_bucket[&-5][&m
        .class_names
        .iter()
        .find(|(_, n)| *n == "hdd")
        .map(|(&k, _)| k)
        .unwrap()];
    m.names.insert(-11, "h1".into());
    m.rules[0].as_mut().unwrap().steps[0] = Step {
        op: OP_TAKE,
        arg1: shadow_h1_hdd,
        arg2: 0,
    };
    v.push(("shadow_take", m));

    v
}
