//! The O_DIRECT data path (`Options::direct`): aligned reads and in-place
//! writes go past the page cache, unaligned ones through it, the control
//! plane's metadata and allocating writes through it too; qemu-img must
//! read what a model says and find the image clean.

mod common;
use common::*;
use iolift_qcow2::{ControlPlane, DataPath, Options, Served};
use iolift_testkit::rng::Rng;

#[test]
fn direct_reads_and_writes_match_qemu() {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "d.qcow2", "8M", "");
    qemu_io(&img, &["write -P 0x5c 0 8M"]);
    let mut model = vec![0x5cu8; 8 << 20];
    let opts = Options {
        read_only: false,
        cache_entries: 64,
        data_paths: 2,
        direct: true,
    };
    let cp = match ControlPlane::open(&img, &opts) {
        Ok(cp) => cp,
        Err(e) => {
            panic!("O_DIRECT open failed (the test folder's file system must support it): {e}")
        }
    };
    let dp = DataPath::new(cp.clone(), 1);
    let mut rng = Rng::new(5);
    let mut hits = 0;
    for i in 0..400 {
        // mostly 4 KiB aligned (direct), some unaligned (buffered)
        let (off, len) = if i % 5 == 0 {
            let off = rng.below((8 << 20) - 70_000);
            (off, 1 + rng.below(70_000) as usize)
        } else {
            (rng.below(2048) * 4096, 4096 * (1 + rng.below(40) as usize))
        };
        let len = len.min((8 << 20) - off as usize);
        if rng.below(2) == 0 {
            let data = rng.bytes(len);
            dp.write(off, &data, false).unwrap();
            model[off as usize..off as usize + len].copy_from_slice(&data);
        } else {
            let mut b = vec![0u8; len];
            if dp.read_served(off, &mut b).unwrap() == Served::Hit {
                hits += 1;
            }
            assert_eq!(
                first_diff(&b, &model[off as usize..off as usize + len]),
                None,
                "read {off}+{len}"
            );
        }
        if i == 200 {
            // a snapshot: writes now allocate (buffered) next to direct reads
            cp.snapshot_create("mid").unwrap();
        }
    }
    assert!(hits > 0, "no read hit the cache");
    assert_eq!(first_diff(&iolift_raw(&cp), &model), None);
    cp.close().unwrap();
    drop(dp);
    drop(cp);
    assert_clean(&img);
    assert_eq!(first_diff(&qemu_raw(&img), &model), None);
}
