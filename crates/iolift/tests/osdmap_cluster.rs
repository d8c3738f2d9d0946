//! `iolift osdmap` on a map written by a real Ceph 16.2 cluster
//! (scripts/ceph-local.sh: mon, mgr, 3 memstore OSDs) after the changes
//! operators make: an erasure-coded pool beside the replicated one, a
//! pg-upmap-items entry, primary affinity, an OSD reweighted. The map from
//! `ceph osd getmap` must re-encode byte for byte; every osdmaptool
//! report on it must be identical to ours; `--test-map-object` must give
//! the PG and acting set `ceph osd map` gives.

mod common;
mod rbd_util;

use rbd_util::{run_limited, Cluster};
use std::process::Command;
use std::time::Duration;

fn ceph(cl: &Cluster, args: &[&str]) -> String {
    let mut c = Command::new("ceph");
    c.arg("-c")
        .arg(&cl.conf)
        .args(["--connect-timeout", "20"])
        .args(args);
    let (ok, out) = run_limited(&mut c, Duration::from_secs(90));
    assert!(ok, "ceph {args:?} failed:\n{out}");
    out
}

fn run(prog: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(prog).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ours(args: &[&str]) -> String {
    let mut a = vec!["osdmap"];
    a.extend_from_slice(args);
    let (code, out, err) = run(env!("CARGO_BIN_EXE_iolift"), &a);
    assert_eq!(code, 0, "iolift {a:?}: {err}");
    out
}

#[test]
fn cluster_map_round_trip_and_reports() {
    let cl = Cluster::start("16M", &[]);
    ceph(
        &cl,
        &[
            "osd",
            "erasure-code-profile",
            "set",
            "ecp",
            "k=2",
            "m=1",
            "crush-failure-domain=osd",
        ],
    );
    ceph(
        &cl,
        &[
            "osd", "pool", "create", "ecpool", "16", "16", "erasure", "ecp",
        ],
    );
    let pools = ceph(&cl, &["osd", "pool", "ls", "detail"]);
    let id_of = |name: &str| -> String {
        let l = pools
            .lines()
            .find(|l| l.contains(&format!(" '{name}' ")))
            .unwrap_or_else(|| panic!("no pool {name}:\n{pools}"));
        l.split_whitespace().nth(1).unwrap().to_string()
    };
    let (rbd, ec) = (id_of("rbd"), id_of("ecpool"));
    ceph(
        &cl,
        &["osd", "pool", "create", "two", "16", "16", "replicated"],
    );
    ceph(
        &cl,
        &[
            "osd",
            "pool",
            "set",
            "two",
            "size",
            "2",
            "--yes-i-really-mean-it",
        ],
    );
    ceph(&cl, &["osd", "set-require-min-compat-client", "luminous"]);
    ceph(&cl, &["osd", "reweight", "2", "0.6"]);
    // An upmap the monitor keeps must move a PG: find a PG of the size-2
    // pool that leaves out osd.0 or osd.1 and move one of its other OSDs
    // there (osd.2, reweighted, is never the source).
    let map = cl.cdir().join("osdmap.bin");
    let ms = map.to_str().unwrap();
    ceph(&cl, &["osd", "getmap", "-o", ms]);
    let m = iolift_osdmap::decode(&std::fs::read(&map).unwrap()).unwrap();
    let two = m.pool_by_name("two").expect("pool two").id;
    let mut mapper = iolift_osdmap::Mapper::new(&m);
    let mut p = iolift_osdmap::PgPlacement::default();
    let (pg, from, to) = (0..16)
        .find_map(|seed| {
            let pg = iolift_osdmap::PgId {
                pool: two as u64,
                seed,
            };
            mapper.map_pgid(pg, &mut p);
            let to = [0, 1].into_iter().find(|o| !p.up.contains(o))?;
            let from = p.up.iter().copied().find(|&o| o != 2)?;
            Some((pg, from, to))
        })
        .expect("a PG without osd.0 or osd.1");
    drop(mapper);
    let (pgs, froms, tos) = (pg.to_string(), from.to_string(), to.to_string());
    ceph(&cl, &["osd", "pg-upmap-items", &pgs, &froms, &tos]);
    ceph(&cl, &["osd", "primary-affinity", "osd.1", "0.25"]);
    ceph(&cl, &["osd", "getmap", "-o", ms]);

    let bytes = std::fs::read(&map).unwrap();
    let m = iolift_osdmap::decode(&bytes).unwrap();
    assert_eq!(iolift_osdmap::encode(&m), bytes, "re-encoding differs");
    assert!(m.pools.values().any(|p| p.is_erasure()), "no erasure pool");
    assert_eq!(
        m.pg_upmap_items.get(&pg),
        Some(&vec![(from, to)]),
        "upmap in the map"
    );
    assert!(m.primary_affinity.contains(&0x4000));

    let pg3 = format!("{rbd}.3");
    for args in [
        vec!["--test-map-pgs-dump-all"],
        vec!["--test-map-pgs-dump"],
        vec!["--test-map-pgs"],
        vec!["--test-map-pgs-dump-all", "--mark-out", "0"],
        vec!["--test-map-pg", pg3.as_str()],
    ] {
        let mut a = vec![ms];
        a.extend_from_slice(&args);
        let (code, want, err) = run("osdmaptool", &a);
        assert_eq!(code, 0, "osdmaptool {a:?}: {err}");
        assert_eq!(
            ours(&a),
            want.replace("osdmaptool: ", "iolift: "),
            "{args:?}"
        );
    }
    for (pool, id) in [("rbd", rbd.as_str()), ("ecpool", ec.as_str())] {
        for name in ["a", "rbd_data.10ab.0000000000000000", "obj-7", "zz"] {
            let want = ceph(&cl, &["osd", "map", pool, name]);
            // `... -> pg 1.8bd9a2e1 (1.1) -> up ([2,0,1], p2) acting ([2,0,1], p2)`
            let after_pg = want.split(" -> pg ").nth(1).unwrap();
            let pg = after_pg
                .split(" (")
                .nth(1)
                .unwrap()
                .split(')')
                .next()
                .unwrap();
            let acting = want
                .split("acting (")
                .nth(1)
                .unwrap()
                .split(", p")
                .next()
                .unwrap();
            let got = ours(&[ms, "--test-map-object", name, "--pool", id]);
            assert_eq!(
                got.trim(),
                format!("object '{name}' -> {pg} -> {}", acting.replace(' ', "")),
                "ceph osd map said: {want}"
            );
        }
    }
}
