//! Reverting to an internal snapshot, against qemu-img's own revert
//! (`qemu-img snapshot -a`) on a copy of the same image: the two results
//! must read the same, both must check clean, and the snapshots must be
//! left as they were.

mod common;
use common::*;
use iolift_qcow2::DataPath;
use iolift_testkit::process::{cmd, run_ok};
use iolift_testkit::rng::Rng;
use std::path::Path;

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

fn random_writes(dp: &DataPath, size: u64, rng: &mut Rng, n: usize) {
    for _ in 0..n {
        let off = rng.below(size);
        let len = (1 + rng.below(150_000)).min(size - off) as usize;
        dp.write(off, &rng.bytes(len), false).unwrap();
    }
}

/// qemu-img compare must say the two images read the same.
fn assert_same_images(a: &Path, b: &Path) {
    let o = run_ok(
        cmd("qemu-img")
            .args(["compare", "-f", "qcow2", "-F", "qcow2"])
            .arg(a)
            .arg(b),
    );
    assert!(o.all().contains("identical"), "{}", o.report());
}

fn revert_like_qemu(opts: &str, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "r.qcow2", "6M", opts);
    let size = 6u64 << 20;
    let mut rng = Rng::new(seed);
    qemu_io(&img, &["write -P 0x41 0 3M", "write -z 3M 128k"]);
    // one snapshot qemu made, one iolift made, writes between and after
    run_ok(cmd("qemu-img").args(["snapshot", "-c", "q1"]).arg(&img));
    let cp = open(&img, 8, 2, false);
    let dp = DataPath::new(cp.clone(), 0);
    random_writes(&dp, size, &mut rng, 30);
    cp.snapshot_create("i2").unwrap();
    random_writes(&dp, size, &mut rng, 30);
    dp.write(0, &[0xee; 8192], false).unwrap(); // differs from both snapshots
    cp.discard(1 << 20, 1 << 20).unwrap();
    cp.close().unwrap();
    drop(dp);
    drop(cp);
    assert_clean(&img);
    let q1 = qemu_snapshot_raw(&img, "q1");
    let i2 = qemu_snapshot_raw(&img, "i2");

    for target in ["q1", "i2"] {
        let theirs = dir.path().join("theirs.qcow2");
        std::fs::copy(&img, &theirs).unwrap();
        run_ok(
            cmd("qemu-img")
                .args(["snapshot", "-a", target])
                .arg(&theirs),
        );

        let cp = open(&img, 4, 2, false);
        let dp = DataPath::new(cp.clone(), 1);
        let before = iolift_raw(&cp); // fills the caches with old mappings
        let mut b = vec![0u8; 4096];
        dp.read(0, &mut b).unwrap();
        cp.snapshot_revert(target).unwrap();
        let want = if target == "q1" { &q1 } else { &i2 };
        // the mapping cached before the revert must not be used after it
        dp.read(0, &mut b).unwrap();
        assert_eq!(
            first_diff(&b, &want[..4096]),
            None,
            "a stale cached mapping was read"
        );
        let now = iolift_raw(&cp);
        assert_eq!(
            first_diff(&now, want),
            None,
            "iolift reads after revert to {target}"
        );
        assert_ne!(first_diff(&before, want), None, "the test reverted nothing");
        assert!(cp.snapshot_revert("nope").is_err());
        cp.close().unwrap();
        drop(dp);
        drop(cp);
        assert_clean(&img);
        assert_same_images(&img, &theirs);
        assert_eq!(
            first_diff(&qemu_snapshot_raw(&img, "q1"), &q1),
            None,
            "q1 changed"
        );
        assert_eq!(
            first_diff(&qemu_snapshot_raw(&img, "i2"), &i2),
            None,
            "i2 changed"
        );

        // writes after the revert copy shared clusters; the snapshots stay
        let cp = open(&img, 2, 1, false);
        let dp = DataPath::new(cp.clone(), 0);
        random_writes(&dp, size, &mut rng, 40);
        let active = iolift_raw(&cp);
        cp.close().unwrap();
        drop(dp);
        drop(cp);
        assert_clean(&img);
        assert_eq!(first_diff(&qemu_raw(&img), &active), None);
        assert_eq!(first_diff(&qemu_snapshot_raw(&img, target), want), None);
        std::fs::remove_file(&theirs).unwrap();
    }
}

#[test]
fn revert_matches_qemu_img() {
    revert_like_qemu("", 7);
}

#[test]
fn revert_matches_qemu_img_small_clusters_version_2() {
    revert_like_qemu("compat=0.10,cluster_size=4096", 8);
}

#[test]
fn revert_then_delete_every_snapshot_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "d.qcow2", "2M", "refcount_bits=4");
    qemu_io(&img, &["write -P 0x11 0 2M"]);
    let cp = open(&img, 4, 1, false);
    let dp = DataPath::new(cp.clone(), 0);
    cp.snapshot_create("a").unwrap();
    dp.write(4096, &[0x22; 100_000], false).unwrap();
    let written = iolift_raw(&cp);
    cp.snapshot_create("b").unwrap();
    cp.snapshot_revert("a").unwrap();
    cp.snapshot_delete("a").unwrap();
    cp.snapshot_revert("b").unwrap();
    cp.snapshot_delete("b").unwrap();
    assert_eq!(first_diff(&iolift_raw(&cp), &written), None);
    cp.close().unwrap();
    drop(dp);
    drop(cp);
    assert_clean(&img);
    assert_eq!(first_diff(&qemu_raw(&img), &written), None);
    let info = run_ok(cmd("qemu-img").args(["snapshot", "-l"]).arg(&img)).stdout;
    assert!(!info.contains(" a ") && !info.contains(" b "), "{info}");
}
