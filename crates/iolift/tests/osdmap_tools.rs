//! `iolift osdmap --print`, `--createsimple`, `diff` and `--what-if`
//! against Ceph's osdmaptool and crushtool (package ceph-base, installed by
//! scripts/test.sh). `--print` must equal osdmaptool's byte for byte; a map
//! made by our `--createsimple` must print (but for its creation time) and
//! map exactly like osdmaptool's; the PGs `diff` and `--what-if` report as
//! changed, and the shards they count per OSD, must be what comparing
//! osdmaptool's `--test-map-pgs-dump-all` of the two maps gives.

use iolift_testkit::ceph_tools::{createsimple, crush_build_straw2, ToolDir};
use iolift_testkit::{tool_ok as ok, tool_output as run};
use std::collections::BTreeMap;

fn iolift(args: &[&str]) -> String {
    let mut a = vec!["osdmap"];
    a.extend_from_slice(args);
    ok(env!("CARGO_BIN_EXE_iolift"), &a)
}

fn without_times(s: &str) -> String {
    s.lines()
        .filter(|l| !l.starts_with("created ") && !l.starts_with("modified "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn print_and_createsimple_match_osdmaptool() {
    let d = ToolDir::new("osdtools-create");
    for (n, extra) in [
        ("4", vec!["--with-default-pool"]),
        ("3", vec![]),
        (
            "50",
            vec!["--with-default-pool", "--pg_bits", "2", "--pgp_bits", "1"],
        ),
    ] {
        let (theirs, ours) = (d.p("theirs"), d.p("ours"));
        let mut a = vec!["--createsimple", n, "--clobber"];
        a.extend_from_slice(&extra);
        let mut t = a.clone();
        t.extend_from_slice(&[theirs.as_str(), "--print"]);
        let want = ok("osdmaptool", &t);
        let mut o = a.clone();
        o.extend_from_slice(&[ours.as_str(), "--print"]);
        let got = iolift(&o);
        // the creation time differs; the rest, incl. "writing epoch 1", not
        assert_eq!(
            without_times(&got),
            without_times(&want)
                .replace("osdmaptool: ", "iolift: ")
                .replace(&theirs, &ours),
            "--createsimple {n} {extra:?}"
        );
        // osdmaptool reads our map and prints and maps it as its own
        let theirs_print = ok("osdmaptool", &[&theirs, "--print"]);
        let ours_print = ok("osdmaptool", &[&ours, "--print"]);
        assert_eq!(without_times(&ours_print), without_times(&theirs_print));
        // --print of an existing map: byte for byte
        assert_eq!(iolift(&[&theirs, "--print"]), theirs_print);
        if !extra.is_empty() {
            let dump = |p: &str| ok("osdmaptool", &[p, "--test-map-pgs-dump-all"]);
            assert_eq!(
                dump(&ours).replace(&ours, ""),
                dump(&theirs).replace(&theirs, "")
            );
        }
    }
    // --device gpu: with a GPU the reports equal the CPU's; without one a
    // clear error (the kernel itself is checked by iolift-offload's
    // placement_host test through its host build)
    let f = d.p("theirs");
    let cpu = iolift(&[&f, "--test-map-pgs-dump-all"]);
    let (code, out, err) = run(
        env!("CARGO_BIN_EXE_iolift"),
        &["osdmap", &f, "--test-map-pgs-dump-all", "--device", "gpu"],
    );
    if code == 0 {
        assert_eq!(out, cpu, "--device gpu");
    } else {
        assert!(err.contains("--device gpu: no usable GPU"), "{err}");
        eprintln!("no GPU here: --device gpu refused as it should be");
    }
    // osdmaptool's refusals: an existing file without --clobber, no OSDs
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_iolift"),
        &["osdmap", "--createsimple", "3", &f],
    );
    assert_eq!(code, 255, "{err}");
    assert!(err.contains("exists, --clobber to overwrite"), "{err}");
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_iolift"),
        &["osdmap", "--createsimple", "0", "--clobber", &f],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("osd count must be > 0"), "{err}");
}

/// `PG -> up set` from osdmaptool's `--test-map-pgs-dump-all`.
fn up_sets(dump: &str) -> BTreeMap<String, Vec<i32>> {
    dump.lines()
        .filter(|l| l.contains(" raw ("))
        .map(|l| {
            let pg = l.split_whitespace().next().unwrap().to_string();
            let up = l.split(" up ([").nth(1).unwrap().split(']').next().unwrap();
            let v = if up.is_empty() {
                vec![]
            } else {
                up.split(',').map(|x| x.parse().unwrap()).collect()
            };
            (pg, v)
        })
        .collect()
}

/// What the diff report must say, computed from two osdmaptool dumps:
/// the changed PGs (sorted as Ceph sorts them) and per-OSD in/out counts.
fn expected(
    old: &str,
    new: &str,
    erasure_pools: &[&str],
) -> (Vec<String>, BTreeMap<i32, (u64, u64)>) {
    let (a, b) = (up_sets(old), up_sets(new));
    let mut changed = Vec::new();
    let mut per: BTreeMap<i32, (u64, u64)> = BTreeMap::new();
    for (pg, o) in &a {
        let n = &b[pg];
        if o == n {
            continue;
        }
        changed.push(pg.clone());
        let ec = erasure_pools.contains(&pg.split('.').next().unwrap());
        let none = 0x7fff_ffff;
        if ec {
            for i in 0..o.len().max(n.len()) {
                let (x, y) = (*o.get(i).unwrap_or(&none), *n.get(i).unwrap_or(&none));
                if x != y {
                    if y != none {
                        per.entry(y).or_default().0 += 1;
                    }
                    if x != none {
                        per.entry(x).or_default().1 += 1;
                    }
                }
            }
        } else {
            for y in n.iter().filter(|y| !o.contains(y)) {
                per.entry(*y).or_default().0 += 1;
            }
            for x in o.iter().filter(|x| !n.contains(x)) {
                per.entry(*x).or_default().1 += 1;
            }
        }
    }
    (changed, per)
}

fn check_report(report: &str, want: &(Vec<String>, BTreeMap<i32, (u64, u64)>), what: &str) {
    let listed: Vec<String> = report
        .lines()
        .filter_map(|l| l.strip_prefix("pg "))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    let mut sorted = want.0.clone();
    sorted.sort_by_key(|pg| {
        let (p, s) = pg.split_once('.').unwrap();
        (
            p.parse::<u64>().unwrap(),
            u32::from_str_radix(s, 16).unwrap(),
        )
    });
    assert_eq!(listed, sorted, "{what}: changed PGs");
    assert!(
        report.contains(&format!("pgs changed {} (", want.0.len())),
        "{what}: {report}"
    );
    let per: BTreeMap<i32, (u64, u64)> = report
        .lines()
        .filter(|l| l.starts_with("osd."))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let o = w[0][4..].parse().unwrap();
            (o, (w[2].parse().unwrap(), w[4].parse().unwrap()))
        })
        .collect();
    assert_eq!(per, want.1, "{what}: shards per OSD");
    let tin: u64 = want.1.values().map(|v| v.0).sum();
    let tout: u64 = want.1.values().map(|v| v.1).sum();
    assert!(
        report.contains(&format!("shards moved in {tin} out {tout}")),
        "{what}: {report}"
    );
    assert!(
        !want.0.is_empty(),
        "{what}: the edit moved nothing; a useless test"
    );
}

/// A 64-OSD map: 60 OSDs in 6 straw2 hosts under root "root" (crushtool
/// --build) plus an erasure rule, OSDs 0..63 up and in; pools: rbd (1,
/// replicated, 512 PGs) and an erasure pool 2 (k+m = 4, 256 PGs).
fn test_map(d: &ToolDir) -> String {
    let m = d.p("old.bin");
    createsimple(
        &d.file("old.bin"),
        64,
        &["--with-default-pool", "--pg_bits", "3"],
    );
    let c = d.p("c.bin");
    crush_build_straw2(&d.file("c.bin"), 60, &[("host", 10)]);
    let text = ok("crushtool", &["-d", &c]);
    let ec_rule = "rule ec_rule {\n\tid 1\n\ttype erasure\n\tmin_size 3\n\tmax_size 6\n\t\
                   step set_chooseleaf_tries 5\n\tstep take root\n\t\
                   step chooseleaf indep 0 type host\n\tstep emit\n}\n";
    let text = text.replace("# end crush map", &format!("{ec_rule}# end crush map"));
    let t = d.p("c.txt");
    std::fs::write(&t, text).unwrap();
    ok("crushtool", &["-c", &t, "-o", &c]);
    ok("osdmaptool", &[&m, "--import-crush", &c]);
    iolift(&[&m, "--mark-up-in", "--save"]);
    let mut map = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    map.add_pool_like(1, 2, "ec", 3, 4, 1, 256).unwrap();
    std::fs::write(&m, iolift_osdmap::encode(&map)).unwrap();
    m
}

fn dump(map: &str, extra: &[&str]) -> String {
    let mut a = vec![map, "--test-map-pgs-dump-all"];
    a.extend_from_slice(extra);
    ok("osdmaptool", &a)
}

#[test]
fn diff_and_what_if_agree_with_osdmaptool() {
    let d = ToolDir::new("osdtools-diff");
    let old = test_map(&d);
    let base = dump(&old, &[]);

    // mark out: osdmaptool --mark-out
    let want = expected(&base, &dump(&old, &["--mark-out", "7"]), &["2"]);
    let r = iolift(&[&old, "--what-if", "out:7", "--list"]);
    check_report(&r, &want, "out:7");

    // a crush weight changed by crushtool, imported by osdmaptool
    let new = d.p("new.bin");
    std::fs::copy(&old, &new).unwrap();
    let (c, c2) = (d.p("x.bin"), d.p("x2.bin"));
    ok("osdmaptool", &[&new, "--export-crush", &c]);
    ok(
        "crushtool",
        &["-i", &c, "--reweight-item", "osd.13", "0.25", "-o", &c2],
    );
    ok("osdmaptool", &[&new, "--import-crush", &c2]);
    let want = expected(&base, &dump(&new, &[]), &["2"]);
    check_report(
        &iolift(&["diff", &old, &new, "--list"]),
        &want,
        "diff crush weight",
    );
    check_report(
        &iolift(&[
            &old,
            "--what-if",
            "crush-weight:13:0.25",
            "--list",
            "--threads",
            "3",
        ]),
        &want,
        "what-if crush-weight",
    );
    // --pool restricts the comparison to one pool
    let r = iolift(&["diff", &old, &new, "--pool", "2", "--list"]);
    assert!(r
        .lines()
        .filter(|l| l.starts_with("pg "))
        .all(|l| l.starts_with("pg 2.")));

    // a host of 4 OSDs added under the root by crushtool
    let mut cur = c.clone();
    let steps: Vec<Vec<String>> = std::iter::once(
        ["--add-bucket", "newhost", "host", "--loc", "root", "root"]
            .map(String::from)
            .to_vec(),
    )
    .chain((60..64).map(|o| {
        vec![
            "--add-item".into(),
            o.to_string(),
            "1.5".into(),
            format!("osd.{o}"),
            "--loc".into(),
            "host".into(),
            "newhost".into(),
        ]
    }))
    .collect();
    for (i, s) in steps.iter().enumerate() {
        let next = d.p(&format!("h{i}.bin"));
        let mut a = vec!["-i", cur.as_str()];
        a.extend(s.iter().map(|x| x.as_str()));
        a.extend_from_slice(&["-o", &next]);
        ok("crushtool", &a);
        cur = next;
    }
    std::fs::copy(&old, &new).unwrap();
    ok("osdmaptool", &[&new, "--import-crush", &cur]);
    let want = expected(&base, &dump(&new, &[]), &["2"]);
    check_report(
        &iolift(&[&old, "--what-if", "add-host:newhost:4:1.5:root", "--list"]),
        &want,
        "what-if add-host",
    );
    check_report(
        &iolift(&["diff", &old, &new, "--list"]),
        &want,
        "diff add-host",
    );

    // a pool moved to another rule (the new map written by the library,
    // mapped by osdmaptool)
    let mut m = iolift_osdmap::decode(&std::fs::read(&old).unwrap()).unwrap();
    m.add_pool_like(1, 3, "r2", 1, 2, 0, 128).unwrap();
    std::fs::write(&old, iolift_osdmap::encode(&m)).unwrap();
    let base = dump(&old, &[]);
    m.pools.get_mut(&3).unwrap().size = 4;
    m.pools.get_mut(&3).unwrap().pool_type = 3;
    m.pools.get_mut(&3).unwrap().crush_rule = 1;
    std::fs::write(&new, iolift_osdmap::encode(&m)).unwrap();
    let want = expected(&base, &dump(&new, &[]), &["2"]);
    check_report(
        &iolift(&["diff", &old, &new, "--list"]),
        &want,
        "diff pool type",
    );

    // bad input: clear errors, no panic
    for (args, msg) in [
        (
            vec![old.as_str(), "--what-if", "out:99"],
            "osd.99 does not exist",
        ),
        (
            vec![old.as_str(), "--what-if", "reweight:1:2"],
            "bad weight",
        ),
        (vec![old.as_str(), "--what-if", "rule:9:0"], "no pool 9"),
        (
            vec![old.as_str(), "--what-if", "add-host:h:2:1:nope"],
            "no bucket named 'nope'",
        ),
        (vec![old.as_str(), "--what-if", "frob:1"], "unknown edit"),
        (vec!["diff", old.as_str()], "usage"),
        (
            vec!["diff", old.as_str(), new.as_str(), "--pool", "9"],
            "pool 9",
        ),
        (vec!["diff", old.as_str(), "/nonexistent"], "/nonexistent"),
    ] {
        let mut a = vec!["osdmap"];
        a.extend_from_slice(&args);
        let (code, _, err) = run(env!("CARGO_BIN_EXE_iolift"), &a);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}

/// Bytes moved: from a `ceph pg dump -f json`-shaped file, checked against
/// the shards counted and the sizes in the file.
#[test]
fn diff_bytes_from_pg_dump() {
    let d = ToolDir::new("osdtools-bytes");
    let old = test_map(&d);
    let n = iolift_osdmap::decode(&std::fs::read(&old).unwrap()).unwrap();
    // every PG of pool 1 holds 4096 * (seed + 1) bytes, of pool 2 8192
    // (its erasure-code profile is not in this map: pool 2 is left out)
    let mut j = String::from(r#"{"pg_ready":true,"pg_map":{"pg_stats":["#);
    for p in n.pools.values() {
        for s in 0..p.pg_num {
            let b = if p.id == 1 {
                4096 * (s as u64 + 1)
            } else {
                8192
            };
            j.push_str(&format!(
                r#"{{"pgid":"{}.{s:x}","state":"active+clean","stat_sum":{{"num_bytes":{b},"num_objects":1}}}},"#,
                p.id
            ));
        }
    }
    j.pop();
    j.push_str("]}}");
    let f = d.p("pgdump.json");
    std::fs::write(&f, j).unwrap();
    let r = iolift(&[
        &old,
        "--what-if",
        "out:3",
        "--list",
        "--pg-dump",
        &f,
        "--pool",
        "1",
    ]);
    let mut want = 0u64;
    for l in r.lines().filter_map(|l| l.strip_prefix("pg ")) {
        let pg = l.split_whitespace().next().unwrap();
        let (pool, seed) = pg.split_once('.').unwrap();
        let ins = l.split(" in [").nth(1).unwrap().split(']').next().unwrap();
        let k = ins.split(',').filter(|x| !x.is_empty()).count() as u64;
        assert_eq!(pool, "1");
        let per = 4096 * (u64::from_str_radix(seed, 16).unwrap() + 1);
        want += k * per;
    }
    assert!(want > 0, "{r}");
    assert!(r.contains(&format!("bytes moved {want}\n")), "{r}");
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_iolift"),
        &["osdmap", &old, "--what-if", "out:3", "--pg-dump", &old],
    );
    assert_eq!(code, 1);
    assert!(err.contains("pg dump"), "{err}");
    // an erasure pool whose profile the map lacks: named in the error
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_iolift"),
        &["osdmap", &old, "--what-if", "out:3", "--pg-dump", &f],
    );
    assert_eq!(code, 1);
    assert!(err.contains("pool 2: erasure-code profile"), "{err}");
}
