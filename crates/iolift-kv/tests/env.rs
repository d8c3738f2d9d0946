//! The key-value store on AccelFS: db_bench-style runs with every key
//! read back (the runner's `verify`), the file system checked by fsck
//! after each, a reopen that finds every key again, and the same runs on
//! the engine's POSIX environment for comparison.

use iolift_direct::fs::{fsck, mkfs, Fs, Mkfs};
use iolift_direct::{Config, Direct, Engine, Open, Target};
use iolift_kv::bench::{run, BenchOpts};
use iolift_kv::{AccelEnv, EnvConfig, PosixSyncEnv, SyncMode};
use rusty_leveldb::{LdbIterator, Options, DB};
use std::path::Path;
use std::rc::Rc;

fn accel(image: &Path, fresh: bool, cache_blocks: usize) -> AccelEnv {
    accel_sync(image, fresh, cache_blocks, SyncMode::Hard)
}

fn accel_sync(image: &Path, fresh: bool, cache_blocks: usize, sync: SyncMode) -> AccelEnv {
    let t = Target::open(
        image,
        &Open {
            direct: Direct::Auto,
            create_size: fresh.then_some(256 << 20),
            ..Open::default()
        },
    )
    .unwrap();
    let eng = Engine::new(t, Config::default()).unwrap();
    if fresh {
        mkfs(
            &eng,
            &Mkfs {
                block_size: 4096,
                inodes: 0,
            },
        )
        .unwrap();
    }
    // A total budget of 4 files' worth: with more files open, the budget
    // (not each file's bound) decides what is evicted.
    let cfg = EnvConfig {
        cache_blocks,
        cache_budget: cache_blocks * 4,
        sync,
        ..EnvConfig::default()
    };
    AccelEnv::new(Fs::mount(eng).unwrap(), &cfg, None)
}

fn options(env: Box<dyn rusty_leveldb::env::Env>) -> Options {
    Options {
        env: Rc::new(env),
        // Small memtables and tables: compactions, many files, renames.
        write_buffer_size: 64 << 10,
        max_file_size: 128 << 10,
        max_open_files: 30,
        ..Options::default()
    }
}

fn bench(benchmarks: &str, num: u64, value_size: usize, threads: usize) -> BenchOpts {
    BenchOpts {
        benchmarks: benchmarks.split(',').map(String::from).collect(),
        num,
        value_size,
        threads,
        ..BenchOpts::default()
    }
}

fn assert_fsck_clean(env: &AccelEnv) {
    let r = env.with_fs(|fs| Ok(fsck::fsck(fs))).unwrap();
    assert!(r.errors.is_empty(), "fsck errors: {:#?}", r.errors);
    assert!(r.files > 3, "the database's files are there: {r:?}");
}

/// Every key of a dump, in order.
fn dump(opt: &Options, db: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut d = DB::open(db, opt.clone()).unwrap();
    let mut it = d.new_iter().unwrap();
    let mut out = Vec::new();
    while it.advance() {
        let (k, v) = it.current().unwrap();
        out.push((k.to_vec(), v.to_vec()));
    }
    drop(it);
    d.close().unwrap();
    out
}

#[test]
fn db_bench_runs_verified_on_accelfs() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("kv.img");
    let env = accel(&image, true, 4);
    let opt = options(Box::new(env.clone()));
    let mut out = Vec::new();
    let o = bench(
        "fillseq,verify,fillrandom,overwrite,verify,readseq,readrandom,compact,verify",
        6000,
        100,
        1,
    );
    let reports = run(&o, &opt, Path::new("/db"), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(reports.len(), 9, "{text}");
    for r in &reports {
        assert!(r.micros_per_op > 0.0, "{text}");
        if r.name == "verify" {
            assert!(r.message.contains(" 0 missing, 0 wrong"), "{text}");
            assert_eq!(r.ops, 6000, "every key checked: {text}");
        }
    }
    let readseq = &reports[5];
    let rr = &reports[6];
    assert!(rr.message.starts_with("(") && rr.message.contains("of 6000 found"));
    assert!(
        text.lines().any(|l| l.starts_with("fillseq      :")
            && l.contains("micros/op;")
            && l.ends_with("MB/s")),
        "{text}"
    );
    assert_fsck_clean(&env);
    // Reopen on a new mount: the same keys and values.
    let before = dump(&opt, "/db");
    assert_eq!(
        before.len() as u64,
        readseq.ops,
        "readseq saw every key: {text}"
    );
    assert!(
        before.len() > 3000,
        "fills wrote most keys: {}",
        before.len()
    );
    drop(opt);
    env.unmount().unwrap();
    let env = accel(&image, false, 16);
    let opt = options(Box::new(env.clone()));
    assert!(dump(&opt, "/db") == before, "same contents after a remount");
    assert_fsck_clean(&env);
}

#[test]
fn threads_and_large_values_on_accelfs() {
    let dir = tempfile::tempdir().unwrap();
    let env = accel(&dir.path().join("kv.img"), true, 16);
    let opt = options(Box::new(env.clone()));
    let mut out = Vec::new();
    let o = bench(
        "fillrandom,verify,readrandom,fillsync,verify",
        2000,
        1024,
        4,
    );
    let reports = run(&o, &opt, Path::new("/db"), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(reports[0].ops, 8000, "four threads of 2000 writes: {text}");
    assert!(reports[1].message.contains(" 0 missing, 0 wrong"), "{text}");
    assert_eq!(reports[3].ops, 8, "fillsync: num/1000 per thread: {text}");
    assert!(reports[4].message.contains(" 0 missing, 0 wrong"), "{text}");
    assert_fsck_clean(&env);
}

#[test]
fn posix_environment_runs_the_same_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let opt = options(Box::new(PosixSyncEnv::new()));
    let mut out = Vec::new();
    let o = bench("fillrandom,verify,fillsync,verify,readseq", 3000, 100, 1);
    let reports = run(&o, &opt, &db, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(reports[1].message.contains(" 0 missing, 0 wrong"), "{text}");
    assert!(reports[3].message.contains(" 0 missing, 0 wrong"), "{text}");
    assert_eq!(reports[2].ops, 3);
    assert!(db.join("CURRENT").exists());
}

#[test]
fn bad_options_are_named() {
    let opt = options(Box::new(PosixSyncEnv::new()));
    let mut out = Vec::new();
    for (o, what) in [
        (bench("fillseq,nosuch", 10, 100, 1), "--benchmarks"),
        (bench("fillseq", 0, 100, 1), "--num"),
        (bench("fillseq", 10, 0, 1), "--value_size"),
        (bench("fillseq", 10, 100, 0), "--threads"),
    ] {
        let e = run(&o, &opt, Path::new("/nonexistent/db"), &mut out).unwrap_err();
        assert!(e.contains(what), "{e}");
    }
}

fn flushes(env: &AccelEnv) -> u64 {
    env.with_fs(|fs| Ok(fs.engine().stats().flushes)).unwrap()
}

/// Every key of the database on a copy of `image` taken now (what the
/// disk holds if the process were killed at this point).
fn dump_copy(image: &Path, copy: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    std::fs::copy(image, copy).unwrap();
    let env = accel(copy, false, 16);
    let opt = options(Box::new(env.clone()));
    let d = dump(&opt, "/db");
    drop(opt);
    env.unmount().unwrap();
    d
}

/// A hard sync ends with a device flush, a soft sync does not; with
/// either, every synced write is on the disk when the write returns (a
/// copy of the image taken then, without unmounting, holds it).
#[test]
fn soft_sync_writes_back_without_device_flushes() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, name) in [(SyncMode::Hard, "hard"), (SyncMode::Soft, "soft")] {
        let image = dir.path().join(format!("{name}.img"));
        let env = accel_sync(&image, true, 16, mode);
        let opt = options(Box::new(env.clone()));
        let mut db = DB::open("/db", opt.clone()).unwrap();
        let before = flushes(&env);
        let n = 300;
        let mut want = std::collections::BTreeMap::new();
        for i in 0..n {
            let k = format!("key{:06}", (i * 7919) % 1000);
            let v = format!("value {i} {name}");
            let mut b = rusty_leveldb::WriteBatch::default();
            b.put(k.as_bytes(), v.as_bytes());
            db.write(b, true).unwrap();
            want.insert(k.into_bytes(), v.into_bytes());
        }
        let f = flushes(&env) - before;
        match mode {
            SyncMode::Hard => assert!(f >= n, "{name}: {f} flushes for {n} syncs"),
            SyncMode::Soft => assert_eq!(f, 0, "{name}: no device flush"),
        }
        let got = dump_copy(&image, &dir.path().join(format!("{name}.copy")));
        let want: Vec<_> = want.into_iter().collect();
        assert_eq!(got.len(), want.len(), "{name}: every synced key on disk");
        assert!(got == want, "{name}: every synced value on disk");
        drop(db);
        drop(opt);
        env.unmount().unwrap();
    }
}
