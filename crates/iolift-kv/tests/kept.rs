//! Closed files keep their caches (as the page cache keeps a closed
//! file's pages) until all caches together pass the budget: a table read
//! back right after it was written costs no I/O, the budget still holds,
//! and a removed file's kept cache is never served again.

use iolift_direct::fs::{mkfs, Fs, Mkfs, CACHE_SHARE_MIN};
use iolift_direct::{Config, Direct, Engine, Open, Target};
use iolift_kv::{AccelEnv, EnvConfig};
use rusty_leveldb::env::Env;
use std::io::Write;
use std::path::Path;

const BS: usize = 4096;
const BUDGET: usize = 64;

fn env(image: &Path) -> AccelEnv {
    let t = Target::open(
        image,
        &Open {
            direct: Direct::Auto,
            create_size: Some(64 << 20),
            ..Open::default()
        },
    )
    .unwrap();
    let cfg = Config {
        inline: true,
        ..Config::default()
    };
    let eng = Engine::new(t, cfg).unwrap();
    mkfs(
        &eng,
        &Mkfs {
            block_size: BS as u32,
            inodes: 0,
        },
    )
    .unwrap();
    let cfg = EnvConfig {
        cache_blocks: 32,
        cache_budget: BUDGET,
        ..EnvConfig::default()
    };
    AccelEnv::new(Fs::mount(eng).unwrap(), &cfg, None)
}

fn enters(e: &AccelEnv) -> u64 {
    e.with_fs(|fs| Ok(fs.engine().stats().enters)).unwrap()
}

fn cached(e: &AccelEnv) -> usize {
    e.with_fs(|fs| Ok(fs.cached_blocks())).unwrap()
}

fn data(i: usize) -> Vec<u8> {
    (0..20 * BS).map(|j| (j * 7 + i * 13) as u8).collect()
}

fn write(e: &AccelEnv, name: &str, d: &[u8]) {
    let mut w = e.open_writable_file(Path::new(name)).unwrap();
    w.write_all(d).unwrap();
    w.flush().unwrap();
}

fn read_all(e: &AccelEnv, name: &str, len: usize) -> Vec<u8> {
    let r = e.open_random_access_file(Path::new(name)).unwrap();
    let mut got = vec![0u8; len];
    let mut off = 0;
    while off < len {
        let n = r
            .read_at(off, &mut got[off..(off + 3000).min(len)])
            .unwrap();
        assert!(n > 0, "{name}: short file at {off}");
        off += n;
    }
    got
}

#[test]
fn closed_files_keep_their_caches_within_the_budget() {
    let d = tempfile::tempdir().unwrap();
    let e = env(&d.path().join("kv.img"));
    e.mkdir(Path::new("/db")).unwrap();
    write(&e, "/db/a", &data(0));
    assert!(
        cached(&e) >= 20,
        "the closed file's blocks stay: {}",
        cached(&e)
    );
    let before = enters(&e);
    assert!(read_all(&e, "/db/a", 20 * BS) == data(0), "/db/a read back");
    assert_eq!(enters(&e), before, "read back from the kept cache: no I/O");

    // Many more files than the budget holds: it still holds, and every
    // file reads back right (from the disk where its cache was dropped).
    for i in 1..12 {
        write(&e, &format!("/db/f{i}"), &data(i));
        assert!(
            cached(&e) <= BUDGET + CACHE_SHARE_MIN,
            "after closing f{i}: {} blocks cached",
            cached(&e)
        );
    }
    for i in 1..12 {
        assert!(
            read_all(&e, &format!("/db/f{i}"), 20 * BS) == data(i),
            "f{i}"
        );
        assert!(cached(&e) <= BUDGET + CACHE_SHARE_MIN, "{}", cached(&e));
    }

    // Removed, then a new file under the same name (it may get the same
    // inode): its own bytes, not the kept ones.
    e.delete(Path::new("/db/f11")).unwrap();
    let fresh: Vec<u8> = vec![0xA5; 3 * BS];
    write(&e, "/db/f11", &fresh);
    assert!(
        read_all(&e, "/db/f11", 3 * BS) == fresh,
        "the new file's bytes"
    );
    // Renamed over: the target's kept cache goes too.
    write(&e, "/db/tmp", &data(40));
    e.rename(Path::new("/db/tmp"), Path::new("/db/f10"))
        .unwrap();
    assert!(
        read_all(&e, "/db/f10", 20 * BS) == data(40),
        "renamed-over file"
    );
    e.unmount().unwrap();
}

fn ops(e: &AccelEnv) -> u64 {
    e.with_fs(|fs| Ok(fs.engine().stats().ops)).unwrap()
}

fn size_on_disk(e: &AccelEnv, name: &str) -> u64 {
    e.with_fs(|fs| fs.stat(name).map(|s| s.size)).unwrap()
}

/// A closed file that was never synced is written only when it has to be:
/// not at all when it is removed first (the engine's old log), before a
/// rename (the engine's CURRENT), at unmount otherwise.
#[test]
fn unsynced_closed_files_are_written_only_when_needed() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("kv.img");
    let e = env(&img);
    e.mkdir(Path::new("/db")).unwrap();
    let unsynced = |name: &str, i: usize| {
        let mut w = e.open_writable_file(Path::new(name)).unwrap();
        w.write_all(&data(i)).unwrap();
    };
    // Closed and removed: no data block written.
    let before = ops(&e);
    unsynced("/db/log", 1);
    e.delete(Path::new("/db/log")).unwrap();
    let spent = ops(&e) - before;
    assert!(
        spent < 10,
        "{spent} requests to create, close and remove a 20-block file"
    );
    // Renamed: its bytes and size are on the disk before the new name.
    unsynced("/db/tmp", 2);
    assert_eq!(size_on_disk(&e, "/db/tmp"), 0, "closed, not yet synced");
    e.rename(Path::new("/db/tmp"), Path::new("/db/CURRENT"))
        .unwrap();
    assert_eq!(size_on_disk(&e, "/db/CURRENT"), (20 * BS) as u64);
    // Left closed and unsynced: written at unmount, there after a remount.
    unsynced("/db/last", 3);
    e.unmount().unwrap();
    let t = Target::open(&img, &Open::default()).unwrap();
    let cfg = Config {
        inline: true,
        ..Config::default()
    };
    let e2 = AccelEnv::new(
        Fs::mount(Engine::new(t, cfg).unwrap()).unwrap(),
        &EnvConfig::default(),
        None,
    );
    assert!(
        read_all(&e2, "/db/last", 20 * BS) == data(3),
        "/db/last after remount"
    );
    assert!(
        read_all(&e2, "/db/CURRENT", 20 * BS) == data(2),
        "/db/CURRENT after remount"
    );
    assert!(!e2.exists(Path::new("/db/log")).unwrap());
    let r = e2
        .with_fs(|fs| Ok(iolift_direct::fs::fsck::fsck(fs)))
        .unwrap();
    assert!(
        r.is_consistent() && r.leaked_blocks.is_empty(),
        "fsck: {:?}",
        r.errors
    );
    e2.unmount().unwrap();
}
