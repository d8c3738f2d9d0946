//! `iolift osdmap --upmap` on a map from a real Ceph 16.2 cluster
//! (scripts/ceph-local.sh: mon, mgr, 4 memstore OSDs, pool `rbd` of 64
//! PGs, size 2): every proposed `ceph osd pg-upmap-items` command is
//! accepted by the monitor, the monitor's map then holds exactly those
//! entries, and the up sets the monitor gives (`ceph pg map`) and the
//! ones of the new map are the ones our saved map predicted.

mod rbd_util;

use rbd_util::Cluster;
use std::process::Command;

fn up_of(m: &iolift_osdmap::OsdMap, pg: iolift_osdmap::PgId) -> Vec<i32> {
    let mut p = iolift_osdmap::PgPlacement::default();
    iolift_osdmap::Mapper::new(m).map_pgid(pg, &mut p);
    p.up
}

#[test]
fn cluster_accepts_our_upmaps_and_places_as_predicted() {
    let cl = Cluster::start(
        "16M",
        &[
            ("CEPH_LOCAL_OSDS", "4"),
            ("CEPH_LOCAL_PG", "64"),
            ("CEPH_LOCAL_POOL_SIZE", "2"),
            ("CEPH_LOCAL_IMAGE", ""),
            ("CEPH_LOCAL_TIMEOUT", "145"),
        ],
    );
    cl.ceph(&["osd", "set-require-min-compat-client", "luminous"]);
    // the manager's own balancer must not add entries meanwhile
    cl.ceph(&["balancer", "off"]);
    let dir = cl.cdir();
    let (m, saved, cmds) = (dir.join("map.bin"), dir.join("saved.bin"), dir.join("cmds"));
    let (ms, ss, cs) = (
        m.to_str().unwrap(),
        saved.to_str().unwrap(),
        cmds.to_str().unwrap(),
    );
    cl.ceph(&["osd", "getmap", "-o", ms]);
    std::fs::copy(&m, &saved).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_iolift"))
        .args(["osdmap", ss, "--upmap", cs, "--upmap-deviation", "1"])
        .args(["--upmap-max", "20", "--save"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&cmds).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        !lines.is_empty(),
        "64 PGs on 4 OSDs within 1 PG of target?\n{out}"
    );
    assert!(
        out.contains(&format!("prepared {}/20 changes", lines.len())),
        "{out}"
    );
    let mut want = std::collections::BTreeMap::new();
    for l in &lines {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(&w[..3], ["ceph", "osd", "pg-upmap-items"], "{l}");
        cl.ceph(&w[1..]);
        let pairs: Vec<(i32, i32)> = w[4..]
            .chunks(2)
            .map(|c| (c[0].parse().unwrap(), c[1].parse().unwrap()))
            .collect();
        want.insert(w[3].parse::<iolift_osdmap::PgId>().unwrap(), pairs);
    }
    cl.ceph(&["osd", "getmap", "-o", ms]);
    let now = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    let ours = iolift_osdmap::decode(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(now.pg_upmap_items, want, "the monitor kept what we sent");
    assert_eq!(ours.pg_upmap_items, want, "our saved map");
    let pool = now.pool_by_name("rbd").expect("pool rbd");
    for seed in 0..pool.pg_num {
        let pg = iolift_osdmap::PgId {
            pool: pool.id as u64,
            seed,
        };
        assert_eq!(up_of(&now, pg), up_of(&ours, pg), "{pg}");
    }
    for pg in want.keys() {
        // "osdmap eN pg P (P) -> up [a,b] acting [a,b]"
        let s = cl.ceph(&["pg", "map", &pg.to_string()]);
        let up = s
            .split("up [")
            .nth(1)
            .and_then(|r| r.split(']').next())
            .unwrap_or_else(|| panic!("ceph pg map {pg}: {s}"));
        let up: Vec<i32> = up.split(',').map(|x| x.trim().parse().unwrap()).collect();
        assert_eq!(up, up_of(&ours, *pg), "{pg}: ceph pg map says {s}");
        for (f, t) in &want[pg] {
            assert!(up.contains(t) && !up.contains(f), "{pg}: {up:?}");
        }
    }
}
