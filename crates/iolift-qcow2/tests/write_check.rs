//! iolift writes images qemu-img created; qemu-img check must find them
//! clean and qemu-img must read back exactly what a model of the writes
//! holds. Several geometries: 64 KiB clusters, 512-byte clusters (the
//! refcount table must grow), 1-bit and 64-bit refcounts, version 2.

mod common;
use common::*;
use iolift_qcow2::DataPath;
use iolift_testkit::rng::Rng;

fn exercise(opts: &str, size: usize, seed: u64, ops: usize) {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "t.qcow2", &size.to_string(), opts);
    let cp = open(&img, 8, 2, false);
    let cs = cp.cluster_size() as usize;
    let paths = [DataPath::new(cp.clone(), 0), DataPath::new(cp.clone(), 1)];
    let mut model = vec![0u8; size];
    let mut rng = Rng::new(seed);
    for i in 0..ops {
        let dp = &paths[i % 2];
        let off = rng.below(size as u64) as usize;
        let len = (1 + rng.below(3 * cs as u64 + 5000) as usize).min(size - off);
        match rng.below(10) {
            0 => {
                cp.discard(off as u64, len as u64).unwrap();
                let first = off.div_ceil(cs) * cs;
                let end = (off + len) / cs * cs;
                if end > first {
                    model[first..end].fill(0);
                }
            }
            1 => {
                cp.write_zeroes(off as u64, len as u64, rng.chance(1, 2))
                    .unwrap();
                model[off..off + len].fill(0);
            }
            2 => cp.flush().unwrap(),
            _ => {
                let data = rng.bytes(len);
                dp.write(off as u64, &data, rng.chance(1, 8)).unwrap();
                model[off..off + len].copy_from_slice(&data);
            }
        }
        if i % 50 == 0 {
            let mut buf = vec![0u8; len];
            paths[(i + 1) % 2].read(off as u64, &mut buf).unwrap();
            assert!(buf == model[off..off + len], "op {i}: read back differs");
        }
    }
    let ours = iolift_raw(&cp);
    assert_eq!(
        first_diff(&ours, &model),
        None,
        "{opts}: iolift reads differ from the model"
    );
    cp.close().unwrap();
    drop(paths);
    drop(cp);
    assert_clean(&img);
    let theirs = qemu_raw(&img);
    assert_eq!(
        first_diff(&theirs, &model),
        None,
        "{opts}: qemu-img reads differ from the model"
    );
    // and iolift reads its own image again after a reopen
    let cp = open(&img, 16, 1, true);
    assert_eq!(
        first_diff(&iolift_raw(&cp), &model),
        None,
        "{opts}: reopened image differs"
    );
}

#[test]
fn v3_64k_clusters() {
    exercise("", 16 << 20, 1, 600);
}

#[test]
fn v2_64k_clusters() {
    exercise("compat=0.10", 16 << 20, 2, 600);
}

#[test]
fn small_clusters_grow_the_refcount_table() {
    // 512-byte clusters, 16-bit refcounts: one refcount block covers
    // 128 KiB, one table cluster 8 MiB, so filling 24 MiB moves the table.
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "s.qcow2", "24M", "cluster_size=512");
    let cp = open(&img, 64, 1, false);
    let dp = DataPath::new(cp.clone(), 0);
    let table0 = cp.header().refcount_table_offset;
    let mut model = vec![0u8; 24 << 20];
    let mut rng = Rng::new(7);
    for chunk in 0..(24 << 20) / (256 << 10) {
        let data = rng.bytes(256 << 10);
        let off = chunk * (256 << 10);
        dp.write(off as u64, &data, false).unwrap();
        model[off..off + data.len()].copy_from_slice(&data);
    }
    cp.close().unwrap();
    drop(dp);
    drop(cp);
    assert_ne!(
        peek_u64(&img, 48),
        table0,
        "the refcount table did not move"
    );
    assert_clean(&img);
    assert_eq!(first_diff(&qemu_raw(&img), &model), None);
    exercise("cluster_size=512", 4 << 20, 3, 400);
}

#[test]
fn narrow_and_wide_refcounts() {
    exercise("refcount_bits=1,cluster_size=4096", 8 << 20, 4, 400);
    exercise("refcount_bits=64,cluster_size=4096", 8 << 20, 5, 400);
    exercise("refcount_bits=2,cluster_size=1024", 4 << 20, 6, 300);
}
