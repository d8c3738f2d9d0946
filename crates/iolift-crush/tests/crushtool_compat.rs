//! Compare `iolift_crush` with Debian's crushtool 16.2 on a generated corpus:
//! `--test` output line by line, decode -> encode byte identity.

mod common;
use common::*;
use iolift_crush::tester::{run_test, TestOptions};
use std::path::Path;
use std::process::Command;

fn ours(map_path: &Path, o: &TestOptions) -> Vec<u8> {
    let map = iolift_crush::decode(&std::fs::read(map_path).unwrap()).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run_test(&map, o, &mut out, &mut err, &mut |_| {}).unwrap();
    // run_crushtool returns stdout then stderr.
    out.extend_from_slice(&err);
    out
}

fn opts_to_args(o: &TestOptions) -> Vec<String> {
    let mut a = vec!["--test".to_string()];
    let mut push = |k: &str, v: i32| {
        if v >= 0 {
            a.push(k.into());
            a.push(v.to_string());
        }
    };
    push("--min-x", o.min_x);
    push("--max-x", o.max_x);
    if o.min_rule >= 0 && o.min_rule == o.max_rule {
        push("--rule", o.min_rule);
    }
    if o.min_rep >= 0 && o.min_rep == o.max_rep {
        push("--num-rep", o.min_rep);
    }
    push("--pool-id", o.pool_id);
    for (d, w) in &o.weights {
        a.push("--weight".into());
        a.push(d.to_string());
        a.push(w.to_string());
    }
    for (f, on) in [
        ("--show-mappings", o.show_mappings),
        ("--show-bad-mappings", o.show_bad_mappings),
        ("--show-statistics", o.show_statistics),
        ("--show-utilization", o.show_utilization),
        ("--show-utilization-all", o.show_utilization_all),
    ] {
        if on {
            a.push(f.into());
        }
    }
    a
}

/// Run both and compare line by line; returns the number of lines compared.
fn compare(map_path: &Path, o: &TestOptions) -> usize {
    let mut args = vec!["-i".to_string(), map_path.to_str().unwrap().to_string()];
    args.extend(opts_to_args(o));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let reference = run_crushtool(&argv);
    let mine = ours(map_path, o);
    let rs = String::from_utf8_lossy(&reference);
    let ms = String::from_utf8_lossy(&mine);
    let (rl, ml): (Vec<&str>, Vec<&str>) = (rs.lines().collect(), ms.lines().collect());
    for (i, (a, b)) in rl.iter().zip(&ml).enumerate() {
        assert_eq!(
            a,
            b,
            "line {} differs for crushtool {}",
            i + 1,
            argv.join(" ")
        );
    }
    assert_eq!(
        rl.len(),
        ml.len(),
        "line count differs for crushtool {}",
        argv.join(" ")
    );
    assert!(!rl.is_empty());
    rl.len()
}

fn full(min_x: i32, max_x: i32) -> TestOptions {
    TestOptions {
        min_x,
        max_x,
        show_mappings: true,
        show_bad_mappings: true,
        show_statistics: true,
        ..Default::default()
    }
}

fn roundtrip(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let map = iolift_crush::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        iolift_crush::encode(&map),
        bytes,
        "re-encode differs for {}",
        path.display()
    );
}

fn specs() -> Vec<(String, Spec)> {
    let mut v = Vec::new();
    let base = Spec {
        tunables: "jewel",
        algs: ["straw2"; 3],
        racks: 3,
        hosts: 4,
        osds: 5,
        weights: 1,
        classes: false,
        choose_args: false,
        seed: 1,
    };
    for (i, alg) in ["straw2", "straw", "list", "tree", "uniform"]
        .iter()
        .enumerate()
    {
        for (j, prof) in ["argonaut", "bobtail", "firefly", "hammer", "jewel"]
            .iter()
            .enumerate()
        {
            // Every algorithm under every profile, weights varied (zeros for
            // non-uniform), plus mixed algorithms across levels.
            let algs = match j % 3 {
                0 => [*alg; 3],
                1 => ["straw2", *alg, *alg],
                _ => [*alg, "list", *alg],
            };
            v.push((
                format!("{alg}_{prof}"),
                Spec {
                    tunables: prof,
                    algs,
                    weights: if j % 2 == 0 { 2 } else { 1 },
                    seed: (i * 10 + j) as u64,
                    ..base
                },
            ));
        }
    }
    v.push((
        "straw_v0_equal".into(),
        Spec {
            tunables: "bobtail",
            algs: ["straw"; 3],
            weights: 0,
            ..base
        },
    ));
    v.push((
        "vary_r3".into(),
        Spec {
            tunables: "vary_r3",
            algs: ["straw", "straw2", "tree"],
            weights: 2,
            seed: 77,
            ..base
        },
    ));
    v.push((
        "classes".into(),
        Spec {
            classes: true,
            weights: 2,
            seed: 5,
            ..base
        },
    ));
    v.push((
        "choose_args".into(),
        Spec {
            choose_args: true,
            weights: 2,
            seed: 9,
            ..base
        },
    ));
    v.push((
        "classes_choose_args".into(),
        Spec {
            choose_args: true,
            classes: true,
            tunables: "hammer",
            seed: 11,
            ..base
        },
    ));
    v.push((
        "small_hosts".into(),
        Spec {
            racks: 2,
            hosts: 2,
            osds: 2,
            weights: 2,
            seed: 3,
            ..base
        },
    ));
    v.push((
        "argonaut_small".into(),
        Spec {
            tunables: "argonaut",
            racks: 2,
            hosts: 3,
            osds: 2,
            algs: ["straw", "uniform", "list"],
            weights: 0,
            seed: 4,
            ..base
        },
    ));
    v
}

#[test]
fn text_corpus_matches_crushtool() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = 0;
    for (name, spec) in specs() {
        let path = compile(dir.path(), &name, &text_map(&spec));
        roundtrip(&path);
        // All rules, numrep = each rule's 1..10, x 0..511.
        lines += compare(&path, &full(0, 511));
    }
    assert!(lines > 100_000, "{lines}");
}

#[test]
fn reweights_pool_id_and_utilization_match() {
    let dir = tempfile::tempdir().unwrap();
    for (name, spec) in specs().into_iter().step_by(4) {
        let path = compile(dir.path(), &name, &text_map(&spec));
        let mut o = full(0, 1023);
        o.weights = vec![
            (0, 0.0),
            (3, 0.5),
            (7, 0.123456),
            (11, 0.9),
            (14, 1.5),
            (19, -1.0),
        ];
        o.num_rep_both(3);
        compare(&path, &o);
        let mut o = full(17, 700);
        o.pool_id = 5;
        o.min_rule = 1;
        o.max_rule = 1;
        o.num_rep_both(6);
        compare(&path, &o);
        let o = TestOptions {
            min_x: 0,
            max_x: 999,
            show_utilization: true,
            ..Default::default()
        };
        compare(&path, &o);
        let o = TestOptions {
            min_x: 0,
            max_x: 99,
            show_utilization_all: true,
            weights: vec![(2, 0.25)],
            ..Default::default()
        };
        compare(&path, &o);
    }
}

trait NumRep {
    fn num_rep_both(&mut self, n: i32);
}
impl NumRep for TestOptions {
    fn num_rep_both(&mut self, n: i32) {
        self.min_rep = n;
        self.max_rep = n;
    }
}

#[test]
fn built_maps_match_crushtool() {
    let dir = tempfile::tempdir().unwrap();
    for alg in ["straw2", "straw", "list", "tree", "uniform"] {
        let p = build(
            dir.path(),
            &format!("b_{alg}"),
            &[
                "--num_osds",
                "240",
                "host",
                alg,
                "8",
                "rack",
                alg,
                "6",
                "root",
                alg,
                "0",
            ],
        );
        roundtrip(&p);
        let mut o = full(0, 2047);
        o.num_rep_both(3);
        compare(&p, &o);
    }
}

#[test]
fn large_maps_match_crushtool() {
    let dir = tempfile::tempdir().unwrap();
    let p = build(
        dir.path(),
        "k1",
        &[
            "--num_osds",
            "1000",
            "host",
            "straw2",
            "20",
            "root",
            "straw2",
            "0",
        ],
    );
    roundtrip(&p);
    let mut o = full(0, 9999);
    o.num_rep_both(3);
    compare(&p, &o);
    let p = build(
        dir.path(),
        "k10",
        &[
            "--num_osds",
            "10000",
            "host",
            "straw2",
            "20",
            "rack",
            "straw2",
            "25",
            "row",
            "straw2",
            "5",
            "root",
            "straw2",
            "0",
        ],
    );
    roundtrip(&p);
    let mut o = full(0, 4999);
    o.num_rep_both(4);
    compare(&p, &o);
}

/// Buckets wider than the choosers' lane batches (8 and 16 items) and tree
/// buckets up to 7 levels deep (64 items), each algorithm at every level,
/// under three tunables profiles (argonaut: the local fallback draws from
/// every algorithm with the uniform permutation), straw2 with choose_args;
/// every rule, numrep 1..10.
#[test]
fn wide_buckets_match_crushtool() {
    let dir = tempfile::tempdir().unwrap();
    let shapes = [
        ("jewel", 2, 9, 17),
        ("hammer", 1, 33, 2),
        ("argonaut", 1, 2, 64),
    ];
    let mut lines = 0;
    for (i, alg) in ALGS.iter().enumerate() {
        for (j, &(tunables, racks, hosts, osds)) in shapes.iter().enumerate() {
            let spec = Spec {
                tunables,
                algs: [*alg; 3],
                racks,
                hosts,
                osds,
                weights: 2,
                classes: false,
                choose_args: *alg == "straw2",
                seed: (100 + 10 * i + j) as u64,
            };
            let path = compile(dir.path(), &format!("wide_{alg}_{j}"), &text_map(&spec));
            lines += compare(&path, &full(0, 199));
        }
    }
    assert!(lines > 100_000, "{lines}");
}

/// The comparisons above with the portable choosers (what a CPU without
/// AVX2 runs): this test binary again with `IOLIFT_CRUSH_SIMD=portable`.
/// (When that variable is already set, every test here runs that way and
/// this one has nothing to add.)
#[test]
fn portable_choosers_match_crushtool() {
    if std::env::var_os("IOLIFT_CRUSH_SIMD").is_some() {
        return;
    }
    let tests = [
        "text_corpus_matches_crushtool",
        "built_maps_match_crushtool",
        "wide_buckets_match_crushtool",
        "reweights_pool_id_and_utilization_match",
    ];
    let o = Command::new(std::env::current_exe().unwrap())
        .args(tests)
        .arg("--exact")
        .env("IOLIFT_CRUSH_SIMD", "portable")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "portable run failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains(&format!("test result: ok. {} passed", tests.len())),
        "{out}"
    );
}
