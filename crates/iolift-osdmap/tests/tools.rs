//! `print_text` and `create::build_simple` against Ceph's osdmaptool
//! (package ceph-base, installed by scripts/test.sh): the printed summary
//! of a map equals `osdmaptool --print` byte for byte, on osdmaptool's own
//! maps and on maps edited through the library (existing, down and out
//! OSDs, affinity, temps, upmaps); a map from `build_simple` is the map
//! `osdmaptool --createsimple` writes, byte for byte once the creation
//! time is the same.

use iolift_osdmap::types::{OsdMap, PgId};
use iolift_osdmap::{decode, encode};
use iolift_testkit::ceph_tools::ToolDir;
use iolift_testkit::tool_ok;
use std::path::{Path, PathBuf};

fn osdmaptool(args: &[&str]) -> String {
    tool_ok("osdmaptool", args)
}

fn createsimple(dir: &Path, name: &str, n: u32, extra: &[&str]) -> PathBuf {
    let p = dir.join(name);
    iolift_testkit::ceph_tools::createsimple(&p, n, extra);
    p
}

/// Write `m` to `p` and compare our `--print` with osdmaptool's.
fn same_print(m: &OsdMap, p: &Path) {
    std::fs::write(p, encode(m)).unwrap();
    let want = osdmaptool(&[p.to_str().unwrap(), "--print"]);
    let got = m.print_text().unwrap();
    assert_eq!(got, want, "--print of {}", p.display());
}

#[test]
fn print_equals_osdmaptool() {
    let d = ToolDir::new("osdtools-print");
    for (name, n, extra) in [
        ("a", 4, vec!["--with-default-pool"]),
        ("b", 3, vec![]),
        (
            "c",
            50,
            vec!["--with-default-pool", "--pg_bits", "3", "--pgp_bits", "2"],
        ),
    ] {
        let p = createsimple(d.path(), name, n, &extra);
        let m = decode(&std::fs::read(&p).unwrap()).unwrap();
        same_print(&m, &p);
    }
    // a map edited through the library: OSDs that exist, up or down, in,
    // out or reweighted, an affinity, temps, upmaps, a second pool
    let p = createsimple(d.path(), "e", 8, &["--with-default-pool"]);
    let mut m = decode(&std::fs::read(&p).unwrap()).unwrap();
    for o in 0..7 {
        m.mark_up_in(o).unwrap();
    }
    m.mark_down(2).unwrap();
    m.mark_out(3).unwrap();
    m.set_weight(4, 0x9999).unwrap();
    m.set_primary_affinity(5, 0x4000).unwrap();
    m.add_pool_like(1, 7, "ec", 3, 4, 0, 32).unwrap();
    let pg = |pool, seed| PgId { pool, seed };
    m.pg_temp.insert(pg(1, 3), vec![1, 0, 2]);
    m.primary_temp.insert(pg(1, 4), 6);
    m.pg_upmap.insert(pg(1, 0x1f), vec![0, 1, 4]);
    m.pg_upmap_items.insert(pg(1, 0x20), vec![(0, 6), (1, 5)]);
    m.flags = (1 << 7) | (1 << 15) | (1 << 14);
    same_print(&m, &p);
}

#[test]
fn createsimple_equals_osdmaptool() {
    let d = ToolDir::new("osdtools-create");
    for (n, pool, pg_bits, pgp_bits) in [
        (1, false, 6, 6),
        (4, true, 6, 6),
        (5, true, 2, 1),
        (13, true, 3, 5),
        (300, true, 4, 4),
    ] {
        let (pb, ppb) = (pg_bits.to_string(), pgp_bits.to_string());
        let mut extra = vec!["--pg_bits", pb.as_str(), "--pgp_bits", ppb.as_str()];
        if pool {
            extra.push("--with-default-pool");
        }
        let p = createsimple(d.path(), "m", n, &extra);
        let want = std::fs::read(&p).unwrap();
        let theirs = decode(&want).unwrap();
        let mut m =
            iolift_osdmap::create::build_simple(n as i32, pg_bits, pgp_bits, pool, theirs.created)
                .unwrap();
        // osdmaptool writes the map it built at epoch 0 as epoch 1
        m.epoch += 1;
        let got = encode(&m);
        let at = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(
            got == want,
            "--createsimple {n} pool={pool} pg_bits={pg_bits} pgp_bits={pgp_bits}: \
             {} vs {} bytes, first difference at {at:?}",
            got.len(),
            want.len()
        );
    }
    for bad in [0, -1] {
        let e = iolift_osdmap::create::build_simple(bad, 6, 6, true, Default::default());
        assert!(e.unwrap_err().to_string().contains("osd count"));
    }
    let e = iolift_osdmap::create::build_simple(1 << 12, 21, 6, true, Default::default());
    assert!(e.unwrap_err().to_string().contains("pg_num"));
}
