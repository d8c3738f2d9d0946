//! Real workloads run on a mounted file system, each checked through the
//! mount and, where the backend keeps its files in a host directory (the
//! mirror's source, an NFS server's export), in that directory too:
//! [`fio_verify`], [`tar_round_trip`], [`git_history`], [`sqlite_rows`],
//! [`rsync_tree`]. Included with
//! `#[path = "common/fs_workloads.rs"] mod fs_workloads;` next to
//! `mod common;` and `mod fs_mount;` (it uses both).
#![allow(dead_code)]

use crate::common::*;
use crate::fs_mount::{make_tree, tree_sums};
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// fio with crc32c verification: two jobs, each writing one file of
/// `size_mib` MiB in random 4 KiB blocks under `dir`, then reading it all
/// back. With `host` (the same directory seen outside the mount) its
/// files must be those two, of that size, and equal to the mount's.
pub fn fio_verify(dir: &Path, size_mib: u64, host: Option<&Path>) {
    require_tool("fio");
    let out = run_ok(
        cmd("fio")
            .args([
                "--name=v",
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=psync",
                "--numjobs=2",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                "--group_reporting",
                // fio writes its verify state into the working directory
                // (the crate's source folder under cargo test) otherwise.
                "--verify_state_save=0",
            ])
            .arg(format!("--size={size_mib}M"))
            .arg(format!("--directory={}", dir.display())),
    );
    assert!(out.stdout.contains("v: (groupid=0"), "{}", out.report());
    let Some(host) = host else { return };
    let mut names: Vec<_> = fs::read_dir(host)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "one file per job: {names:?}");
    for n in names {
        assert_eq!(fs::metadata(host.join(&n)).unwrap().len(), size_mib << 20);
        assert_eq!(
            sha256_file(&host.join(&n)),
            sha256_file(&dir.join(&n)),
            "{n:?}: the host directory and the mount differ"
        );
    }
}

/// A tree of random files (with a symlink and a hard link, see
/// `make_tree`) made in `scratch/tree`, copied with tar into `mnt/x` and
/// back out into `scratch/back`: every copy (and `host/x`) has the same
/// bytes, the hard link is one node with two names and the link reads as
/// written.
pub fn tar_round_trip(scratch: &Path, mnt: &Path, host: &Path) {
    let tree = scratch.join("tree");
    make_tree(&tree, 11);
    let into = mnt.join("x");
    fs::create_dir(&into).unwrap();
    let copy = |from: &Path, to: &Path| {
        run_ok(Command::new("sh").arg("-c").arg(format!(
            "tar -C {} -cf - . | tar -C {} -xf -",
            from.display(),
            to.display()
        )))
    };
    copy(&tree, &into);
    let back = scratch.join("back");
    fs::create_dir(&back).unwrap();
    copy(&into, &back);
    let want = tree_sums(&tree);
    assert!(want.lines().count() > 150);
    assert_eq!(tree_sums(&into), want, "through the mount");
    assert_eq!(tree_sums(&host.join("x")), want, "in the host directory");
    assert_eq!(tree_sums(&back), want, "copied back out");
    let (a, b) = (
        fs::metadata(into.join("big.bin")).unwrap(),
        fs::metadata(into.join("big.hard")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    let (ha, hb) = (
        fs::metadata(host.join("x/big.bin")).unwrap(),
        fs::metadata(host.join("x/big.hard")).unwrap(),
    );
    assert_eq!(ha.ino(), hb.ino(), "one node on the host too");
    assert_eq!(
        fs::read_link(into.join("link")).unwrap(),
        Path::new("dir0/sub0/f1.bin")
    );
}

/// `git` with a fixed identity, in `dir`.
fn git(dir: &Path, args: &[&str]) -> Out {
    run_ok(
        cmd("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(["-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir),
    )
}

/// A repository `mnt/repo` with `commits` commits over `files` files and
/// a side branch from `HEAD~back`, cloned to `mnt/clone`, the side branch
/// checked out there: clean status, a change seen by `git status`,
/// `fsck --strict` clean, the history complete. With `host`, the clone
/// seen there is a sound repository holding the change.
pub fn git_history(mnt: &Path, host: Option<&Path>, commits: usize, files: usize, back: usize) {
    require_tool("git");
    let repo = mnt.join("repo");
    fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    for i in 0..commits {
        fs::write(
            repo.join(format!("file{}.txt", i % files)),
            format!("line {i}\n").repeat(i + 1),
        )
        .unwrap();
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", &format!("c{i}")]);
    }
    git(
        &repo,
        &["checkout", "-q", "-b", "side", &format!("HEAD~{back}")],
    );
    fs::write(repo.join("side.txt"), "side\n").unwrap();
    git(&repo, &["add", "side.txt"]);
    git(&repo, &["commit", "-q", "-m", "side"]);
    git(&repo, &["checkout", "-q", "main"]);
    git(mnt, &["clone", "-q", "repo", "clone"]);
    let clone = mnt.join("clone");
    git(&clone, &["checkout", "-q", "side"]);
    assert_eq!(
        fs::read_to_string(clone.join("side.txt")).unwrap(),
        "side\n"
    );
    assert_eq!(git(&clone, &["status", "--porcelain"]).stdout, "");
    fs::write(clone.join("file1.txt"), "changed\n").unwrap();
    assert_eq!(
        git(&clone, &["status", "--porcelain"]).stdout.trim(),
        "M file1.txt"
    );
    git(&clone, &["fsck", "--strict"]);
    let log = git(&repo, &["log", "--oneline", "main"]);
    assert_eq!(log.stdout.lines().count(), commits, "{}", log.stdout);
    if let Some(host) = host {
        git(&host.join("clone"), &["fsck", "--strict"]);
        assert_eq!(
            fs::read_to_string(host.join("clone/file1.txt")).unwrap(),
            "changed\n"
        );
    }
}

/// A sqlite3 database `mnt/t.db` (WAL journal if `wal`): `batches`
/// transactions of 250 rows with blobs, a third of the rows deleted, then
/// VACUUM; `integrity_check` must pass through the mount and in `host`,
/// the rows left must be the ones not deleted, and the host's file must
/// hold the mount's bytes.
pub fn sqlite_rows(mnt: &Path, host: &Path, batches: u64, wal: bool) {
    require_tool("sqlite3");
    let db = mnt.join("t.db");
    let mut sql = String::new();
    if wal {
        sql.push_str("PRAGMA journal_mode=WAL;\n");
    }
    sql.push_str("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB);\n");
    for batch in 0..batches {
        sql.push_str("BEGIN;\n");
        for i in 0..250 {
            let id = batch * 250 + i;
            sql.push_str(&format!(
                "INSERT INTO t(v, b) VALUES ('row {id}', randomblob({}));\n",
                100 + id % 900
            ));
        }
        sql.push_str("COMMIT;\n");
    }
    sql.push_str("DELETE FROM t WHERE id % 3 = 0;\nVACUUM;\n");
    let mut child = cmd("sqlite3")
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let q = |db: &Path, s: &str| {
        run_ok(cmd("sqlite3").arg(db).arg(s))
            .stdout
            .trim()
            .to_string()
    };
    // Row ids run 1..=n; the multiples of 3 were deleted.
    let n = batches * 250;
    assert_eq!(q(&db, "PRAGMA integrity_check;"), "ok");
    assert_eq!(q(&db, "SELECT count(*) FROM t;"), (n - n / 3).to_string());
    assert_eq!(q(&host.join("t.db"), "PRAGMA integrity_check;"), "ok");
    assert_eq!(
        sha256_file(&db),
        sha256_file(&host.join("t.db")),
        "the host directory and the mount differ"
    );
}

/// What `rsync -aHc --delete` would still change from `from` to `to`.
fn rsync_changes(from: &Path, to: &Path) -> String {
    run_ok(
        cmd("rsync")
            .args(["-aHc", "--dry-run", "--itemize-changes", "--delete"])
            .arg(format!("{}/", from.display()))
            .arg(format!("{}/", to.display())),
    )
    .stdout
}

/// A tree of random files made in `scratch/tree`, copied with `rsync -aH`
/// to `mnt/r`: `rsync -c` finds no difference through the mount nor in
/// `host/r`, and finds a change made through the mount in `host/r`.
pub fn rsync_tree(scratch: &Path, mnt: &Path, host: &Path) {
    require_tool("rsync");
    let tree = scratch.join("tree");
    make_tree(&tree, 23);
    let dst = mnt.join("r");
    run_ok(
        cmd("rsync")
            .arg("-aH")
            .arg(format!("{}/", tree.display()))
            .arg(&dst),
    );
    assert_eq!(
        rsync_changes(&tree, &dst).trim(),
        "",
        "rsync -c found differences on the mount"
    );
    assert_eq!(
        rsync_changes(&tree, &host.join("r")).trim(),
        "",
        "and in the host directory"
    );
    fs::write(dst.join("dir1/sub1/f3.bin"), b"different").unwrap();
    let out = rsync_changes(&tree, &host.join("r"));
    assert!(out.contains("dir1/sub1/f3.bin"), "{out}");
}
