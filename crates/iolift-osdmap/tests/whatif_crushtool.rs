//! What-if CRUSH edits against crushtool (package ceph-base, installed by
//! scripts/test.sh): `add-host` and `crush-weight` on an osdmaptool map give
//! the bucket and item weights that crushtool's `--add-bucket`/`--add-item`
//! and `--reweight-item` write, for weights whose 16.16 value depends on
//! converting through single precision as Ceph does (4.097: 268501, where
//! a double-precision product truncates to 268500).

use iolift_crush::CrushMap;
use iolift_osdmap::whatif::Edit;
use iolift_testkit::ceph_tools::{createsimple, ToolDir};
use iolift_testkit::tool_ok;
use std::collections::BTreeMap;

/// Every bucket by name: its weight and its items' names and weights.
fn weights(c: &CrushMap) -> BTreeMap<String, (u32, Vec<(String, u32)>)> {
    let name = |id: i32| c.names.get(&id).cloned().unwrap_or_else(|| id.to_string());
    c.buckets
        .iter()
        .flatten()
        .map(|b| {
            let items = b
                .items
                .iter()
                .map(|&i| name(i))
                .zip(b.item_weights.iter().copied());
            (name(b.id), (b.weight, items.collect()))
        })
        .collect()
}

#[test]
fn add_host_and_crush_weight_equal_crushtool() {
    let d = ToolDir::new("osdmap-whatif");
    let map = d.file("m.bin");
    createsimple(&map, 4, &[]);
    let crush = d.p("c0.bin");
    tool_ok(
        "osdmaptool",
        &[map.to_str().unwrap(), "--export-crush", &crush],
    );

    // Two hosts' worth of weights, each read as Ceph reads them.
    for (host_w, osd_w) in [("4.097", "4.222"), ("1.5", "0.3"), ("0.001", "1000.123")] {
        let mut steps: Vec<Vec<String>> = vec![[
            "--add-bucket",
            "newhost",
            "host",
            "--loc",
            "rack",
            "localrack",
        ]
        .map(String::from)
        .to_vec()];
        for o in 4..7 {
            steps.push(
                [
                    "--add-item",
                    &o.to_string(),
                    host_w,
                    &format!("osd.{o}"),
                    "--loc",
                    "host",
                    "newhost",
                ]
                .map(String::from)
                .to_vec(),
            );
        }
        steps.push(
            ["--reweight-item", "osd.1", osd_w]
                .map(String::from)
                .to_vec(),
        );
        let mut cur = crush.clone();
        for (i, s) in steps.iter().enumerate() {
            let next = d.p(&format!("c{}.bin", i + 1));
            let mut a = vec!["-i", cur.as_str()];
            a.extend(s.iter().map(|x| x.as_str()));
            a.extend_from_slice(&["-o", &next]);
            tool_ok("crushtool", &a);
            cur = next;
        }
        let want = iolift_crush::decode(&std::fs::read(&cur).unwrap()).unwrap();

        let mut m = iolift_osdmap::decode(&std::fs::read(&map).unwrap()).unwrap();
        for spec in [
            format!("add-host:newhost:3:{host_w}:localrack"),
            format!("crush-weight:1:{osd_w}"),
        ] {
            let e = Edit::parse(&spec).unwrap();
            m.apply_edit(&spec, &e).unwrap();
        }
        assert_eq!(
            weights(&m.crush),
            weights(&want),
            "host weight {host_w}, osd.1 weight {osd_w}"
        );
    }
}
