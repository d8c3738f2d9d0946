//! Images qemu wrote (backing files raw and qcow2, compressed clusters,
//! zero clusters, version 2) read by iolift and compared with what
//! qemu-img reads; then written by iolift (copy-on-write from each kind)
//! and checked clean.

mod common;
use common::*;
use iolift_qcow2::DataPath;
use iolift_testkit::process::{cmd, run_ok};
use iolift_testkit::rng::Rng;
use std::path::Path;

/// Writes over an image through iolift, then checks it and compares.
fn write_over_and_check(img: &Path, seed: u64) {
    let mut model = qemu_raw(img);
    let cp = open(img, 4, 1, false);
    let dp = DataPath::new(cp.clone(), 0);
    let mut rng = Rng::new(seed);
    for _ in 0..60 {
        let off = rng.below(model.len() as u64) as usize;
        let len = (1 + rng.below(100_000) as usize).min(model.len() - off);
        let data = rng.bytes(len);
        dp.write(off as u64, &data, false).unwrap();
        model[off..off + len].copy_from_slice(&data);
    }
    cp.write_zeroes(1 << 20, 200_000, false).unwrap();
    model[1 << 20..(1 << 20) + 200_000].fill(0);
    assert_eq!(first_diff(&iolift_raw(&cp), &model), None);
    cp.close().unwrap();
    drop(dp);
    drop(cp);
    assert_clean(img);
    assert_eq!(
        first_diff(&qemu_raw(img), &model),
        None,
        "after iolift's writes"
    );
}

fn assert_same_as_qemu(img: &Path) {
    let cp = open(img, 3, 1, true);
    let want = qemu_raw(img);
    assert_eq!(
        first_diff(&iolift_raw(&cp), &want),
        None,
        "{}: iolift reads differ from qemu-img",
        img.display()
    );
    // and with no cache at all (every read under the control plane)
    let cp = open(img, 0, 1, true);
    assert_eq!(first_diff(&iolift_raw(&cp), &want), None);
}

#[test]
fn raw_and_qcow2_backing_chains() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = d.join("base.raw");
    iolift_testkit::data::write_random_file(&base, 3 << 20, 11); // shorter than the overlay
    run_ok(
        cmd("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&base)
            .arg(d.join("mid.qcow2"))
            .arg("4M"),
    );
    let mid = d.join("mid.qcow2");
    qemu_io(
        &mid,
        &[
            "write -P 0xaa 100k 70k",
            "write -z 2M 64k",
            "discard 512k 64k",
        ],
    );
    run_ok(
        cmd("qemu-img")
            .args([
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "qcow2",
                "-b",
                "mid.qcow2",
            ])
            .arg(d.join("top.qcow2"))
            .arg("4M"),
    );
    let top = d.join("top.qcow2");
    qemu_io(&top, &["write -P 0x5c 150k 4k", "write -z 3M 100k"]);
    assert_same_as_qemu(&mid);
    assert_same_as_qemu(&top);
    write_over_and_check(&top, 12);
    write_over_and_check(&mid, 13);
}

#[test]
fn compressed_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let raw = d.join("src.raw");
    // compressible and incompressible halves, and a hole
    let mut data = iolift_testkit::data::random_bytes(4 << 20, 21);
    for (i, b) in data[..2 << 20].iter_mut().enumerate() {
        *b = (i / 1000) as u8;
    }
    data[3 << 20..(3 << 20) + (300 << 10)].fill(0);
    std::fs::write(&raw, &data).unwrap();
    for cs in ["65536", "4096"] {
        let img = d.join(format!("c{cs}.qcow2"));
        run_ok(
            cmd("qemu-img")
                .args(["convert", "-c", "-O", "qcow2", "-o"])
                .arg(format!("cluster_size={cs}"))
                .arg(&raw)
                .arg(&img),
        );
        assert_same_as_qemu(&img);
        let cp = open(&img, 8, 1, true);
        assert_eq!(first_diff(&iolift_raw(&cp), &data), None);
        drop(cp);
        write_over_and_check(&img, 22);
    }
}

#[test]
fn zero_clusters_and_version_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v3 = create(d, "z.qcow2", "8M", "");
    qemu_io(
        &v3,
        &[
            "write -P 0x11 0 4M",
            "write -z 1M 1M",
            "write -z -u 3M 64k",
            "write -P 0x22 5M 10k",
        ],
    );
    assert_same_as_qemu(&v3);
    write_over_and_check(&v3, 31);
    let v2 = create(d, "v2.qcow2", "8M", "compat=0.10");
    qemu_io(
        &v2,
        &[
            "write -P 0x33 0 3M",
            "write -z 1M 64k",
            "write -P 0x44 7M 100k",
        ],
    );
    let cp = open(&v2, 8, 1, true);
    assert_eq!(cp.header().version, 2);
    drop(cp);
    assert_same_as_qemu(&v2);
    write_over_and_check(&v2, 32);
}

/// The snapshot's bytes as qemu-img reads them.
fn qemu_snapshot_raw(img: &Path, name: &str) -> Vec<u8> {
    let raw = img.with_extension("snap.raw");
    run_ok(
        cmd("qemu-img")
            .args(["convert", "-O", "raw", "-l"])
            .arg(format!("snapshot.name={name}"))
            .arg(img)
            .arg(&raw),
    );
    let v = std::fs::read(&raw).unwrap();
    std::fs::remove_file(&raw).unwrap();
    v
}

#[test]
fn snapshots_qemu_made_survive_iolift_writes() {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "s.qcow2", "4M", "");
    qemu_io(&img, &["write -P 0x61 0 1M"]);
    run_ok(cmd("qemu-img").args(["snapshot", "-c", "one"]).arg(&img));
    qemu_io(&img, &["write -P 0x62 512k 1M"]);
    assert_same_as_qemu(&img);
    let one = qemu_snapshot_raw(&img, "one");
    write_over_and_check(&img, 41); // copy-on-write of shared L2 tables and clusters
    assert_eq!(
        first_diff(&qemu_snapshot_raw(&img, "one"), &one),
        None,
        "snapshot changed"
    );
}

#[test]
fn iolift_creates_and_deletes_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    for opts in ["", "compat=0.10,cluster_size=4096"] {
        let img = create(dir.path(), "n.qcow2", "4M", opts);
        qemu_io(&img, &["write -P 0x31 0 2M", "write -z 2M 64k"]);
        let cp = open(&img, 4, 1, false);
        let dp = DataPath::new(cp.clone(), 0);
        let mut b = vec![0u8; 4096];
        dp.read(0, &mut b).unwrap(); // a writable mapping now cached
        cp.snapshot_create("a").unwrap();
        dp.write(100, &[0x99; 5000], false).unwrap();
        cp.snapshot_create("b").unwrap();
        dp.write(1 << 20, &[0x98; 70000], false).unwrap();
        cp.discard(0, 1 << 20).unwrap();
        let names: Vec<String> = cp.snapshots().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(
            cp.snapshot_create("a").is_err(),
            "a duplicate name was taken"
        );
        let active = iolift_raw(&cp);
        cp.close().unwrap();
        drop(dp);
        drop(cp);
        assert_clean(&img);
        let list = run_ok(cmd("qemu-img").args(["snapshot", "-l"]).arg(&img)).stdout;
        assert!(list.contains(" a ") && list.contains(" b "), "{list}");
        let a = qemu_snapshot_raw(&img, "a");
        assert!(a[..2 << 20].iter().all(|&x| x == 0x31) && a[2 << 20..].iter().all(|&x| x == 0));
        let b = qemu_snapshot_raw(&img, "b");
        assert!(
            b[100..5100].iter().all(|&x| x == 0x99) && b[5100..2 << 20].iter().all(|&x| x == 0x31)
        );
        assert_eq!(first_diff(&qemu_raw(&img), &active), None);
        // delete the older, then the newer; clean after each
        let cp = open(&img, 4, 1, false);
        cp.snapshot_delete("a").unwrap();
        assert!(cp.snapshot_delete("zz").is_err());
        cp.close().unwrap();
        drop(cp);
        assert_clean(&img);
        assert_eq!(first_diff(&qemu_snapshot_raw(&img, "b"), &b), None);
        let cp = open(&img, 4, 1, false);
        cp.snapshot_delete("b").unwrap();
        assert!(cp.snapshots().is_empty());
        cp.close().unwrap();
        drop(cp);
        assert_clean(&img);
        assert_eq!(first_diff(&qemu_raw(&img), &active), None);
        write_over_and_check(&img, 42);
        std::fs::remove_file(&img).unwrap();
    }
}
