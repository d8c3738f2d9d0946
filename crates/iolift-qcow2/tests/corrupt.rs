//! Corrupted images give a clear error naming the bad part, never a
//! panic, a hang or a wrong byte; and a fuzz pass over the metadata.

mod common;
use common::*;
use iolift_qcow2::{ControlPlane, DataPath, Options};
use iolift_testkit::rng::Rng;
use std::path::{Path, PathBuf};
use std::time::Duration;

const RO: Options = Options {
    read_only: true,
    cache_entries: 4,
    data_paths: 1,
    direct: false,
};
const RW: Options = Options {
    read_only: false,
    cache_entries: 4,
    data_paths: 1,
    direct: false,
};

/// A 4 MiB image, 64 KiB clusters, data in its first 2 MiB.
fn image(dir: &Path) -> PathBuf {
    let img = create(dir, "c.qcow2", "4M", "");
    qemu_io(&img, &["write -P 0x77 0 2M"]);
    img
}

fn open_err(p: &Path, o: &Options) -> String {
    match ControlPlane::open(p, o) {
        Ok(_) => panic!("opened a corrupt image"),
        Err(e) => e.to_string(),
    }
}

fn read_err(p: &Path, off: u64) -> String {
    let cp = ControlPlane::open(p, &RO).unwrap();
    let dp = DataPath::new(cp, 0);
    let mut b = vec![0u8; 4096];
    match dp.read(off, &mut b) {
        Ok(()) => panic!("read a corrupt cluster: {:?}", &b[..8]),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_headers_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let good = std::fs::read(&img).unwrap();
    let cases: &[(u64, &[u8], &str)] = &[
        (0, b"QFJ\xfb", "bad magic"),
        (4, &[0, 0, 0, 9], "version 9"),
        (20, &[0, 0, 0, 30], "cluster_bits 30"),
        (32, &[0, 0, 0, 1], "encryption"),
        (36, &[0, 0, 0, 0], "l1_size 0 too small"),
        (
            40,
            &[0, 0, 0, 0, 0x40, 0, 0, 0],
            "l1_table_offset 0x40000000",
        ),
        (
            48,
            &[0, 0, 0, 0, 0, 0, 0x10, 0],
            "refcount_table_offset 0x1000 is not cluster aligned",
        ),
        (
            72,
            &[0, 0, 0, 0, 0, 0, 0x04, 0],
            "incompatible feature bit 10",
        ),
        (72, &[0, 0, 0, 0, 0, 0, 0, 0x10], "extended L2"),
        (72, &[0, 0, 0, 0, 0, 0, 0, 0x04], "external data file"),
        (96, &[0, 0, 0, 7], "refcount_order 7"),
        (100, &[0, 0, 0, 50], "header_length 50"),
    ];
    for (off, bytes, want) in cases {
        std::fs::write(&img, &good).unwrap();
        poke(&img, *off, bytes);
        let e = open_err(&img, &RO);
        assert!(e.contains(want), "poke at {off}: {e}");
    }
    std::fs::write(&img, &good).unwrap();
    poke(&img, 72, &[0, 0, 0, 0, 0, 0, 0, 0x01]);
    let e = open_err(&img, &RW);
    assert!(e.contains("dirty"), "{e}");
    ControlPlane::open(&img, &RO).expect("a dirty image opens read-only");
    std::fs::write(&img, &good[..50]).unwrap();
    assert!(open_err(&img, &RO).contains("shorter than a qcow2 header"));
}

#[test]
fn bad_tables_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let good = std::fs::read(&img).unwrap();
    let l1 = peek_u64(&img, 40);
    let l2 = peek_u64(&img, l1) & 0x00ff_ffff_ffff_fe00;
    let rct = peek_u64(&img, 48);
    // an L1 entry past the end of the file
    poke(&img, l1, &(0x8000_0000_1000_0000u64).to_be_bytes());
    assert!(open_err(&img, &RO).contains("L1 entry 0: L2 table offset 0x10000000 is past the end"));
    // an unaligned L1 entry
    std::fs::write(&img, &good).unwrap();
    poke(&img, l1, &(0x8000_0000_0003_0200u64).to_be_bytes());
    assert!(open_err(&img, &RO).contains("not cluster aligned"));
    // an L2 entry past the end: only that cluster's read fails
    std::fs::write(&img, &good).unwrap();
    poke(&img, l2 + 3 * 8, &(0x8000_0000_4000_0000u64).to_be_bytes());
    let e = read_err(&img, 3 << 16);
    assert!(
        e.contains("guest cluster 3") && e.contains("past the end of the file"),
        "{e}"
    );
    let cp = ControlPlane::open(&img, &RO).unwrap();
    let mut b = vec![0u8; 4096];
    DataPath::new(cp, 0).read(2 << 16, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0x77));
    // a refcount table entry past the end (found by a writable open)
    std::fs::write(&img, &good).unwrap();
    poke(&img, rct, &(0x4000_0000u64).to_be_bytes());
    assert!(open_err(&img, &RW)
        .contains("refcount table entry 0: block offset 0x40000000 is past the end"));
    // a refcount of 0 on an L2 table: the allocator refuses to hand it out
    std::fs::write(&img, &good).unwrap();
    let rb = peek_u64(&img, rct);
    poke(&img, rb + 2 * (l2 >> 16), &[0, 0]);
    let cp = ControlPlane::open(&img, &RW).unwrap();
    let dp = DataPath::new(cp, 0);
    let e = dp
        .write(3 << 20, &[1u8; 512], false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("holds an L2 table or refcount block but its refcount is 0"),
        "{e}"
    );
    // bad compressed data
    std::fs::write(&img, &good).unwrap();
    poke(
        &img,
        l2 + 5 * 8,
        &((1u64 << 62) | (3u64 << 54) | l2).to_be_bytes(),
    );
    let e = read_err(&img, 5 << 16);
    assert!(e.contains("compressed guest cluster 5"), "{e}");
}

/// Flips random bytes in the first clusters (header, L1, refcounts, L2)
/// and runs reads and writes: every outcome must be Ok or a clear error;
/// a panic or a hang fails.
#[test]
fn fuzz_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let good = std::fs::read(&img).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let p = img.clone();
    std::thread::spawn(move || {
        let mut rng = Rng::new(99);
        let mut errors = 0;
        for round in 0..300 {
            let mut bad = good.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(5 << 16) as usize;
                bad[at] ^= 1 << rng.below(8);
            }
            std::fs::write(&p, &bad).unwrap();
            let opts = if round % 2 == 0 { RO } else { RW };
            let r = std::panic::catch_unwind(|| {
                let mut errs = 0;
                let Ok(cp) = ControlPlane::open(&p, &opts) else {
                    return 1;
                };
                let dp = DataPath::new(cp.clone(), 0);
                let mut b = vec![0u8; 70_000];
                for off in [0u64, 1 << 16, 1 << 20, 3 << 20] {
                    errs += dp.read(off, &mut b).is_err() as usize;
                    if !opts.read_only {
                        errs += dp.write(off + 100, &b[..5000], false).is_err() as usize;
                    }
                }
                if !opts.read_only {
                    errs += cp.discard(0, 1 << 20).is_err() as usize;
                    errs += cp.close().is_err() as usize;
                }
                errs
            });
            match r {
                Ok(n) => errors += n,
                Err(_) => {
                    tx.send(Err(format!("round {round} panicked"))).unwrap();
                    return;
                }
            }
        }
        tx.send(Ok(errors)).unwrap();
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(Ok(errors)) => assert!(errors > 0, "no corruption was ever noticed"),
        Ok(Err(e)) => panic!("{e}"),
        Err(_) => panic!("fuzz rounds hung"),
    }
}
