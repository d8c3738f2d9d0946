//! `iolift osdmap` against osdmaptool (Ceph 16.2, package ceph-base,
//! installed by scripts/test.sh) on the same maps: every report must be
//! identical byte for byte (osdmaptool's program name replaced by
//! iolift's). Maps: `--createsimple` (with and without the default pool,
//! --pg-bits/--pgp-bits), a 1000-OSD map with an imported 3-level straw2
//! crush map, more pools (replicated and erasure, with an erasure rule),
//! upmaps proposed and saved by `osdmaptool --upmap --save`, and pg_upmap,
//! pg_temp, primary_temp, primary affinity, down and out OSDs set through
//! the library (osdmaptool reads that map, so it is its own oracle).

use iolift_osdmap::types::POOL_ERASURE;
use iolift_osdmap::PgId;
use iolift_testkit::ceph_tools::{createsimple, crush_build_straw2, ToolDir};
use iolift_testkit::{tool_ok as ok, tool_output as run};
use std::path::{Path, PathBuf};

fn iolift(args: &[&str]) -> (i32, String, String) {
    let mut a = vec!["osdmap"];
    a.extend_from_slice(args);
    run(env!("CARGO_BIN_EXE_iolift"), &a)
}

/// Same stdout (and exit code) from both tools for `args` on `map`.
fn same(map: &Path, args: &[&str]) {
    let m = map.to_str().unwrap();
    let mut a = vec![m];
    a.extend_from_slice(args);
    let (c1, o1, e1) = run("osdmaptool", &a);
    let (c2, o2, e2) = iolift(&a);
    let o1 = o1.replace("osdmaptool: ", "iolift: ");
    assert_eq!(c1, c2, "{args:?}: exit codes; osdmaptool {e1} iolift {e2}");
    if o1 != o2 {
        let l1: Vec<&str> = o1.lines().collect();
        let l2: Vec<&str> = o2.lines().collect();
        let i = (0..l1.len().max(l2.len()))
            .find(|&i| l1.get(i) != l2.get(i))
            .unwrap_or(0);
        panic!(
            "{} {args:?}: first difference at line {}:\nosdmaptool: {:?}\niolift:     {:?}\n({} vs {} lines; iolift stderr {e2})",
            map.display(),
            i + 1,
            l1.get(i),
            l2.get(i),
            l1.len(),
            l2.len()
        );
    }
    assert!(c1 != 0 || !o1.is_empty(), "{args:?}: no output");
}

#[test]
fn createsimple_maps() {
    let d = ToolDir::new("osdmap-cli-simple");
    let a = d.file("a.bin");
    createsimple(&a, 4, &[]);
    same(&a, &["--test-map-pgs"]);
    same(&a, &["--mark-up-in", "--test-map-pgs-dump-all"]);
    for (n, extra) in [
        (4, vec!["--with-default-pool"]),
        (
            50,
            vec!["--with-default-pool", "--pg-bits", "4", "--pgp-bits", "2"],
        ),
    ] {
        let b = d.file("b.bin");
        createsimple(&b, n, &extra);
        same(&b, &["--test-map-pgs-dump-all"]);
        same(&b, &["--test-map-pgs"]);
        same(&b, &["--mark-up-in", "--test-map-pgs-dump-all"]);
        same(
            &b,
            &["--mark-up-in", "--mark-out", "2", "--test-map-pgs-dump"],
        );
        same(&b, &["--mark-up-in", "--test-map-pgs", "--pool", "1"]);
        same(&b, &["--mark-up-in", "--test-map-pgs", "--pg_num", "1000"]);
        for o in ["foo", "rbd_data.1234.0000000000000001", "x y"] {
            same(&b, &["--mark-up-in", "--test-map-object", o, "--pool", "1"]);
        }
        same(&b, &["--mark-up-in", "--test-map-object", "bar"]);
        // an empty name is no action: both fail (osdmaptool prints its usage)
        let bs = b.to_str().unwrap();
        let (c1, _, _) = run("osdmaptool", &[bs, "--test-map-object", ""]);
        let (c2, _, e2) = iolift(&[bs, "--test-map-object", ""]);
        assert_eq!((c1, c2), (1, 1), "{e2}");
        same(&b, &["--mark-up-in", "--test-map-pg", "1.1f"]);
        same(&b, &["--mark-up-in", "--test-map-pg", "7.0"]);
    }
}

/// A 1000-OSD map: 10 racks of 10 hosts of 10 OSDs, straw2, with a
/// replicated and an erasure rule, imported into a --createsimple map.
fn big(d: &ToolDir) -> PathBuf {
    let m = d.file("big.bin");
    createsimple(&m, 1000, &["--with-default-pool", "--pg-bits", "2"]);
    let c = d.file("big.crush");
    let cs = c.to_str().unwrap();
    crush_build_straw2(&c, 1000, &[("host", 10), ("rack", 10)]);
    let mut text = ok("crushtool", &["-d", cs]);
    let end = text.rfind("# end crush map").unwrap();
    text.insert_str(
        end,
        "rule ec_rule {\n\tid 1\n\ttype erasure\n\tmin_size 3\n\tmax_size 20\n\
         \tstep set_chooseleaf_tries 5\n\tstep set_choose_tries 100\n\tstep take root\n\
         \tstep chooseleaf indep 0 type host\n\tstep emit\n}\n",
    );
    let t = d.file("big.txt");
    std::fs::write(&t, text).unwrap();
    ok("crushtool", &["-c", t.to_str().unwrap(), "-o", cs]);
    ok("osdmaptool", &[m.to_str().unwrap(), "--import-crush", cs]);
    m
}

#[test]
fn big_map_with_pools_upmaps_temps_and_affinity() {
    let d = ToolDir::new("osdmap-cli-big");
    let m = big(&d);
    let ms = m.to_str().unwrap();
    // Pools of both kinds, through the library.
    let mut map = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    map.add_pool_like(1, 2, "two", 1, 2, 0, 300).unwrap();
    map.add_pool_like(1, 3, "ec", POOL_ERASURE, 6, 1, 512)
        .unwrap();
    map.add_pool_like(1, 5, "nohash", 1, 3, 0, 100).unwrap();
    map.pools.get_mut(&5).unwrap().flags = 0;
    map.pools.get_mut(&1).unwrap().pg_num = 2000;
    map.pools.get_mut(&1).unwrap().pgp_num = 1500;
    std::fs::write(&m, iolift_osdmap::encode(&map)).unwrap();
    same(&m, &["--mark-up-in", "--test-map-pgs-dump-all"]);

    // osdmaptool proposes upmaps and saves them (with --mark-up-in's states).
    let up = d.file("upmap.txt");
    ok(
        "osdmaptool",
        &[
            ms,
            "--mark-up-in",
            "--upmap",
            up.to_str().unwrap(),
            "--upmap-max",
            "60",
            "--upmap-deviation",
            "1",
            "--save",
        ],
    );
    let mut map = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    assert!(
        !map.pg_upmap_items.is_empty(),
        "osdmaptool --upmap --save wrote no upmaps: {}",
        std::fs::read_to_string(&up).unwrap()
    );
    let pg = |pool, seed| PgId { pool, seed };
    // Down and out OSDs, affinity, temps, explicit upmaps, invalid ones.
    for o in [3, 50, 51, 52, 999] {
        map.mark_out(o).unwrap();
    }
    for o in [7, 100, 101, 640] {
        map.mark_down(o).unwrap();
    }
    for (o, a) in [(0, 0), (1, 0x4000), (2, 0x8000), (10, 0), (11, 0xc000)] {
        map.set_primary_affinity(o, a).unwrap();
    }
    for o in 200..260 {
        map.set_primary_affinity(o, (o as u32 * 997) & 0xffff)
            .unwrap();
    }
    map.pg_temp.insert(pg(1, 3), vec![1, 2, 3]);
    map.pg_temp.insert(pg(1, 4), vec![7, 100, 5]); // some down
    map.pg_temp.insert(pg(3, 9), vec![1, 7, 2, 3, 4, 5]);
    map.pg_temp.insert(pg(1, 4000), vec![1, 2]); // beyond pg_num
    map.primary_temp.insert(pg(1, 5), 9);
    map.primary_temp.insert(pg(1, 3), 2);
    map.pg_upmap.insert(pg(1, 6), vec![10, 20, 30]);
    map.pg_upmap.insert(pg(1, 7), vec![10, 3, 30]); // 3 is out: ignored
    map.pg_upmap.insert(pg(3, 1), vec![1, 2, 3, 4, 5, 6]);
    map.pg_upmap.insert(pg(2, 299), vec![2000, 5]); // no such OSD
    map.pg_upmap_items.insert(pg(1, 8), vec![(0, 3), (1, 2)]);
    map.pg_upmap_items.insert(pg(2, 9), vec![(12345, 4)]);
    map.pg_upmap_items
        .insert(pg(3, 2), vec![(0, 999), (5, 6), (6, 5)]);
    std::fs::write(&m, iolift_osdmap::encode(&map)).unwrap();

    same(&m, &["--test-map-pgs-dump-all"]);
    same(&m, &["--test-map-pgs-dump"]);
    same(&m, &["--test-map-pgs"]);
    same(&m, &["--test-map-pgs-dump-all", "--pool", "3"]);
    same(&m, &["--test-map-pgs", "--pool", "9"]);
    same(
        &m,
        &["--mark-out", "12", "--test-map-pgs-dump-all", "--pool", "2"],
    );
    same(&m, &["--mark-up-in", "--test-map-pgs"]);
    for (o, p) in [
        ("a", "1"),
        ("b", "2"),
        ("rbd_header.abc", "3"),
        ("z", "5"),
        ("q", "8"),
    ] {
        same(&m, &["--test-map-object", o, "--pool", p]);
    }
    for p in ["1.3", "1.4", "1.6", "1.7", "3.2", "2.12b", "1.fa0"] {
        same(&m, &["--test-map-pg", p]);
    }
    // One thread and many give the same report.
    let (_, one, _) = iolift(&[ms, "--test-map-pgs-dump-all", "--threads", "1"]);
    let (_, many, _) = iolift(&[ms, "--test-map-pgs-dump-all", "--threads", "7"]);
    assert_eq!(one, many);

    // export: the same bytes; import: the same map file.
    let (e1, e2) = (d.file("e1.crush"), d.file("e2.crush"));
    ok("osdmaptool", &[ms, "--export-crush", e1.to_str().unwrap()]);
    let (code, _, err) = iolift(&[ms, "--export-crush", e2.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&e1).unwrap(), std::fs::read(&e2).unwrap());
    let (c1, c2) = (d.file("c1.bin"), d.file("c2.bin"));
    std::fs::copy(&m, &c1).unwrap();
    std::fs::copy(&m, &c2).unwrap();
    let c = d.file("big.crush");
    let cs = c.to_str().unwrap();
    let o1 = ok("osdmaptool", &[c1.to_str().unwrap(), "--import-crush", cs]);
    let (code, o2, err) = iolift(&[c2.to_str().unwrap(), "--import-crush", cs]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        o1.replace("osdmaptool: ", "iolift: "),
        o2.replace("c2.bin", "c1.bin")
    );
    assert_eq!(std::fs::read(&c1).unwrap(), std::fs::read(&c2).unwrap());

    // --save writes our in-memory edits; osdmaptool reads the result and
    // maps it as it maps the same edits made in memory.
    let s = d.file("saved.bin");
    std::fs::copy(&m, &s).unwrap();
    let ss = s.to_str().unwrap();
    let (code, _, err) = iolift(&[ss, "--mark-out", "33", "--save"]);
    assert_eq!(code, 0, "{err}");
    let a = ok("osdmaptool", &[ss, "--test-map-pgs-dump-all"]);
    let b = ok(
        "osdmaptool",
        &[ms, "--mark-out", "33", "--test-map-pgs-dump-all"],
    );
    assert_eq!(a, b.replace("marking OSD@33 as out\n", ""));
}

#[test]
fn bad_input_is_one_error_line() {
    let d = ToolDir::new("osdmap-cli-bad");
    let b = d.file("b.bin");
    createsimple(&b, 4, &["--with-default-pool"]);
    let bytes = std::fs::read(&b).unwrap();
    let cut = d.file("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    for (f, want) in [
        ("/dev/null", "truncated at byte 0"),
        (cut.to_str().unwrap(), "truncated at byte"),
        ("/nonexistent.bin", "reading /nonexistent.bin"),
    ] {
        let (code, out, err) = iolift(&[f, "--test-map-pgs"]);
        assert_eq!(code, 1, "{f}: {out}{err}");
        assert!(out.is_empty(), "{f}: {out}");
        let errs: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errs.len(), 1, "{f}: {err}");
        assert!(errs[0].contains(want), "{f}: {err}");
    }
    let bs = b.to_str().unwrap();
    let (code, _, err) = iolift(&[bs, "--test-map-pgs", "--pool", "9"]);
    assert_eq!((code, err.lines().last()), (1, Some("There is no pool 9")));
    let (code, _, err) = iolift(&[bs, "--import-crush", "/dev/null"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("decoding crush map /dev/null"), "{err}");
    let (code, _, err) = iolift(&[bs, "--test-map-pgs", "--device", "tpu"]);
    assert_eq!(code, 1, "{err}");
    // the map file is never written by a failed command
    assert_eq!(std::fs::read(&b).unwrap(), bytes);
}
