//! The latency loop (HAYAGUI's Figure 5 tool): every path and operation
//! runs its count, its writes land on the file, AccelFS's file is there
//! afterwards with fsck clean, and bad sizes are errors.

use iolift_direct::fs::{fsck, Fs, Mkfs};
use iolift_direct::lat::{measure, LatOp, LatSpec, Path};
use iolift_direct::{Config, Direct, Engine, Open, Target};

fn spec(path: Path, op: LatOp, bs: usize) -> LatSpec {
    LatSpec {
        path,
        op,
        bs,
        count: 40,
        span: 4 << 20,
        direct: Direct::Auto,
        seed: 3,
        sqpoll: None,
        spin_us: 0,
        defer_taskrun: false,
    }
}

/// Blocks of `bs` bytes that hold the loop's write pattern.
fn written(file: &std::path::Path, bs: usize) -> usize {
    let data = std::fs::read(file).unwrap();
    data.chunks(bs)
        .filter(|c| c.len() == bs && c.iter().enumerate().all(|(i, &b)| b == i as u8))
        .count()
}

#[test]
fn engine_and_posix_paths() {
    let dir = tempfile::tempdir().unwrap();
    for (path, bs) in [(Path::Uring, 4096), (Path::Posix, 65536)] {
        let f = dir.path().join(format!("{path:?}.img"));
        std::fs::write(&f, vec![0u8; 4 << 20]).unwrap();
        for op in [LatOp::Read, LatOp::Write, LatOp::WriteSync] {
            let r = measure(&f, &spec(path, op, bs)).unwrap();
            assert_eq!(r.ops, 40);
            assert!(
                r.p50_us > 0.0 && r.p99_us >= r.p50_us && r.mean_us > 0.0,
                "{r:?}"
            );
        }
        let n = written(&f, bs);
        assert!(n > 5, "{path:?}: {n} blocks hold what was written");
    }
}

#[test]
fn accelfs_path() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let t = Target::open(
        &img,
        &Open {
            create_size: Some(32 << 20),
            ..Open::default()
        },
    )
    .unwrap();
    let eng = Engine::new(t, Config::default()).unwrap();
    iolift_direct::fs::mkfs(&eng, &Mkfs::default()).unwrap();
    drop(eng);
    for op in [LatOp::Read, LatOp::Write, LatOp::WriteSync] {
        let r = measure(&img, &spec(Path::Accelfs, op, 8192)).unwrap();
        assert_eq!(r.ops, 40, "{r:?}");
    }
    let t = Target::open(&img, &Open::default()).unwrap();
    let fs = Fs::mount(Engine::new(t, Config::default()).unwrap()).unwrap();
    assert_eq!(fs.stat("/lat").unwrap().size, 4 << 20);
    assert!(fsck::fsck(&fs).is_consistent());
}

#[test]
fn bad_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.img");
    std::fs::write(&f, vec![0u8; 8192]).unwrap();
    let e = measure(&f, &spec(Path::Posix, LatOp::Read, 1000)).unwrap_err();
    assert!(e.to_string().contains("request size"), "{e}");
    let e = measure(&f, &spec(Path::Uring, LatOp::Read, 16384)).unwrap_err();
    assert!(e.to_string().contains("span"), "{e}");
}
