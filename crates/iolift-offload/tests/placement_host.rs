//! OSDMap placement with the CRUSH step on the offload kernel: the host
//! build of kernels/crush.cu (g++, its CUDA shims; the same source the GPU
//! runs) computes the raw CRUSH set of every PG of every pool in pool mode
//! (placement seeds computed by the kernel), `Mapper::map_pg_crush` applies
//! upmaps, primary affinity and temps; the result must equal the CPU path
//! (`Mapper::map_pg`) for every PG. Maps come from osdmaptool and crushtool
//! (package ceph-base, installed by scripts/test.sh): replicated and
//! erasure pools, pgp_num < pg_num, a pool without hashpspool, down and out
//! OSDs, upmaps, affinity, temps.

// the shared helpers: this test uses the host kernel and its pool mode only
#[allow(unused_imports)]
mod common;
use common::*;
use iolift_offload::kernels::crush::flat::{FlatMap, LEN_FALLBACK};
use iolift_osdmap::types::{OsdMap, PgId};
use iolift_osdmap::{find_rule, pg_mask, Mapper, PgPlacement};
use std::process::Command;

fn tool(prog: &str, args: &[&str]) -> String {
    let o = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("missing {prog} ({e}): run scripts/test.sh, which installs it"));
    assert!(
        o.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `n` OSDs in straw2 hosts of `per_host`, an erasure rule beside the
/// replicated one; pools: rbd (1), an erasure pool (2, k+m = 4), a pool
/// with pgp_num < pg_num and no hashpspool (3).
fn make_map(dir: &std::path::Path, n: u32, per_host: u32) -> OsdMap {
    let m = dir.join(format!("m{n}.bin"));
    let ms = m.to_str().unwrap();
    let ns = n.to_string();
    tool(
        "osdmaptool",
        &[
            "--createsimple",
            &ns,
            "--clobber",
            "--with-default-pool",
            "--pg_bits",
            "4",
            ms,
        ],
    );
    let c = dir.join("c.bin");
    let cs = c.to_str().unwrap();
    let ph = per_host.to_string();
    tool(
        "crushtool",
        &[
            "--build",
            "--num_osds",
            &ns,
            "host",
            "straw2",
            &ph,
            "root",
            "straw2",
            "0",
            "-o",
            cs,
        ],
    );
    let text = tool("crushtool", &["-d", cs]).replace(
        "# end crush map",
        "rule ec {\n\tid 1\n\ttype erasure\n\tmin_size 3\n\tmax_size 6\n\t\
         step set_chooseleaf_tries 5\n\tstep take root\n\t\
         step chooseleaf indep 0 type host\n\tstep emit\n}\n# end crush map",
    );
    let t = dir.join("c.txt");
    std::fs::write(&t, text).unwrap();
    tool("crushtool", &["-c", t.to_str().unwrap(), "-o", cs]);
    tool("osdmaptool", &[ms, "--import-crush", cs]);
    let mut map = iolift_osdmap::decode(&std::fs::read(&m).unwrap()).unwrap();
    for o in 0..n as i32 {
        map.mark_up_in(o).unwrap();
    }
    map.add_pool_like(1, 2, "ec", 3, 4, 1, 300).unwrap();
    map.add_pool_like(1, 3, "plain", 1, 2, 0, 200).unwrap();
    let p3 = map.pools.get_mut(&3).unwrap();
    p3.pgp_num = 150;
    p3.flags = 0;
    map.mark_down(1).unwrap();
    map.mark_out(2).unwrap();
    map.set_weight(3, 0x8000).unwrap();
    map.set_primary_affinity(4, 0x2000).unwrap();
    map.set_primary_affinity(5, 0).unwrap();
    let pg = |pool, seed| PgId { pool, seed };
    map.pg_upmap.insert(pg(1, 5), vec![6, 7, 8]);
    map.pg_upmap_items.insert(pg(1, 6), vec![(0, 9)]);
    map.pg_upmap_items
        .insert(pg(2, 7), vec![(10, 11), (12, 13)]);
    map.pg_temp.insert(pg(1, 8), vec![3, 1, 0]);
    map.primary_temp.insert(pg(2, 9), 6);
    // read back as Ceph would write it
    iolift_osdmap::decode(&iolift_osdmap::encode(&map)).unwrap()
}

#[test]
fn host_kernel_placement_equals_cpu_placement() {
    let k = host_kernel();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0usize;
    let mut kernel_rows = 0usize;
    for (n, per_host) in [(40, 4), (200, 10)] {
        let map = make_map(dir.path(), n, per_host);
        let mut cpu = Mapper::new(&map);
        let mut gpu = Mapper::new(&map);
        let (mut a, mut b) = (PgPlacement::default(), PgPlacement::default());
        for pool in map.pools.values() {
            let rule = find_rule(&map, pool);
            assert!(rule >= 0, "pool {} has a rule", pool.id);
            let flat = FlatMap::new(&map.crush, map.crush.choose_args_for(pool.id)).unwrap();
            let size = pool.size as usize;
            let args = PoolArgs {
                pgp_num: pool.pgp_num,
                pgp_mask: pg_mask(pool.pgp_num),
                pool_id: pool.id as u32,
                hashpspool: pool.hashpspool(),
            };
            let (out, lens) = k.run_thread(
                &flat,
                &map.osd_weight,
                rule,
                None,
                pool.pg_num as usize,
                size,
                Some(args),
            );
            for seed in 0..pool.pg_num {
                let i = seed as usize;
                cpu.map_pg(pool, rule, seed, &mut a);
                if lens[i] == LEN_FALLBACK {
                    continue;
                }
                kernel_rows += 1;
                let row = &out[i * size..i * size + lens[i] as usize];
                gpu.map_pg_crush(pool, seed, row, &mut b);
                assert_eq!(b, a, "map {n}: pg {}.{seed:x}", pool.id);
                checked += 1;
            }
        }
    }
    assert!(checked > 1500, "{checked} PGs compared");
    assert_eq!(kernel_rows, checked);
}
