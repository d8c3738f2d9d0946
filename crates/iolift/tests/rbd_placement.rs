//! `iolift crush map-object` against a real Ceph cluster's own answer: the
//! cluster's crush map (`ceph osd getcrushmap`) and pool parameters (`ceph
//! osd pool ls detail`), then for many object names (with and without a
//! namespace) `ceph osd map` must give the same raw hash, PG and up set as
//! iolift's object -> PG -> OSD placement. The pool is the test's own, on
//! the suite's shared cluster (iolift_testkit::ceph).

mod common;
mod rbd_util;

use common::*;
use rbd_util::Cluster;
use std::process::Command;

/// The token after `key` in a whitespace-separated line.
fn after<'a>(line: &'a str, key: &str) -> &'a str {
    let t: Vec<&str> = line.split_whitespace().collect();
    let i = t
        .iter()
        .position(|x| *x == key)
        .unwrap_or_else(|| panic!("no {key:?} in {line:?}"));
    t[i + 1]
}

/// From `... -> pg 1.6cf8deff (1.1f) -> up ([2,0,1], p2) acting ...`:
/// (raw hash, pgid, up set).
fn parse_ceph_map(out: &str) -> (u32, String, Vec<i32>) {
    let l = out
        .lines()
        .find(|l| l.contains(" -> pg "))
        .unwrap_or_else(|| panic!("unexpected `ceph osd map` output:\n{out}"));
    let raw = after(l, "pg");
    let hash = u32::from_str_radix(raw.split('.').nth(1).unwrap(), 16).unwrap();
    let pgid = after(l, raw)
        .trim_matches(|c| c == '(' || c == ')')
        .to_string();
    let up = l.split("up ([").nth(1).unwrap().split(']').next().unwrap();
    let up = up.split(',').map(|x| x.trim().parse().unwrap()).collect();
    (hash, pgid, up)
}

/// From `object 'o' -> hash 0x6cf8deff -> pg 1.1f -> pps N -> [5, 0, 10]`.
fn parse_ours(out: &str) -> (u32, String, Vec<i32>) {
    let l = out
        .lines()
        .find(|l| l.contains(" -> pg "))
        .unwrap_or_else(|| panic!("unexpected map-object output:\n{out}"));
    let hash = u32::from_str_radix(after(l, "hash").trim_start_matches("0x"), 16).unwrap();
    let pgid = after(l, "pg").to_string();
    let set = l.rsplit('[').next().unwrap().trim_end_matches(']');
    let set = set.split(',').map(|x| x.trim().parse().unwrap()).collect();
    (hash, pgid, set)
}

#[test]
fn map_object_matches_ceph_osd_map() {
    let cl = Cluster::shared("rbd", 3, None);
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("crush.bin");
    cl.ceph(&["osd", "getcrushmap", "-o", map.to_str().unwrap()]);
    let detail = cl.ceph(&["osd", "pool", "ls", "detail"]);
    let line = detail
        .lines()
        .find(|l| l.contains(&format!("'{}'", cl.pool)))
        .unwrap_or_else(|| panic!("pool {} not in:\n{detail}", cl.pool));
    let (pool_id, size, rule) = (
        after(line, "pool"),
        after(line, "size"),
        after(line, "crush_rule"),
    );
    let (pg_num, pgp_num) = (after(line, "pg_num"), after(line, "pgp_num"));
    let hashpspool = line.contains("hashpspool");
    assert!(pg_num.parse::<u32>().unwrap() > 1, "{line}");

    let names: Vec<String> = (0..24)
        .map(|i| format!("rbd_data.{:x}.{:016x}", 0x1234 + i, i * 977))
        .chain(["a", "", "obj with spaces", "ünïcode"].map(String::from))
        .collect();
    let mut compared = 0;
    let mut pgs = std::collections::BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        if name.is_empty() {
            continue;
        }
        // Every fourth object in a namespace (object_locator nspace).
        let ns = (i % 4 == 3).then_some("ns1");
        let mut args = vec!["osd", "map", cl.pool.as_str(), name.as_str()];
        if let Some(n) = ns {
            args.push(n);
        }
        let theirs = parse_ceph_map(&cl.ceph(&args));

        let mut c = Command::new(iolift_bin());
        c.args(["crush", "map-object", "-i", map.to_str().unwrap()])
            .args([
                "--pool-id",
                pool_id,
                "--pg-num",
                pg_num,
                "--pgp-num",
                pgp_num,
            ])
            .args(["--rule", rule, "--num-rep", size]);
        if hashpspool {
            c.arg("--hashpspool");
        }
        if let Some(n) = ns {
            c.args(["--namespace", n]);
        }
        c.arg(name);
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "map-object {name:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours = parse_ours(&text);
        assert_eq!(
            ours, theirs,
            "object {name:?} (namespace {ns:?}): iolift {text:?} vs ceph osd map"
        );
        pgs.insert(ours.1);
        compared += 1;
    }
    assert_eq!(compared, names.len() - 1);
    // The names spread over several PGs, so pg_num/stable_mod was exercised.
    assert!(pgs.len() >= 8, "only {} distinct PGs", pgs.len());
}
