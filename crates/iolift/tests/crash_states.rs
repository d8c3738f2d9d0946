//! The crash-state explorer on a real file system: ext4 made and used
//! through `iolift attach` (FUSE file + loop device) with the write-back
//! cache stage on top of the `log-writes` stage, then `iolift crash-states`
//! over a few hundred of the states a power loss could leave, each checked
//! with e2fsck and for the files that had been fsynced before it.
//!
//! The same workload over `log-writes:...,fault=ack-flush-early` (a flush
//! acknowledged before it is done) must be caught, and the printed rebuild
//! command must give a state that fails the same check.
//!
//! Needs root (mount(2), losetup) and /dev/fuse, like fuse_attach.rs.

mod common;
use common::*;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What one workload run left: the log, the base image, the offset after
/// mkfs, and for every fsynced file its name, content hash and the log's
/// size when its fsync returned.
struct Run {
    log: PathBuf,
    base: PathBuf,
    after_mkfs: u64,
    synced: Vec<(String, String, u64)>,
}

const IMAGE_SIZE: u64 = 48 << 20;

/// mkfs.ext4, then files written and fsynced one by one (and some left
/// unsynced) through cache (write-back) over log-writes over a file.
fn workload(dir: &Path, log_opts: &str) -> Run {
    let img = dir.join("backend.img");
    let base = dir.join("base.img");
    fs::File::create(&img).unwrap().set_len(IMAGE_SIZE).unwrap();
    fs::File::create(&base)
        .unwrap()
        .set_len(IMAGE_SIZE)
        .unwrap();
    let log = dir.join("run.log");
    let stages = [
        "cache:size=4M,mode=writeback,max_age=10s".to_string(),
        format!("log-writes:path={}{log_opts}", log.display()),
    ];
    let args: Vec<&str> = stages.iter().flat_map(|s| ["--stage", s]).collect();
    let mut a = Attached::start(dir, &format!("file:{}", img.display()), &args);
    assert!(
        a.dev.to_string_lossy().starts_with("/dev/loop"),
        "attach printed {:?}",
        a.dev
    );
    run_ok(
        cmd("mkfs.ext4")
            .args([
                "-F",
                "-q",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(&a.dev),
    );
    let after_mkfs = fs::metadata(&log).unwrap().len();
    let mnt = dir.join("mnt");
    let mut m = Mount::new(&a.dev, &mnt);
    let size = |p: &Path| fs::metadata(p).unwrap().len();
    let mut synced = Vec::new();
    let mut rng = Rng::new(20);
    for k in 0..10u64 {
        // Unsynced files beside each synced one, some renamed or removed.
        for j in 0..3 {
            let loose = mnt.join(format!("loose{k}_{j}"));
            fs::write(&loose, rng.bytes(6000 + 9000 * j + 3000 * k as usize)).unwrap();
        }
        if k % 3 == 1 {
            fs::rename(
                mnt.join(format!("loose{k}_0")),
                mnt.join(format!("moved{k}")),
            )
            .unwrap();
            fs::remove_file(mnt.join(format!("loose{}_1", k - 1))).unwrap();
        }
        let name = format!("synced{k}");
        let data = rng.bytes(30_000 + 11_000 * k as usize);
        let mut f = fs::File::create(mnt.join(&name)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        if k % 4 == 3 {
            // Directory entries made durable by fsync of the directory.
            fs::File::open(&mnt).unwrap().sync_all().unwrap();
        }
        synced.push((name.clone(), sha256_file(&mnt.join(&name)), size(&log)));
    }
    m.umount();
    a.detach();
    Run {
        log,
        base,
        after_mkfs,
        synced,
    }
}

/// The check script: e2fsck replays the journal (as a mount would) and must
/// then find the file system clean; each file fsynced at or before the
/// crash's log offset must be whole. Counts the files it verified.
fn check_script(dir: &Path, run: &Run) -> PathBuf {
    let expect = dir.join("expect.txt");
    let mut e = String::new();
    for (name, sha, off) in &run.synced {
        e.push_str(&format!("{off} {name} {sha}\n"));
    }
    fs::write(&expect, e).unwrap();
    let count = dir.join("verified.txt");
    let script = dir.join("check.sh");
    fs::write(
        &script,
        format!(
            r#"#!/bin/sh
img="$1"
e2fsck -E journal_only -y "$img" >/dev/null 2>&1
rc=$?
if [ $rc -ge 4 ]; then echo "journal replay failed ($rc)"; exit 1; fi
if ! out=$(e2fsck -fn "$img" 2>&1); then echo "e2fsck -fn not clean:"; echo "$out"; exit 1; fi
while read off name sha; do
  [ "$IOLIFT_CRASH_OFFSET" -ge "$off" ] || continue
  got=$(debugfs -R "cat /$name" "$img" 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "fsynced file $name (synced at log offset $off) lost: sha256 $got, want $sha"
    exit 1
  fi
  echo x >> '{count}'
done < '{expect}'
exit 0
"#,
            count = count.display(),
            expect = expect.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn explore(run: &Run, script: &Path, max_states: usize) -> Out {
    run_timeout(
        Command::new(iolift_bin())
            .arg("crash-states")
            .arg(&run.log)
            .arg("--base")
            .arg(&run.base)
            .arg("--check")
            .arg(format!("{} {{}}", script.display()))
            .arg("--from")
            .arg(run.after_mkfs.to_string())
            .args(["--max-states", &max_states.to_string(), "--samples", "40"])
            // Multi-block writes may land in part: each 4 KiB block on its own.
            .args(["--tear", "4k"])
            .args(["--jobs", "2"]),
        Duration::from_secs(300),
    )
}

fn setup() {
    require_root("the crash-state tests need root (mount(2), losetup)");
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: the crash-state tests need a kernel with FUSE"
    );
    for t in ["mkfs.ext4", "e2fsck", "debugfs", "sha256sum"] {
        require_tool(t);
    }
}

#[test]
fn ext4_through_cache_survives_every_explored_crash_state() {
    setup();
    let _h = heavy();
    let tmp = tempfile::tempdir().unwrap();
    let run = workload(tmp.path(), "");
    let script = check_script(tmp.path(), &run);
    let o = explore(&run, &script, 200);
    eprintln!("{}", o.all());
    assert!(o.status.success(), "crash-states failed:\n{}", o.all());
    let n: usize = o
        .stdout
        .split_whitespace()
        .nth(1)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no state count in:\n{}", o.all()));
    assert!((150..=200).contains(&n), "{n} states checked:\n{}", o.all());
    let verified = fs::read_to_string(tmp.path().join("verified.txt")).unwrap_or_default();
    assert!(
        verified.lines().count() >= n,
        "only {} fsynced-file checks in {n} states: the check was mostly vacuous",
        verified.lines().count()
    );
}

#[test]
fn a_flush_acknowledged_early_is_caught_and_rebuilt() {
    setup();
    let _h = heavy();
    let tmp = tempfile::tempdir().unwrap();
    let run = workload(tmp.path(), ",fault=ack-flush-early");
    let script = check_script(tmp.path(), &run);
    let o = explore(&run, &script, 250);
    let out = o.all();
    eprintln!("{out}");
    assert_eq!(o.status.code(), Some(1), "not caught:\n{out}");
    assert!(out.contains("FAILED"), "{out}");
    // The first line the check printed for the failing state.
    let why = o
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("check "))
        .nth(1)
        .unwrap_or_else(|| panic!("no check output:\n{out}"))
        .trim()
        .to_string();
    // The printed command rebuilds a state that fails the same way.
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("rebuild it: "))
        .unwrap_or_else(|| panic!("no rebuild command:\n{out}"));
    let replay = line
        .split_whitespace()
        .skip_while(|w| *w != "--replay")
        .nth(1)
        .unwrap()
        .to_string();
    let offset = out
        .split("log offset ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap()
        .to_string();
    let state = tmp.path().join("state.img");
    run_ok(
        Command::new(iolift_bin())
            .arg("crash-states")
            .arg(&run.log)
            .arg("--base")
            .arg(&run.base)
            .args(["--tear", "4k", "--replay", &replay, "--out"])
            .arg(&state),
    );
    let c = run_fail(
        Command::new(&script)
            .arg(&state)
            .env("IOLIFT_CRASH_OFFSET", &offset),
    );
    assert!(c.all().contains(&why), "want {why:?}, got:\n{}", c.all());
}
