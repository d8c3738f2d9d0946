//! `iolift_crush::decompile::decompile` against Debian's `crushtool -d`
//! (Ceph 16.2): the text must be byte-identical. Maps come from text
//! compiled with `crushtool -c`, from `crushtool --build`, and from maps this
//! test edits and re-encodes to reach what the text compiler cannot write
//! (unnamed items, unknown step opcodes, odd tunables and weights).

mod common;
#[path = "decompile_compat/edited.rs"]
mod edited;
use common::*;
use iolift_crush::decompile::{decompile, decompile_partial, fixed_point_text};
use iolift_crush::map::*;
use iolift_crush::CrushMap;
use std::path::Path;
use std::process::Command;

struct Reference {
    success: bool,
    stdout: String,
    stderr: String,
}

/// `crushtool -d MAP` (time-limited); its status and output.
fn crushtool_d(map_path: &Path) -> Reference {
    let o = iolift_testkit::run_timeout(
        Command::new(crushtool()).arg("-d").arg(map_path),
        iolift_testkit::CMD_TIMEOUT,
    );
    Reference {
        success: o.status.success(),
        stdout: o.stdout,
        stderr: o.stderr,
    }
}

/// Panics with the first differing line when `ours` is not byte-identical
/// to `reference`.
fn assert_same(what: &str, reference: &str, ours: &str) {
    if reference == ours {
        return;
    }
    let (r, o): (Vec<&str>, Vec<&str>) =
        (reference.split('\n').collect(), ours.split('\n').collect());
    for (i, (a, b)) in r.iter().zip(&o).enumerate() {
        if a != b {
            panic!(
                "{what}: line {} differs\n crushtool: {a:?}\n iolift:    {b:?}\n--- crushtool -d ---\n{reference}",
                i + 1
            );
        }
    }
    panic!(
        "{what}: crushtool printed {} lines, iolift {} (common prefix equal)\n--- crushtool -d ---\n{reference}\n--- iolift ---\n{ours}",
        r.len(),
        o.len()
    );
}

/// Decode `path`, decompile it, compare with `crushtool -d path`. Returns
/// the number of lines compared.
fn check(what: &str, path: &Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let map = iolift_crush::decode::decode_for_text(&bytes)
        .unwrap_or_else(|e| panic!("{what}: decode: {e}"));
    let reference = crushtool_d(path);
    assert!(
        reference.success,
        "{what}: crushtool -d failed: {}",
        reference.stderr
    );
    let (ours, err) = decompile_partial(&map);
    assert_eq!(err, None, "{what}: decompile stopped early");
    assert_same(what, &reference.stdout, &ours);
    assert_eq!(decompile(&map), ours);
    reference.stdout.lines().count()
}

/// Write `map` with our encoder and check it.
fn check_encoded(dir: &Path, what: &str, map: &CrushMap) -> usize {
    let path = dir.join(what);
    std::fs::write(&path, iolift_crush::encode(map)).unwrap();
    check(what, &path)
}

fn spec_corpus() -> Vec<(String, Spec)> {
    let base = Spec {
        tunables: "jewel",
        algs: ["straw2"; 3],
        racks: 2,
        hosts: 3,
        osds: 4,
        weights: 1,
        classes: false,
        choose_args: false,
        seed: 1,
    };
    let mut v = Vec::new();
    let algs = ["straw2", "straw", "list", "tree", "uniform"];
    let profiles = [
        "argonaut", "bobtail", "firefly", "hammer", "jewel", "vary_r3",
    ];
    for (i, alg) in algs.iter().enumerate() {
        for (j, prof) in profiles.iter().enumerate() {
            let level_algs = match (i + j) % 3 {
                0 => [*alg; 3],
                1 => ["straw2", *alg, *alg],
                _ => [*alg, "list", *alg],
            };
            v.push((
                format!("text_{alg}_{prof}"),
                Spec {
                    tunables: prof,
                    algs: level_algs,
                    // 0: all 1.0, 1: varied, 2: varied with zero weights.
                    weights: ((i + j) % 3) as u32,
                    seed: (i * 10 + j) as u64,
                    ..base
                },
            ));
        }
    }
    for (k, (classes, choose_args)) in [(true, false), (false, true), (true, true)]
        .into_iter()
        .enumerate()
    {
        for prof in ["hammer", "jewel"] {
            v.push((
                format!(
                    "text_classes{}_choose_args{}_{prof}",
                    classes as u8, choose_args as u8
                ),
                Spec {
                    tunables: prof,
                    classes,
                    choose_args,
                    racks: 3,
                    hosts: 4,
                    osds: 5,
                    weights: 2,
                    seed: 100 + k as u64,
                    ..base
                },
            ));
        }
    }
    v.push((
        "text_mixed_classes".into(),
        Spec {
            tunables: "firefly",
            algs: ["straw", "tree", "list"],
            classes: true,
            weights: 2,
            seed: 7,
            ..base
        },
    ));
    v.push((
        "text_tiny".into(),
        Spec {
            racks: 1,
            hosts: 1,
            osds: 1,
            seed: 3,
            ..base
        },
    ));
    v
}

#[test]
fn generated_text_maps_match() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = 0;
    for (name, spec) in spec_corpus() {
        let path = compile(dir.path(), &name, &text_map(&spec));
        lines += check(&name, &path);
    }
    assert!(lines > 5000, "{lines}");
}

/// Hand-written maps for what the generator does not write: device holes,
/// buckets defined parent-first by id, an item in two buckets, explicit
/// shadow ids, tree/uniform positions, weights that round on a tie, an
/// unnamed rule, every step kind the text grammar has, several choose_args
/// sets (including the compat set -1, an empty one and entries on buckets
/// that are not straw2, which decoding drops).
const HAND_HEAD: &str = "tunable choose_local_tries 3
tunable choose_local_fallback_tries 4
tunable choose_total_tries 4294967295
tunable chooseleaf_descend_once 1
tunable chooseleaf_vary_r 200
tunable chooseleaf_stable 7
tunable straw_calc_version 2
tunable allowed_bucket_algs 4294967295

device 0 osd.0 class hdd
device 1 osd.1 class ssd
device 3 osd.3 class hdd
device 4 osd.4 class nvme
device 7 osd.7
device 8 osd.8 class hdd
device 12 osd.12 class ssd
device 40 spare.40 class hdd

type 0 osd
type 1 host
type 2 chassis
type 4 rack
type 9 root
type 10 region

";

fn hand_map() -> String {
    // Children are defined before their parents (the compiler requires
    // it), but their ids are larger in magnitude than the root's, so the
    // decompiler must reorder them.
    let body = "
host h1 {
\tid -5
\talg straw2
\thash 0
\titem osd.0 weight 1.0
\titem osd.1 weight 0.0625
\titem osd.3 weight 0.0
}
host h2 {
\tid -6
\talg tree
\thash rjenkins1
\titem osd.4 weight 2.5 pos 2
\titem osd.7 weight 0.5 pos 0
\titem osd.8 weight 1.0
}
host both {
\tid -9
\talg uniform
\thash 0
\titem osd.12 weight 0.0625
}
chassis c1 {
\tid -7
\talg list
\thash 0
\titem h1 weight 1.0625
\titem both weight 0.0625
}
rack rack_a {
\tid -3
\tid -30 class ssd
\talg straw
\thash 0
\titem c1 weight 1.125
\titem h2 weight 4.0
}
rack rack_b {
\tid -2
\talg straw2
\thash 0
\titem both weight 0.0625
}
root top {
\tid -1
\tid -20 class hdd
\talg straw2
\thash 0
\titem rack_a weight 5.125
\titem rack_b weight 0.0625
\titem both weight 0.0625
}
region world {
\tid -12
\talg straw2
\thash 0
\titem top weight 5.25
}

rule data {
\tid 0
\ttype replicated
\tmin_size 1
\tmax_size 10
\tstep take top
\tstep chooseleaf firstn 0 type host
\tstep emit
}
rule {
\tid 1
\ttype erasure
\tmin_size 3
\tmax_size 255
\tstep set_chooseleaf_tries 5
\tstep set_choose_tries 100
\tstep set_choose_local_tries 1
\tstep set_choose_local_fallback_tries 2
\tstep set_chooseleaf_vary_r 0
\tstep set_chooseleaf_stable 1
\tstep take top class hdd
\tstep choose indep 0 type rack
\tstep chooseleaf indep 1 type host
\tstep emit
}
rule multi {
\tid 4
\ttype replicated
\tmin_size 0
\tmax_size 0
\tstep take rack_a class hdd
\tstep choose firstn -1 type chassis
\tstep chooseleaf firstn 2 type osd
\tstep emit
\tstep take world
\tstep choose firstn 1 type region
\tstep choose indep 2 type root
\tstep emit
}

choose_args 5 {
  {
    bucket_id -5
    weight_set [
      [ 1.0 2.0 3.0 ]
      [ 0.5 0.25 0.0625 ]
      [ 0.0 0.0 1.0 ]
    ]
    ids [ -100 -200 -300 ]
  }
  {
    bucket_id -1
    ids [ -10 -20 -30 ]
  }
  {
    bucket_id -6
    weight_set [
      [ 1.0 2.0 3.0 ]
    ]
  }
}
choose_args 18446744073709551615 {
  {
    bucket_id -2
    weight_set [
      [ 7.5 ]
    ]
  }
  {
    bucket_id -12
    weight_set [
      [ 2.0 ]
    ]
  }
}
choose_args 9 {
  {
    bucket_id -3
    weight_set [
      [ 1.0 2.0 ]
    ]
    ids [ -1000 -2000 ]
  }
}
";
    format!("{HAND_HEAD}{body}")
}

#[test]
fn hand_written_maps_match() {
    let dir = tempfile::tempdir().unwrap();
    let text = hand_map();
    let path = compile(dir.path(), "hand", &text);
    check("hand", &path);
    // The same map under each named profile: only the tunables change.
    for prof in ["argonaut", "bobtail", "firefly", "hammer", "jewel"] {
        let body = text
            .lines()
            .filter(|l| !l.starts_with("tunable "))
            .collect::<Vec<_>>()
            .join("\n");
        let t = format!("{}{body}\n", tunables_lines(prof));
        let path = compile(dir.path(), &format!("hand_{prof}"), &t);
        check(&format!("hand_{prof}"), &path);
    }
}

#[test]
fn built_maps_match() {
    let dir = tempfile::tempdir().unwrap();
    for alg in ["straw2", "straw", "list", "tree", "uniform"] {
        let name = format!("build_{alg}");
        let p = build(
            dir.path(),
            &name,
            &[
                "--num_osds",
                "97",
                "host",
                alg,
                "6",
                "rack",
                alg,
                "4",
                "root",
                alg,
                "0",
            ],
        );
        check(&name, &p);
    }
    let p = build(
        dir.path(),
        "build_1000",
        &[
            "--num_osds",
            "1000",
            "host",
            "straw2",
            "12",
            "rack",
            "straw",
            "7",
            "row",
            "list",
            "3",
            "root",
            "tree",
            "0",
        ],
    );
    assert!(check("build_1000", &p) > 1000);
}

/// A compiled base map to edit: classes, choose_args, every algorithm.
fn base_map(dir: &Path) -> CrushMap {
    let path = compile(dir, "base", &hand_map());
    iolift_crush::decode::decode_for_text(&std::fs::read(path).unwrap()).unwrap()
}

fn bucket_mut(map: &mut CrushMap, id: i32) -> &mut Bucket {
    map.buckets[(-1 - id) as usize].as_mut().unwrap()
}

#[test]
fn edited_maps_match() {
    let dir = tempfile::tempdir().unwrap();
    for (what, map) in edited::edited_maps(dir.path()) {
        check_encoded(dir.path(), what, &map);
    }
}

/// Where crushtool's decompiler gives up (a take whose item has no name or
/// names a missing class, a bucket cycle), both print the same prefix and
/// ours reports why.
#[test]
fn early_stops_match() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_map(dir.path());
    let mut cases = Vec::new();

    let mut m = base.clone();
    m.rules[4].as_mut().unwrap().steps[4] = Step {
        op: OP_TAKE,
        arg1: -77,
        arg2: 0,
    };
    cases.push(("take_unnamed", m));

    let mut m = base.clone();
    m.names.insert(-5, "h1~gold".into());
    m.rules[0].as_mut().unwrap().steps[0] = Step {
        op: OP_TAKE,
        arg1: -5,
        arg2: 0,
    };
    cases.push(("take_missing_class", m));

    let mut m = base.clone();
    // c1 (list, no choose_args) gets its grandparent rack_a as an item.
    let b = bucket_mut(&mut m, -7);
    b.items.push(-3);
    b.item_weights.push(0);
    b.sum_weights.push(0);
    cases.push(("cycle", m));

    for (what, map) in cases {
        let path = dir.path().join(what);
        std::fs::write(&path, iolift_crush::encode(&map)).unwrap();
        let reference = crushtool_d(&path);
        let map = iolift_crush::decode::decode_for_text(&std::fs::read(&path).unwrap()).unwrap();
        let (ours, err) = decompile_partial(&map);
        let err = err.unwrap_or_else(|| panic!("{what}: expected an early stop"));
        assert!(reference.success, "{what}: {}", reference.stderr);
        assert_same(what, &reference.stdout, &ours);
        if what == "cycle" {
            assert_eq!(reference.stderr.trim_end(), err, "{what}");
        }
    }
}

#[test]
fn fixed_point_matches_printf() {
    // Values checked against C's printf("%.3f", (float)v / 0x10000).
    for (v, s) in [
        (0, "0.000"),
        (0x10000, "1.000"),
        (0x1000, "0.062"),
        (0x3000, "0.188"),
        (0x5000, "0.312"),
        (-1, "-0.000"),
        (i32::MAX, "32768.000"),
        (i32::MIN, "-32768.000"),
        (0x0100_0001, "256.000"),
    ] {
        assert_eq!(fixed_point_text(v), s, "{v:#x}");
    }
}
