//! `iolift osdmap --upmap` / `--upmap-cleanup` against osdmaptool (Ceph
//! 16.2) on maps made by osdmaptool and crushtool: the saved map, placed
//! by osdmaptool, keeps one replica per host and is closer to the CRUSH
//! weight targets; the command file says exactly what the saved map
//! holds; the cleanup pass removes what osdmaptool's removes; bad flags
//! give clear errors.

use iolift_osdmap::types::OsdMap;
use iolift_osdmap::PgId;
use iolift_testkit::ceph_tools::{createsimple, crush_build_straw2, ToolDir};
use iolift_testkit::{tool_ok as ok, tool_output as run};
use std::collections::BTreeMap;

fn ours(args: &[&str]) -> (i32, String, String) {
    let mut a = vec!["osdmap"];
    a.extend_from_slice(args);
    run(env!("CARGO_BIN_EXE_iolift"), &a)
}

/// OSDS OSDs, 10 per host (host = osd / 10), 10 hosts per rack, uneven
/// weights, all up and in; pool 1 "rbd", size 3, OSDS << bits PGs.
fn make_map(d: &ToolDir, osds: u32, bits: u32) -> String {
    let m = d.p("m");
    let bits = bits.to_string();
    createsimple(
        &d.file("m"),
        osds,
        &["--with-default-pool", "--pg-bits", &bits],
    );
    crush_build_straw2(&d.file("c"), osds, &[("host", 10), ("rack", 10)]);
    let text = ok("crushtool", &["-d", &d.p("c")]);
    let edited: String = text
        .lines()
        .map(|l| match l.trim().strip_prefix("item osd.") {
            Some(rest) => {
                let o: u32 = rest.split_whitespace().next().unwrap().parse().unwrap();
                let w = [(7, "2.0"), (5, "0.5"), (11, "1.5")]
                    .iter()
                    .find(|(k, _)| o.is_multiple_of(*k))
                    .map_or("1.0", |x| x.1);
                format!("\titem osd.{o} weight {w}\n")
            }
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(d.p("c.txt"), edited).unwrap();
    ok("crushtool", &["-c", &d.p("c.txt"), "-o", &d.p("u")]);
    ok(
        "crushtool",
        &["-i", &d.p("u"), "--reweight", "-o", &d.p("u2")],
    );
    ok("osdmaptool", &[&m, "--import-crush", &d.p("u2")]);
    let (code, _, err) = ours(&[&m, "--mark-up-in", "--save"]);
    assert_eq!(code, 0, "{err}");
    m
}

/// Up sets as osdmaptool places the map in `file`.
fn up_sets(file: &str) -> BTreeMap<PgId, Vec<i32>> {
    ok("osdmaptool", &[file, "--test-map-pgs-dump-all"])
        .lines()
        .filter_map(|l| {
            let (pg, rest) = l.split_once(" raw ")?;
            let up = rest.split(" up ([").nth(1)?.split(']').next()?;
            let set = up
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap());
            Some((pg.parse().ok()?, set.collect()))
        })
        .collect()
}

/// Largest |shards - target| over the OSDs, targets by CRUSH weight.
fn max_dev(map: &OsdMap, sets: &BTreeMap<PgId, Vec<i32>>) -> f64 {
    let shape = iolift_osdmap::balancer::rule::analyze(map, 0).unwrap();
    let mut n = vec![0f64; map.max_osd as usize];
    sets.values().flatten().for_each(|&o| n[o as usize] += 1.0);
    let (tot, tw): (f64, f64) = (n.iter().sum(), shape.weight.iter().map(|&w| w as f64).sum());
    (0..n.len())
        .map(|o| (n[o] - tot * shape.weight[o] as f64 / tw).abs())
        .fold(0.0, f64::max)
}

/// `ceph osd pg-upmap-items PG A B ...` lines -> entries.
fn parse_cmds(text: &str) -> BTreeMap<PgId, Vec<(i32, i32)>> {
    text.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(&w[..3], ["ceph", "osd", "pg-upmap-items"], "{l}");
            assert!(w.len() >= 6 && w.len().is_multiple_of(2), "{l}");
            let pairs = w[4..]
                .chunks(2)
                .map(|c| (c[0].parse().unwrap(), c[1].parse().unwrap()))
                .collect();
            (w[3].parse().unwrap(), pairs)
        })
        .collect()
}

#[test]
fn saved_map_is_valid_for_osdmaptool_and_balanced() {
    let d = ToolDir::new("upmap-save");
    let m = make_map(&d, 300, 4);
    let orig = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    let before_sets = up_sets(&m);
    let before = max_dev(&orig, &before_sets);
    let cmds = d.p("cmds");
    let (code, out, err) = ours(&[
        &m,
        "--upmap",
        &cmds,
        "--upmap-max",
        "40",
        "--upmap-deviation",
        "1",
        "--save",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..4],
        [
            format!("writing upmap command output to: {cmds}").as_str(),
            "checking for upmap cleanups",
            "upmap, max-count 40, max deviation 1",
            "pools rbd ",
        ]
    );
    // --upmap-max bounds the PGs changed and the shards moved
    let k: usize = lines[4]
        .strip_prefix("prepared ")
        .and_then(|r| r.strip_suffix("/40 changes"))
        .unwrap_or_else(|| panic!("{out}"))
        .parse()
        .unwrap();
    assert!(k > 20, "{out}");
    assert!(lines[5].starts_with("iolift: writing epoch "), "{out}");

    let items = parse_cmds(&std::fs::read_to_string(&cmds).unwrap());
    assert_eq!(items.len(), k);
    assert!(items.values().map(Vec::len).sum::<usize>() <= 40);
    let saved = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    assert_eq!(
        saved.pg_upmap_items, items,
        "the saved map holds what the commands say"
    );
    let sets = up_sets(&m);
    assert_eq!(sets.len(), 300 << 4);
    for (pg, s) in &sets {
        let mut hosts: Vec<i32> = s.iter().map(|o| o / 10).collect();
        hosts.sort();
        hosts.dedup();
        assert_eq!(
            (s.len(), hosts.len()),
            (3, 3),
            "{pg} {s:?}: one replica per host"
        );
        match items.get(pg) {
            Some(pairs) => {
                for (f, t) in pairs {
                    assert!(s.contains(t) && !s.contains(f), "{pg} {s:?} {pairs:?}");
                }
            }
            None => assert_eq!(Some(s), before_sets.get(pg), "{pg} moved without an upmap"),
        }
    }
    let after = max_dev(&saved, &sets);
    assert!(after < before, "max deviation {before} -> {after}");

    // A second run on the saved map finds nothing to clean and keeps going.
    let (code, out, err) = ours(&[
        &m,
        "--upmap",
        "-",
        "--upmap-max",
        "5",
        "--upmap-deviation",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("rm-pg-upmap"), "{out}");
    assert!(
        out.contains("/5 changes") && !out.contains("prepared 0/5"),
        "{out}"
    );
}

#[test]
fn cleanup_removes_what_osdmaptool_removes() {
    let d = ToolDir::new("upmap-clean");
    let m = make_map(&d, 100, 3);
    let mut map = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    let mut mapper = iolift_osdmap::Mapper::new(&map);
    let mut p = iolift_osdmap::PgPlacement::default();
    let mut add = BTreeMap::new();
    for seed in 0..40u32 {
        let pg = PgId { pool: 1, seed };
        mapper.map_pgid(pg, &mut p);
        let (a, b) = (p.up[0], p.up[1]);
        // an OSD on a host the PG does not use
        let free = (0..100)
            .find(|o| !p.up.iter().any(|u| u / 10 == o / 10))
            .unwrap();
        let items = match seed % 4 {
            0 => vec![(a, free)],                       // valid: kept
            1 => vec![((a + 50) % 100, free)],          // source not in the set
            2 => vec![(a, b / 10 * 10 + (b + 1) % 10)], // two replicas on one host
            _ => vec![(a, 99)],                         // target out (below)
        };
        add.insert(pg, items);
    }
    drop(mapper);
    map.pg_upmap_items.extend(add);
    map.mark_out(99).unwrap();
    std::fs::write(&m, iolift_osdmap::encode(&map)).unwrap();
    let (code, want, err) = run("osdmaptool", &[&m, "--upmap-cleanup", "-"]);
    assert_eq!(code, 0, "{err}");
    let (code, got, err) = ours(&[&m, "--upmap-cleanup", "-"]);
    assert_eq!(code, 0, "{err}");
    let rm = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.contains("upmap"))
            .map(String::from)
            .collect()
    };
    assert!(
        rm(&want).len() >= 10,
        "osdmaptool removed too little:\n{want}"
    );
    assert_eq!(rm(&got), rm(&want));
}

#[test]
fn bad_flags_are_clear_errors() {
    let d = ToolDir::new("upmap-bad");
    let m = make_map(&d, 20, 2);
    for (args, want) in [
        (
            vec!["--upmap", "-", "--upmap-deviation", "0"],
            "upmap-deviation must be >= 1",
        ),
        (
            vec!["--upmap", "-", "--upmap-pool", "nope"],
            "pool nope does not exist",
        ),
        (vec!["--upmap", "-", "--upmap-max", "-1"], "--upmap-max"),
        (vec!["--upmap", "-", "--upmap-max", "ten"], "--upmap-max"),
        (vec!["--upmap", ""], "empty file name"),
        (vec!["--upmap", "/nonexistent-dir/x"], "/nonexistent-dir/x"),
    ] {
        let mut a = vec![m.as_str()];
        a.extend_from_slice(&args);
        let (code, _, err) = ours(&a);
        assert_ne!(code, 0, "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
