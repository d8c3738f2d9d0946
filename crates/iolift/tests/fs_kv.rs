//! `iolift fs mount kv:rados:POOL`: the kv backend in a pool of its own
//! (one replica) on the suite's shared local Ceph cluster
//! (iolift_testkit::ceph; scripts/ceph-local.sh), through the kernel's
//! FUSE client: fio verify, many small files with checksums, rsync -c of
//! a flat directory, overwrite/truncate/append against an in-memory model,
//! what a flat namespace refuses, the objects seen with `rados`, a
//! remount that reads everything back, and clear errors for a bad spec
//! and a missing pool. Needs root (FUSE mount) and the Ceph daemons; a
//! missing tool fails the test with the package to install.

mod common;
#[path = "common/fs_mount.rs"]
mod fs_mount;
#[path = "common/fs_workloads.rs"]
mod fs_workloads;
mod rbd_util;
use common::*;
use fs_mount::FsMount;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// Mounts the kv backend `spec` on `mnt`; its first line must say it
/// serves kv.
fn kv_mount(spec: &str, mnt: &Path) -> FsMount {
    let m = FsMount::start(spec, mnt, &[]);
    assert!(
        m.lines[0].contains("serving kv"),
        "first line: {:?}",
        m.lines
    );
    m
}

fn rados(conf: &Path, pool: &str, args: &[&str]) -> Out {
    run_ok(
        cmd("rados")
            .arg("-c")
            .arg(conf)
            .args(["-p", pool])
            .args(args),
    )
}

/// Random writes, truncations and appends on one file, checked against a
/// model after every step (the object size is 64 KiB, so steps cross
/// objects, and shrinking then growing must read zeros).
fn model_check(path: &Path, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut model: Vec<u8> = Vec::new();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    for step in 0..120 {
        match rng.below(3) {
            0 => {
                let off = rng.below(400_000) as usize;
                let data = random_bytes(rng.below(150_000) as usize + 1, rng.next_u64());
                f.seek(SeekFrom::Start(off as u64)).unwrap();
                f.write_all(&data).unwrap();
                if model.len() < off + data.len() {
                    model.resize(off + data.len(), 0);
                }
                model[off..off + data.len()].copy_from_slice(&data);
            }
            1 => {
                let len = rng.below(450_000) as usize;
                f.set_len(len as u64).unwrap();
                model.resize(len, 0);
            }
            _ => {
                let mut a = fs::OpenOptions::new().append(true).open(path).unwrap();
                let data = random_bytes(rng.below(70_000) as usize, rng.next_u64());
                a.write_all(&data).unwrap();
                model.extend_from_slice(&data);
            }
        }
        if step % 10 == 9 {
            let mut got = Vec::new();
            f.seek(SeekFrom::Start(0)).unwrap();
            f.read_to_end(&mut got).unwrap();
            assert_eq!(got.len(), model.len(), "size after step {step}");
            assert!(
                got == model,
                "content differs from the model after step {step}"
            );
        }
    }
    assert_eq!(fs::metadata(path).unwrap().len(), model.len() as u64);
}

/// What `rsync -ac` would still change from `src` to `dst`, by checksum,
/// leaving out the root directory's own line (the flat file system's
/// root has fixed mode and times).
fn rsync_diff(src: &str, dst: &str) -> String {
    let out = run_ok(cmd("rsync").args(["-ac", "--dry-run", "--itemize-changes", src, dst]));
    let rest: Vec<&str> = out.stdout.lines().filter(|l| !l.ends_with(" ./")).collect();
    rest.join("\n")
}

#[test]
fn kv_rados_serves_a_flat_file_system_from_objects() {
    let _h = heavy();
    require_root("the FUSE tests need root (mount(2))");
    for t in ["fio", "rsync", "sha256sum"] {
        require_tool(t);
    }
    // One replica: the pool's objects live on one OSD.
    let cl = rbd_util::Cluster::shared("kvfs", 1, None);
    let (conf, pool) = (cl.conf.clone(), cl.pool.as_str());
    let spec = format!("kv:rados:{pool},conf={},object_size=64K", conf.display());
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");

    // Bad specs and a missing pool fail before mounting, naming the part.
    for (bad, says) in [
        ("kv:rados:".to_string(), "pool name is missing"),
        ("kv:redis:x".to_string(), "unknown store"),
        (format!("kv:rados:{pool},object_size=5K"), "object_size=5K"),
        (
            format!("kv:rados:nosuchpool,conf={},timeout=20", conf.display()),
            "pool \"nosuchpool\" does not exist",
        ),
    ] {
        fs::create_dir_all(&mnt).unwrap();
        let out = run_fail(
            Command::new(iolift_bin())
                .args(["fs", "mount", &bad])
                .arg(&mnt),
        );
        assert!(out.stderr.contains(says), "{bad}: {}", out.report());
        assert!(!is_mounted(&mnt));
    }

    let mut m = kv_mount(&spec, &mnt);

    // fio verify on a few files (two jobs, one file each).
    fs_workloads::fio_verify(&mnt, 4, None);

    // Many small files, read back with checksums.
    let mut sums = BTreeMap::new();
    let mut rng = Rng::new(7);
    for i in 0..300 {
        let data = random_bytes(rng.below(20_000) as usize, rng.next_u64());
        let name = format!("small-{i:03}");
        fs::write(m.p(&name), &data).unwrap();
        sums.insert(name, data);
    }
    for (name, data) in &sums {
        assert!(fs::read(m.p(name)).unwrap() == *data, "{name} differs");
    }

    // rsync -c of a flat directory (rsync writes temp names, then renames).
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..40 {
        write_random_file(
            &src.join(format!("r{i}.bin")),
            (i * 9_001) % 300_000,
            i as u64,
        );
    }
    let (s, d) = (format!("{}/", src.display()), format!("{}/", mnt.display()));
    run_ok(cmd("rsync").args(["-a", &s, &d]));
    assert_eq!(rsync_diff(&s, &d), "", "rsync -c found differences");

    // Overwrite/truncate/append against a model.
    model_check(&m.p("model.bin"), 99);

    // What a flat namespace refuses, and rename/unlink semantics.
    let e = fs::create_dir(m.p("sub")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "mkdir: {e}");
    let e = fs::hard_link(m.p("small-000"), m.p("hard")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "link: {e}");
    let e = std::os::unix::fs::symlink("small-000", m.p("sym")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "symlink: {e}");
    let ino = fs::metadata(m.p("small-001")).unwrap().ino();
    fs::rename(m.p("small-001"), m.p("renamed")).unwrap();
    assert_eq!(fs::metadata(m.p("renamed")).unwrap().ino(), ino);
    assert!(fs::read(m.p("renamed")).unwrap() == sums["small-001"]);
    assert!(!m.p("small-001").exists());
    fs::rename(m.p("small-002"), m.p("small-003")).unwrap();
    assert!(fs::read(m.p("small-003")).unwrap() == sums["small-002"]);
    // An open file outlives its name.
    let mut open = fs::File::open(m.p("small-004")).unwrap();
    fs::remove_file(m.p("small-004")).unwrap();
    let mut got = Vec::new();
    open.read_to_end(&mut got).unwrap();
    assert!(got == sums["small-004"], "unlinked-but-open read");
    drop(open);
    let listed: Vec<String> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(listed.contains(&"renamed".to_string()) && listed.contains(&"r39.bin".to_string()));
    assert!(!listed.iter().any(|n| n == "small-004" || n == "small-001"));
    let files_before = listed.len();

    // The data is in RADOS: the index's omap keys are the names and the
    // file's first object holds its first 64 KiB.
    let keys = rados(&conf, pool, &["listomapkeys", "kvfs.index"]).stdout;
    assert!(keys.lines().any(|k| k == "small-010"), "{keys}");
    assert!(!keys.lines().any(|k| k == "small-004"), "{keys}");
    let big = m.p("r30.bin");
    let id = fs::metadata(&big).unwrap().ino();
    let obj = tmp.path().join("obj");
    rados(
        &conf,
        pool,
        &[
            "get",
            &format!("kvfs.{id:x}.00000000"),
            obj.to_str().unwrap(),
        ],
    );
    let want = fs::read(&big).unwrap();
    assert!(want.len() > 65536);
    assert!(
        fs::read(&obj).unwrap() == want[..65536],
        "object 0 of r30.bin"
    );
    let objs = rados(&conf, pool, &["ls"]).stdout;
    assert!(objs.lines().any(|o| o == "kvfs.index"), "{objs}");

    // Remount: names, node ids and bytes come back from the pool.
    let sizes: Vec<(String, u64, u64)> = listed
        .iter()
        .map(|n| {
            let md = fs::metadata(m.p(n)).unwrap();
            (n.clone(), md.ino(), md.len())
        })
        .collect();
    m.stop();
    let m = kv_mount(&spec, &mnt);
    assert_eq!(fs::read_dir(&mnt).unwrap().count(), files_before);
    for (n, ino, len) in &sizes {
        let md = fs::metadata(m.p(n)).unwrap();
        assert_eq!((md.ino(), md.len()), (*ino, *len), "{n} after remount");
    }
    for (name, data) in sums.iter().filter(|(n, _)| {
        !["small-001", "small-002", "small-003", "small-004"].contains(&n.as_str())
    }) {
        assert!(
            fs::read(m.p(name)).unwrap() == *data,
            "{name} after remount"
        );
    }
    assert_eq!(rsync_diff(&s, &d), "", "rsync -c after remount");
    // A listing longer than one page of the index (1024 keys) and than
    // one kernel buffer: every name once, in key order.
    let mut want: Vec<String> = listed.clone();
    for i in 0..1500 {
        let n = format!("many-{i:04}");
        fs::write(m.p(&n), i.to_string()).unwrap();
        want.push(n);
    }
    want.sort();
    let mut got: Vec<String> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    got.sort();
    assert_eq!(got.len(), want.len(), "entries listed");
    assert!(got == want, "the listing differs from the names created");
    // Deleting everything leaves no data objects behind.
    for n in &want {
        fs::remove_file(m.p(n)).unwrap();
    }
    assert_eq!(fs::read_dir(&mnt).unwrap().count(), 0);
    drop(m);
    let objs = rados(&conf, pool, &["ls"]).stdout;
    let left: Vec<&str> = objs
        .lines()
        .filter(|o| o.starts_with("kvfs.") && *o != "kvfs.index")
        .collect();
    assert!(
        left.is_empty(),
        "data objects left after unlinking every file: {left:?}"
    );
}
