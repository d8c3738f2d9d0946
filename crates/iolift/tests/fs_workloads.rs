//! `iolift fs mount`: real workloads on the kernel's FUSE client over the
//! mirror backend (fio verify, tar in and out, git, sqlite3, rsync -c),
//! the null backend, path-escape races, metrics and a clean unmount on
//! SIGTERM. Needs root (FUSE mount); CI runs as root.

mod common;
#[path = "common/fs_mount.rs"]
mod fs_mount;
#[path = "common/fs_workloads.rs"]
mod workloads;
use common::*;
use fs_mount::FsMount;
use iolift_testkit::fsmount::{http_get, mount_layout};

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn fio_verify_on_the_mirror_with_and_without_writeback_cache() {
    let _h = heavy();
    for extra in [&[][..], &["--writeback-cache"][..]] {
        let (_tmp, src, mnt) = mount_layout();
        let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, extra);
        workloads::fio_verify(&m.mnt, 32, Some(&src));
    }
}

#[test]
fn tar_in_and_out_keeps_every_byte() {
    let _h = heavy();
    let (tmp, src, mnt) = mount_layout();
    let m = FsMount::start(
        &format!("mirror:{}", src.display()),
        &mnt,
        &["--threads", "3"],
    );
    workloads::tar_round_trip(tmp.path(), &m.mnt, &src);
}

#[test]
fn git_clone_checkout_and_status_on_the_mount() {
    let (_tmp, src, mnt) = mount_layout();
    let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, &[]);
    workloads::git_history(&m.mnt, Some(&src), 20, 7, 5);
}

#[test]
fn sqlite_database_passes_integrity_check() {
    let (_tmp, src, mnt) = mount_layout();
    let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, &[]);
    workloads::sqlite_rows(&m.mnt, &src, 20, true);
}

#[test]
fn rsync_checksums_match_the_source() {
    let (tmp, src, mnt) = mount_layout();
    let m = FsMount::start(&format!("mirror:{}", src.display()), &mnt, &[]);
    workloads::rsync_tree(tmp.path(), &m.mnt, &src);
}

#[test]
fn rename_races_with_symlinks_never_reach_outside() {
    let (tmp, src, mnt) = mount_layout();
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
