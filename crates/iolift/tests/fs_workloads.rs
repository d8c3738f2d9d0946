//! `iolift fs mount`: real workloads on the kernel's FUSE client over the
//! mirror backend (fio verify, tar in and out, git, sqlite3, rsync -c),
//! the null backend, path-escape races, metrics and a clean unmount on
//! SIGTERM. Needs root (FUSE mount); CI runs as root.

mod common;
#[path = "common/fs_mount.rs"]
mod fs_mount;
use common::*;
use fs_mount::{make_tree, tree_sums, FsMount};

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mnt = tmp.path().join("m").join("mnt");
    fs::create_dir_all(&src).unwrap();
    (tmp, src, mnt)
}

#[test]
fn fio_verify_on_the_mirror_with_and_without_writeback_cache() {
    let _h = heavy();
    require_tool("fio");
    for extra in [&[][..], &["--writeback-cache"][..]] {
        let (_tmp, src, mnt) = layout();
        let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, extra);
        let out = run_ok(
            cmd("fio")
                .args([
                    "--name=v",
                    "--rw=randwrite",
                    "--bs=4k",
                    "--size=32M",
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
                .arg(format!("--directory={}", m.mnt.display())),
        );
        assert!(out.stdout.contains("v: (groupid=0"), "{}", out.report());
        // The data is in the host files, one per job.
        let files: Vec<_> = fs::read_dir(&src).unwrap().collect();
        assert_eq!(files.len(), 2, "{extra:?}");
        for f in files {
            assert_eq!(f.unwrap().metadata().unwrap().len(), 32 << 20);
        }
    }
}

#[test]
fn tar_in_and_out_keeps_every_byte() {
    let _h = heavy();
    let (tmp, src, mnt) = layout();
    let tree = tmp.path().join("tree");
    make_tree(&tree, 11);
    let m = FsMount::start(
        &format!("mirror:{}", src.display()),
        &mnt,
        &["--threads", "3"],
    );
    let into = m.mnt.join("x");
    fs::create_dir(&into).unwrap();
    run_ok(Command::new("sh").arg("-c").arg(format!(
        "tar -C {} -cf - . | tar -C {} -xf -",
        tree.display(),
        into.display()
    )));
    let back = tmp.path().join("back");
    fs::create_dir(&back).unwrap();
    run_ok(Command::new("sh").arg("-c").arg(format!(
        "tar -C {} -cf - . | tar -C {} -xf -",
        into.display(),
        back.display()
    )));
    let want = tree_sums(&tree);
    assert!(want.lines().count() > 150);
    assert_eq!(tree_sums(&into), want);
    assert_eq!(tree_sums(&src.join("x")), want);
    assert_eq!(tree_sums(&back), want);
    // The hard link came through as one inode with two names.
    use std::os::unix::fs::MetadataExt;
    let (a, b) = (
        fs::metadata(into.join("big.bin")).unwrap(),
        fs::metadata(into.join("big.hard")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert_eq!(
        fs::read_link(into.join("link")).unwrap(),
        Path::new("dir0/sub0/f1.bin")
    );
}

#[test]
fn git_clone_checkout_and_status_on_the_mount() {
    require_tool("git");
    let (_tmp, src, mnt) = layout();
    let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, &[]);
    let repo = m.mnt.join("repo");
    fs::create_dir(&repo).unwrap();
    let git = |dir: &Path, args: &[&str]| {
        run_ok(
            cmd("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .current_dir(dir),
        )
    };
    git(&repo, &["init", "-q"]);
    for i in 0..20 {
        fs::write(
            repo.join(format!("file{}.txt", i % 7)),
            format!("line {i}\n").repeat(i + 1),
        )
        .unwrap();
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", &format!("c{i}")]);
    }
    git(&repo, &["checkout", "-q", "-b", "side", "HEAD~5"]);
    fs::write(repo.join("side.txt"), "side\n").unwrap();
    git(&repo, &["add", "side.txt"]);
    git(&repo, &["commit", "-q", "-m", "side"]);
    git(&repo, &["checkout", "-q", "main"]);
    git(&m.mnt, &["clone", "-q", "repo", "clone"]);
    let clone = m.mnt.join("clone");
    git(&clone, &["checkout", "-q", "side"]);
    assert_eq!(
        fs::read_to_string(clone.join("side.txt")).unwrap(),
        "side\n"
    );
    let st = git(&clone, &["status", "--porcelain"]);
    assert_eq!(st.stdout, "", "clean checkout");
    fs::write(clone.join("file1.txt"), "changed\n").unwrap();
    let st = git(&clone, &["status", "--porcelain"]);
    assert_eq!(st.stdout.trim(), "M file1.txt");
    git(&clone, &["fsck", "--strict"]);
    let log = git(&repo, &["log", "--oneline", "main"]);
    assert_eq!(log.stdout.lines().count(), 20);
}

#[test]
fn sqlite_database_passes_integrity_check() {
    require_tool("sqlite3");
    let (_tmp, src, mnt) = layout();
    let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, &[]);
    let db = m.mnt.join("t.db");
    let mut sql = String::from(
        "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB);\n",
    );
    for batch in 0..20 {
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
    let mut c = cmd("sqlite3");
    c.arg(&db).stdin(Stdio::piped());
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
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
    assert_eq!(q(&db, "PRAGMA integrity_check;"), "ok");
    assert_eq!(q(&db, "SELECT count(*) FROM t;"), "3334");
    // The host sees the same database.
    assert_eq!(q(&src.join("t.db"), "PRAGMA integrity_check;"), "ok");
}

#[test]
fn rsync_checksums_match_the_source() {
    require_tool("rsync");
    let (tmp, src, mnt) = layout();
    let tree = tmp.path().join("tree");
    make_tree(&tree, 23);
    let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, &[]);
    let dst = m.mnt.join("r");
    run_ok(
        cmd("rsync")
            .arg("-aH")
            .arg(format!("{}/", tree.display()))
            .arg(&dst),
    );
    // -c: compare by checksum; nothing may differ.
    let out = run_ok(
        cmd("rsync")
            .args(["-aHc", "--dry-run", "--itemize-changes", "--delete"])
            .arg(format!("{}/", tree.display()))
            .arg(format!("{}/", dst.display())),
    );
    assert_eq!(out.stdout.trim(), "", "rsync -c found differences");
    // And a change made through the mount is found by the same check.
    fs::write(dst.join("dir1/sub1/f3.bin"), b"different").unwrap();
    let out = run_ok(
        cmd("rsync")
            .args(["-aHc", "--dry-run", "--itemize-changes"])
            .arg(format!("{}/", tree.display()))
            .arg(format!("{}/", dst.display())),
    );
    assert!(out.stdout.contains("dir1/sub1/f3.bin"), "{}", out.stdout);
}

#[test]
fn rename_races_with_symlinks_never_reach_outside() {
    let (tmp, src, mnt) = layout();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"keep").unwrap();
    fs::create_dir(src.join("d")).unwrap();
    // Relative and absolute links to outside the exported directory.
    std::os::unix::fs::symlink("../outside", src.join("rel")).unwrap();
    std::os::unix::fs::symlink(&outside, src.join("abs")).unwrap();
    let m = FsMount::start(
        &format!("mirror:{}", src.display()),
        &mnt,
        &["--ttl-ms", "0"],
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (src, stop) = (src.clone(), stop.clone());
        std::thread::spawn(move || {
            let a = std::ffi::CString::new(src.join("d").as_os_str().as_encoded_bytes()).unwrap();
            let b = std::ffi::CString::new(src.join("rel").as_os_str().as_encoded_bytes()).unwrap();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: valid paths; swaps the directory and the symlink.
                unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                n += 1;
            }
            n
        })
    };
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut i = 0;
    while Instant::now() < deadline {
        for name in ["d", "rel"] {
            let p = m.mnt.join(name).join(format!("f{i}"));
            let _ = fs::write(&p, b"x");
            let _ = fs::create_dir(m.mnt.join(name).join(format!("g{i}")));
            let _ = fs::rename(&p, m.mnt.join(name).join(format!("h{i}")));
            let _ = fs::remove_file(m.mnt.join(name).join(format!("h{i}")));
            let _ = fs::set_permissions(
                m.mnt.join(name),
                std::os::unix::fs::PermissionsExt::from_mode(0o700),
            );
        }
        i += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(racer.join().unwrap() > 10);
    // Through the mount, `rel` (../outside) resolves on the client side
    // next to the mount point, where nothing exists, and the server never
    // follows it: the real outside directory holds only what it had.
    let names: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("secret")]);
    // The absolute link reads as a link (the server does not resolve it).
    assert_eq!(fs::read_link(m.mnt.join("abs")).unwrap(), outside);
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"keep");
    // Nothing was created next to the mount point either (`../outside` there).
    assert!(!tmp.path().join("m").join("outside").exists());
}

#[test]
fn null_backend_reads_zeros_and_metrics_count_operations() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let m = FsMount::start("null:8M", &mnt, &["--metrics", &addr]);
    assert!(m.lines[1].contains(&addr), "{:?}", m.lines);
    let data = fs::read(m.mnt.join("anything")).unwrap();
    assert_eq!(data.len(), 8 << 20);
    assert!(data.iter().all(|&b| b == 0));
    fs::write(m.mnt.join("w"), vec![1u8; 1 << 20]).unwrap();
    let body = http_get(&addr, "/metrics");
    let count = |op: &str| -> u64 {
        body.lines()
            .find(|l| {
                l.starts_with("iolift_fs_requests_total{") && l.contains(&format!("op=\"{op}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("read") >= 1, "{body}");
    assert!(count("write") >= 1, "{body}");
    assert!(count("lookup") >= 2, "{body}");
    assert!(
        body.contains("# TYPE iolift_fs_latency_seconds histogram"),
        "{body}"
    );
    assert!(body.contains("iolift_fs_latency_seconds_bucket{"), "{body}");
}

#[test]
fn bad_arguments_fail_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = |args: &[&str], want: &str| {
        let out = run_fail(Command::new(iolift_bin()).args(["fs", "mount"]).args(args));
        assert!(out.stderr.contains(want), "{args:?}: {}", out.stderr);
    };
    let t = tmp.path().to_str().unwrap();
    bad(&["mirror:/no/such/dir", t], "/no/such/dir");
    bad(&["nosuch:x", t], "unknown file-system backend");
    bad(&["null:12Q", t], "null:12Q");
    bad(&["null", "/no/such/mountpoint"], "/no/such/mountpoint");
    bad(&["null", t, "--threads", "0"], "--threads");
    bad(
        &["null", t, "--passthrough"],
        "--passthrough needs the mirror",
    );
    let m = format!("mirror:{t}");
    bad(
        &[&m, t, "--passthrough", "--writeback-cache"],
        "do not go together",
    );
    assert!(!is_mounted(tmp.path()));
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}
