//! `iolift osdmap` on a map written by a real Ceph 16.2 cluster
//! (scripts/ceph-local.sh: mon, mgr, 3 memstore OSDs) after the changes
//! operators make: an erasure-coded pool beside the replicated one, a
//! pg-upmap-items entry, primary affinity, an OSD reweighted. The map from
//! `ceph osd getmap` must re-encode byte for byte; every osdmaptool
//! report (and `--print`) on it must be identical to ours;
//! `--test-map-object` must give the PG and acting set `ceph osd map`
//! gives; the bytes a `--what-if` moves must follow the cluster's own
//! `ceph pg dump -f json`.

mod common;
mod rbd_util;

use rbd_util::{run_limited, Cluster};
use std::process::Command;
use std::time::Duration;

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
    cl.ceph(&[
        "osd",
        "erasure-code-profile",
        "set",
        "ecp",
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
    ]);
    cl.ceph(&[
        "osd", "pool", "create", "ecpool", "16", "16", "erasure", "ecp",
    ]);
    let pools = cl.ceph(&["osd", "pool", "ls", "detail"]);
    let id_of = |name: &str| -> String {
        let l = pools
            .lines()
            .find(|l| l.contains(&format!(" '{name}' ")))
            .unwrap_or_else(|| panic!("no pool {name}:\n{pools}"));
        l.split_whitespace().nth(1).unwrap().to_string()
    };
    let (rbd, ec) = (id_of("rbd"), id_of("ecpool"));
    cl.ceph(&["osd", "pool", "create", "two", "16", "16", "replicated"]);
    cl.ceph(&[
        "osd",
        "pool",
        "set",
        "two",
        "size",
        "2",
        "--yes-i-really-mean-it",
    ]);
    cl.ceph(&["osd", "set-require-min-compat-client", "luminous"]);
    cl.ceph(&["osd", "reweight", "2", "0.6"]);
    // An upmap the monitor keeps must move a PG: find a PG of the size-2
    // pool that leaves out osd.0 or osd.1 and move one of its other OSDs
    // there (osd.2, reweighted, is never the source).
    let map = cl.cdir().join("osdmap.bin");
    let ms = map.to_str().unwrap();
    cl.ceph(&["osd", "getmap", "-o", ms]);
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
    cl.ceph(&["osd", "pg-upmap-items", &pgs, &froms, &tos]);
    cl.ceph(&["osd", "primary-affinity", "osd.1", "0.25"]);
    cl.ceph(&["osd", "getmap", "-o", ms]);

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
            let want = cl.ceph(&["osd", "map", pool, name]);
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

    // --print: byte for byte (pools of both kinds with options, OSD
    // addresses, states, uuids, affinity, upmaps, the cluster's temps)
    let (code, want, err) = run("osdmaptool", &[ms, "--print"]);
    assert_eq!(code, 0, "{err}");
    assert!(want.contains("pg_upmap_items "), "{want}");
    assert_eq!(ours(&[ms, "--print"]), want, "--print");

    // bytes moved by a what-if, from the cluster's own `ceph pg dump`
    let data = cl.cdir().join("obj.bin");
    std::fs::write(&data, vec![7u8; 256 << 10]).unwrap();
    for pool in ["ecpool", "rbd", "two"] {
        for i in 0..8 {
            let obj = format!("obj-{i}");
            let mut c = Command::new("rados");
            c.arg("-c")
                .arg(&cl.conf)
                .args(["-p", pool, "put", &obj])
                .arg(&data);
            let (ok, out) = run_limited(&mut c, Duration::from_secs(90));
            assert!(ok, "rados put: {out}");
        }
    }
    // PG stats reach the manager every few seconds
    let dump = cl.cdir().join("pgdump.json");
    let ds = dump.to_str().unwrap();
    let mut sizes = String::new();
    for _ in 0..30 {
        cl.ceph(&["pg", "dump", "-f", "json", "-o", ds]);
        // an independent reader of the same file: python's json
        let (code, out, err) = run(
            "python3",
            &[
                "-c",
                "import json,sys\n\
                 d=json.load(open(sys.argv[1]))\n\
                 for s in d['pg_map']['pg_stats']: print(s['pgid'], s['stat_sum']['num_bytes'])",
                ds,
            ],
        );
        assert_eq!(code, 0, "{err}");
        sizes = out;
        let total: u64 = sizes
            .lines()
            .map(|l| l.split(' ').nth(1).unwrap().parse::<u64>().unwrap())
            .sum();
        if total >= 24 * (256 << 10) {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let bytes: std::collections::HashMap<&str, u64> = sizes
        .lines()
        .map(|l| {
            let (pg, b) = l.split_once(' ').unwrap();
            (pg, b.parse().unwrap())
        })
        .collect();
    // osd.2 back to full weight: shards of the size-2 and the erasure pool
    // move (with three OSDs, an OSD out would only leave holes)
    let r = ours(&[ms, "--what-if", "reweight:2:1", "--list", "--pg-dump", ds]);
    let mut want = 0u64;
    for l in r.lines().filter_map(|l| l.strip_prefix("pg ")) {
        let pg = l.split_whitespace().next().unwrap();
        let n_in = l.split(" in [").nth(1).unwrap().split(']').next().unwrap();
        let n_in = n_in.split(',').filter(|x| !x.is_empty()).count() as u64;
        let b = bytes[pg];
        // ecpool's profile has k=2: a shard is half the PG
        let shard = if pg.starts_with(&format!("{ec}.")) {
            b.div_ceil(2)
        } else {
            b
        };
        want += n_in * shard;
    }
    assert!(want > 0, "nothing moved with data in it:\n{r}");
    assert!(r.contains(&format!("bytes moved {want}\n")), "{r}");
}
