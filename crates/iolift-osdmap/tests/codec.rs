//! The OSDMap codec against maps written by Ceph's own osdmaptool
//! (package ceph-base, installed by scripts/test.sh): decode + encode gives
//! the input back byte for byte; every truncation and random corruption is
//! an error naming a byte offset, never a panic; edited maps are read back
//! by osdmaptool.

use iolift_osdmap::types::POOL_ERASURE;
use iolift_osdmap::{decode, encode, OsdMapError, PgId};
use iolift_testkit::ceph_tools::{crush_build_straw2, ToolDir};
use std::path::Path;
use std::process::Command;

fn tool(name: &str, args: &[&str]) -> (bool, String) {
    let o = Command::new(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("missing {name} ({e}): run scripts/test.sh, which installs it"));
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&o.stderr));
    (o.status.success(), s)
}

/// `osdmaptool --createsimple N EXTRA...` into `dir/name`.
fn createsimple(dir: &Path, name: &str, n: u32, extra: &[&str]) -> Vec<u8> {
    let p = dir.join(name);
    iolift_testkit::ceph_tools::createsimple(&p, n, extra);
    std::fs::read(&p).unwrap()
}

/// A 1000-OSD map with a 3-level straw2 hierarchy imported by osdmaptool.
fn big_map(dir: &Path) -> Vec<u8> {
    createsimple(
        dir,
        "big.bin",
        1000,
        &["--with-default-pool", "--pg-bits", "5"],
    );
    let c = dir.join("big.crush");
    crush_build_straw2(&c, 1000, &[("host", 10), ("rack", 10)]);
    let m = dir.join("big.bin");
    let (ok, out) = tool(
        "osdmaptool",
        &[m.to_str().unwrap(), "--import-crush", c.to_str().unwrap()],
    );
    assert!(ok, "osdmaptool --import-crush: {out}");
    std::fs::read(&m).unwrap()
}

fn maps(dir: &Path) -> Vec<(String, Vec<u8>)> {
    vec![
        ("simple4".into(), createsimple(dir, "a.bin", 4, &[])),
        (
            "simple4-pool".into(),
            createsimple(dir, "b.bin", 4, &["--with-default-pool"]),
        ),
        (
            "simple100-bits".into(),
            createsimple(
                dir,
                "c.bin",
                100,
                &["--with-default-pool", "--pg-bits", "3", "--pgp-bits", "2"],
            ),
        ),
        ("big1000".into(), big_map(dir)),
    ]
}

#[test]
fn decode_encode_is_byte_identical() {
    let dir = ToolDir::new("osdmap-rt");
    for (name, bytes) in maps(dir.path()) {
        let m = decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(encode(&m), bytes, "{name}: re-encoding differs");
        // the fields the tool prints agree with what was decoded
        let (ok, out) = tool("osdmaptool", &[dir.file("x").to_str().unwrap(), "--print"]);
        assert!(!ok, "no map at x: {out}");
        if let Some(p) = m.pools.get(&1) {
            assert_eq!(p.name, "rbd", "{name}");
            assert!(p.hashpspool(), "{name}");
            assert_eq!((p.size, p.min_size), (3, 2), "{name}");
        }
        assert_eq!(m.osd_state.len(), m.max_osd as usize);
    }
}

#[test]
fn truncated_and_corrupt_maps_are_errors() {
    let dir = ToolDir::new("osdmap-bad");
    let bytes = createsimple(dir.path(), "b.bin", 4, &["--with-default-pool"]);
    for n in 0..bytes.len() {
        match decode(&bytes[..n]) {
            Ok(_) => panic!("a map cut at {n} of {} decoded", bytes.len()),
            Err(e) => assert!(e.to_string().contains("byte"), "cut at {n}: {e}"),
        }
    }
    // A flipped byte anywhere: an error with an offset (usually the crc),
    // never a panic.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..3000 {
        let mut b = bytes.clone();
        let k = 1 + next() % 3;
        for _ in 0..k {
            let i = (next() % b.len() as u64) as usize;
            b[i] = match next() % 4 {
                0 => 0,
                1 => 0xff,
                _ => next() as u8,
            };
        }
        let r = std::panic::catch_unwind(|| decode(&b));
        match r {
            Err(_) => panic!("decode panicked"),
            Ok(Ok(m)) => assert_eq!(encode(&m), b, "a map that decodes re-encodes"),
            Ok(Err(e)) => assert!(e.to_string().contains("byte"), "{e}"),
        }
    }
    let mut b = bytes.clone();
    let last = b.len() - 1;
    b[last] ^= 1;
    match decode(&b) {
        Err(OsdMapError::Corrupt { field, .. }) => assert_eq!(field, "crc"),
        r => panic!("bad crc: {r:?}"),
    }
    // wrong versions are refused with the version found
    let mut b = bytes.clone();
    b[6] = 10;
    let e = decode(&b).unwrap_err().to_string();
    assert!(
        e.contains("client data struct_v") && e.contains("10"),
        "{e}"
    );
}

#[test]
fn edited_maps_are_read_by_osdmaptool() {
    let dir = ToolDir::new("osdmap-edit");
    let bytes = big_map(dir.path());
    let mut m = decode(&bytes).unwrap();
    for o in 0..m.max_osd {
        m.mark_up_in(o).unwrap();
    }
    m.mark_out(17).unwrap();
    m.mark_down(23).unwrap();
    m.set_primary_affinity(5, 0x8000).unwrap();
    m.add_pool_like(1, 2, "second", 1, 2, 0, 100).unwrap();
    m.add_pool_like(1, 4, "ecpool", POOL_ERASURE, 5, 0, 64)
        .unwrap();
    m.pg_temp.insert(PgId { pool: 1, seed: 3 }, vec![1, 2, 3]);
    m.primary_temp.insert(PgId { pool: 1, seed: 4 }, 9);
    m.pg_upmap_items.insert(
        PgId {
            pool: 2,
            seed: 0x10,
        },
        vec![(1, 900)],
    );
    let enc = encode(&m);
    let again = decode(&enc).unwrap();
    assert_eq!(encode(&again), enc, "encode(decode(encode(edited)))");
    assert_eq!(again.pools.len(), 3);
    assert_eq!((again.pools[&4].size, again.pools[&4].pg_num), (5, 64));
    assert_eq!(again.pg_temp, m.pg_temp);
    assert_eq!(again.primary_affinity, m.primary_affinity);
    let p = dir.file("edited.bin");
    std::fs::write(&p, &enc).unwrap();
    let (ok, out) = tool("osdmaptool", &[p.to_str().unwrap(), "--print"]);
    assert!(ok, "osdmaptool --print of our map: {out}");
    for want in [
        "pool 2 'second' replicated size 2 min_size 1",
        "pool 4 'ecpool' erasure profile  size 5 min_size 5",
        "pg_num 100 pgp_num 100",
        "osd.17 up   out weight 0 ",
        "osd.23 down in  weight 1 ",
        "osd.5 up   in  weight 1 primary_affinity 0.5 ",
        "pg_temp 1.3 [1,2,3]",
        "primary_temp 1.4 9",
        "pg_upmap_items 2.10 [1,900]",
    ] {
        assert!(
            out.contains(want),
            "osdmaptool --print lacks {want:?}:\n{out}"
        );
    }
}

/// Where the crc of an encoded map is: the last offset whose four bytes
/// equal the crc of what comes before them and after them.
fn crc_offset(b: &[u8]) -> usize {
    use iolift_osdmap::codec::crc32c;
    (0..b.len() - 3)
        .rev()
        .find(|&p| {
            let stored = u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
            crc32c(crc32c(u32::MAX, &b[..p]), &b[p + 4..]) == stored
        })
        .expect("a map has a crc")
}

/// Every single-byte change of a map (two values a byte) with the crc
/// made right, so that the checks behind the crc are reached; what still
/// decodes is then used as the tools use it: printed (`osdmaptool
/// --print`'s text, each pool's detail and line) and the first and last
/// PG of every pool mapped. Errors name a byte offset; nothing panics.
#[test]
fn crc_fixed_corruptions_decode_print_and_map_or_fail() {
    use iolift_osdmap::pool_detail::{pool_line, PoolDetail};
    use iolift_osdmap::{Mapper, PgPlacement};
    let dir = ToolDir::new("osdmap-crcfix");
    let bytes = createsimple(dir.path(), "c.bin", 6, &["--with-default-pool"]);
    let at = crc_offset(&bytes);
    let (mut decoded, mut refused) = (0, 0);
    let mut slowest = (std::time::Duration::ZERO, 0, 0u8);
    for i in 0..at {
        for v in [bytes[i] ^ 1, !bytes[i]] {
            let mut b = bytes.clone();
            b[i] = v;
            let c = iolift_osdmap::codec::crc32c(
                iolift_osdmap::codec::crc32c(u32::MAX, &b[..at]),
                &b[at + 4..],
            );
            b[at..at + 4].copy_from_slice(&c.to_le_bytes());
            let m = match decode(&b) {
                Ok(m) => m,
                Err(e) => {
                    assert!(e.to_string().contains("byte"), "byte {i} = {v}: {e}");
                    refused += 1;
                    continue;
                }
            };
            decoded += 1;
            let t = std::time::Instant::now();
            let _ = m.print_text();
            let mut mapper = Mapper::new(&m);
            let mut out = PgPlacement::default();
            for pool in m.pools.values() {
                if let Ok(d) = PoolDetail::read(pool) {
                    let _ = pool_line(pool, &d);
                }
                for seed in [0, pool.pg_num.saturating_sub(1)] {
                    mapper.map_pgid(
                        PgId {
                            pool: pool.id as u64,
                            seed,
                        },
                        &mut out,
                    );
                }
            }
            let took = t.elapsed();
            if took > slowest.0 {
                slowest = (took, i, v);
            }
        }
    }
    println!("{decoded} changed maps decoded, {refused} refused; slowest use {slowest:?}");
    assert!(
        decoded > 0 && refused > 0,
        "{decoded} decoded, {refused} refused"
    );
}
