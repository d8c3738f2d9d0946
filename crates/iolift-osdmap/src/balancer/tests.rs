//! The balancer on maps made by osdmaptool and crushtool (Ceph 16.2),
//! judged by osdmaptool: the balanced map's up sets as osdmaptool places
//! them must be ours, keep one replica per host, and be closer to the
//! targets than before.

use super::{calc_pool, clean};
use crate::types::{OsdMap, PgId};
use iolift_testkit::ceph_tools::{createsimple, crush_build_straw2, ToolDir};
use iolift_testkit::tool_ok as sh;
use std::process::Command;

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--help").output().is_ok()
}

/// 200 OSDs, 10 per host, 10 hosts per rack, uneven weights, all up and
/// in; one size-3 pool of 6400 PGs whose rule puts replicas on hosts.
fn make_map(dir: &ToolDir) -> OsdMap {
    let p = |f: &str| dir.p(f);
    createsimple(
        &dir.file("m"),
        200,
        &["--with-default-pool", "--pg-bits", "5"],
    );
    crush_build_straw2(&dir.file("c"), 200, &[("host", 10), ("rack", 10)]);
    let text = sh("crushtool", &["-d", &p("c")]);
    let mut out = String::new();
    for l in text.lines() {
        let mut l = l.to_string();
        if let Some(rest) = l.trim().strip_prefix("item osd.") {
            let n: u32 = rest.split_whitespace().next().unwrap().parse().unwrap();
            let w = if n.is_multiple_of(7) {
                "2.000"
            } else if n.is_multiple_of(5) {
                "0.500"
            } else {
                "1.000"
            };
            l = format!("\titem osd.{n} weight {w}");
        }
        out.push_str(&l);
        out.push('\n');
    }
    std::fs::write(p("c.txt"), out).unwrap();
    sh("crushtool", &["-c", &p("c.txt"), "-o", &p("u")]);
    sh("crushtool", &["-i", &p("u"), "--reweight", "-o", &p("u2")]);
    sh("osdmaptool", &[&p("m"), "--import-crush", &p("u2")]);
    let mut m = crate::decode(&std::fs::read(p("m")).unwrap()).unwrap();
    for o in 0..m.max_osd {
        m.mark_up_in(o).unwrap();
    }
    m
}

/// Up sets per PG as osdmaptool places them in `file`.
fn osdmaptool_up(file: &str) -> Vec<(PgId, Vec<i32>)> {
    let out = sh("osdmaptool", &[file, "--test-map-pgs-dump-all"]);
    out.lines()
        .filter_map(|l| {
            let (pg, rest) = l.split_once(" raw ")?;
            let up = rest
                .split(" up (")
                .nth(1)?
                .split(']')
                .next()?
                .trim_start_matches('[');
            let set = up
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            Some((pg.parse().ok()?, set))
        })
        .collect()
}

/// Largest |count - target| by CRUSH weight share, from osdmaptool's sets.
fn max_dev(m: &OsdMap, sets: &[(PgId, Vec<i32>)]) -> f64 {
    let mut count = vec![0f64; m.max_osd as usize];
    for (_, s) in sets {
        for &o in s {
            count[o as usize] += 1.0;
        }
    }
    let shape = super::rule::analyze(m, 0).unwrap();
    let tw: f64 = shape.weight.iter().map(|&w| w as f64).sum();
    let total: f64 = count.iter().sum();
    (0..count.len())
        .map(|o| (count[o] - total * shape.weight[o] as f64 / tw).abs())
        .fold(0.0, f64::max)
}

#[test]
fn balanced_map_is_valid_for_osdmaptool_and_closer_to_targets() {
    if !have("osdmaptool") || !have("crushtool") {
        eprintln!("SKIPPED: needs osdmaptool and crushtool (apt install ceph-base)");
        return;
    }
    let dir = ToolDir::new("upmap-unit");
    let mut m = make_map(&dir);
    let file = dir.p("m");
    std::fs::write(&file, crate::encode(&m)).unwrap();
    let before = max_dev(&m, &osdmaptool_up(&file));

    assert!(clean(&m).is_empty(), "a fresh map needs no cleanup");
    let r = calc_pool(&m, 1, 1.0, 60, 0).unwrap();
    assert!(r.skipped.is_none(), "{:?}", r.skipped);
    assert!(
        !r.changes.is_empty() && r.changes.len() <= 60,
        "{:?}",
        r.changes.len()
    );
    assert!(r.after.0 < r.before.0, "{:?} -> {:?}", r.before, r.after);
    r.changes.apply(&mut m);
    std::fs::write(&file, crate::encode(&m)).unwrap();
    assert!(clean(&m).is_empty(), "our own upmaps need no cleanup");

    let sets = osdmaptool_up(&file);
    assert_eq!(sets.len(), 6400);
    let mut mapper = crate::Mapper::new(&m);
    let mut p = crate::PgPlacement::default();
    for (pg, s) in &sets {
        // crushtool --build numbers hosts in OSD order: host = osd / 10
        let mut hosts: Vec<i32> = s.iter().map(|o| o / 10).collect();
        hosts.sort();
        hosts.dedup();
        assert_eq!(hosts.len(), 3, "{pg}: {s:?} shares a host");
        mapper.map_pgid(*pg, &mut p);
        assert_eq!(&p.up, s, "{pg}");
    }
    let after = max_dev(&m, &sets);
    assert!(after < before, "max deviation {before} -> {after}");
}
