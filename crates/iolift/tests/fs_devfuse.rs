//! `iolift fs mount --transport uring|devfuse`: the devfuse front-end on
//! the kernel's FUSE client, over FUSE-over-io_uring and over read/write
//! on /dev/fuse: fio verify, many files created, renamed, unlinked and
//! listed against a model, a clean unmount on SIGTERM, the metrics that
//! show which path requests took (so a silent fall back to read/write
//! fails the ring tests), and the fall back itself when the kernel does
//! not offer the ring. Needs root (FUSE mount, and the fuse module's
//! enable_uring parameter, which these tests set and restore) and a
//! kernel with CONFIG_FUSE_IO_URING (Linux 6.14+).

mod common;
#[path = "common/fs_mount.rs"]
mod fs_mount;
#[path = "common/fs_workloads.rs"]
mod workloads;
use common::*;
use fs_mount::FsMount;
use iolift_testkit::fsmount::{http_get, mount_layout};

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Holds fuse's enable_uring at a value for one test (the parameter is
/// global, so these tests run one at a time) and restores it after.
struct UringParam {
    old: String,
    _g: MutexGuard<'static, ()>,
}

fn uring_param(on: bool) -> UringParam {
    static M: Mutex<()> = Mutex::new(());
    let g = M.lock().unwrap_or_else(|e| e.into_inner());
    require_root("FUSE mounts and fuse's enable_uring parameter need root");
    let old = fs::read_to_string(ENABLE_URING).unwrap_or_else(|e| {
        panic!(
            "{ENABLE_URING}: {e}: this kernel has no FUSE over io_uring \
             (needs Linux 6.14+ built with CONFIG_FUSE_IO_URING)"
        )
    });
    fs::write(ENABLE_URING, if on { "Y" } else { "N" }).unwrap_or_else(|e| {
        panic!("cannot set {ENABLE_URING} (root, and a writable /sys, are needed): {e}")
    });
    UringParam {
        old: old.trim().to_string(),
        _g: g,
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let _ = fs::write(ENABLE_URING, &self.old);
    }
}

/// Mounts the mirror of `src` with `--transport t` and metrics.
fn start(src: &Path, mnt: &Path, t: &str) -> (FsMount, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let m = FsMount::start(
        &format!("mirror:{}", src.display()),
        mnt,
        &["--transport", t, "--metrics", &addr],
    );
    (m, addr)
}

/// iolift_fs_transport_requests_total for `path` (ring or dev).
fn arrived(addr: &str, path: &str) -> u64 {
    let body = http_get(addr, "/metrics");
    body.lines()
        .find(|l| {
            l.starts_with("iolift_fs_transport_requests_total{")
                && l.contains(&format!("path=\"{path}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no transport counter for {path} in:\n{body}"))
}

/// The names in `dir` (a listing through readdir) with their contents.
fn listing(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let data = fs::read(e.path()).unwrap();
            (name, data)
        })
        .collect()
}

/// 1500 files created, a third renamed, a third of the rest unlinked, a
/// directory made and removed; after each step the mount's listing and
/// the host directory's match the model.
fn many_files(mnt: &Path, src: &Path) {
    let d = mnt.join("many");
    fs::create_dir(&d).unwrap();
    let mut model = BTreeMap::new();
    for i in 0..1500u32 {
        let name = format!("f{i:05}");
        let data = format!("{i} {}", "x".repeat((i % 97) as usize)).into_bytes();
        fs::write(d.join(&name), &data).unwrap();
        model.insert(name, data);
    }
    assert_eq!(listing(&d), model);
    for i in (0..1500u32).step_by(3) {
        let (a, b) = (format!("f{i:05}"), format!("r{i:05}"));
        fs::rename(d.join(&a), d.join(&b)).unwrap();
        let v = model.remove(&a).unwrap();
        model.insert(b, v);
    }
    assert_eq!(listing(&d), model);
    let gone: Vec<String> = model.keys().step_by(3).cloned().collect();
    for n in &gone {
        fs::remove_file(d.join(n)).unwrap();
        model.remove(n);
    }
    assert_eq!(listing(&d), model);
    assert_eq!(listing(&src.join("many")), model);
    assert_eq!(
        fs::remove_file(d.join(&gone[0])).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub").join("x"), b"x").unwrap();
    assert_eq!(fs::read(src.join("many/sub/x")).unwrap(), b"x");
    fs::remove_file(d.join("sub").join("x")).unwrap();
    fs::remove_dir(d.join("sub")).unwrap();
    assert!(!src.join("many/sub").exists());
    assert_eq!(listing(&d).len(), model.len());
}

#[test]
fn uring_transport_passes_fio_verify_and_requests_take_the_ring() {
    let _p = uring_param(true);
    require_tool("fio");
    let (_tmp, src, mnt) = mount_layout();
    let (m, addr) = start(&src, &mnt, "uring");
    assert!(m.lines[0].contains("transport uring"), "{:?}", m.lines);
    // Two 16 MiB files, checked in the source directory too.
    workloads::fio_verify(&m.mnt, 16, Some(&src));
    let (ring, dev) = (arrived(&addr, "ring"), arrived(&addr, "dev"));
    // 2 x 4096 writes and the reads that verify them came through the
    // ring; /dev/fuse saw INIT and FORGETs at most.
    assert!(ring > 8192, "ring {ring}, dev {dev}");
    assert!(dev < ring / 10, "ring {ring}, dev {dev}");
}

#[test]
fn uring_transport_creates_renames_unlinks_and_lists_many_files() {
    let _p = uring_param(true);
    let (_tmp, src, mnt) = mount_layout();
    let (m, addr) = start(&src, &mnt, "uring");
    many_files(&m.mnt, &src);
    let ring = arrived(&addr, "ring");
    assert!(ring > 3000, "ring {ring}");
}

#[test]
fn devfuse_read_write_transport_serves_the_same_workload_without_the_ring() {
    let _p = uring_param(true);
    let (_tmp, src, mnt) = mount_layout();
    let (m, addr) = start(&src, &mnt, "devfuse");
    assert!(m.lines[0].contains("transport devfuse"), "{:?}", m.lines);
    many_files(&m.mnt, &src);
    assert_eq!(arrived(&addr, "ring"), 0);
    assert!(arrived(&addr, "dev") > 3000);
}

#[test]
fn uring_falls_back_to_read_write_when_the_kernel_does_not_offer_it() {
    let _p = uring_param(false);
    let (_tmp, src, mnt) = mount_layout();
    let (m, addr) = start(&src, &mnt, "uring");
    assert!(m.lines[0].contains("transport devfuse"), "{:?}", m.lines);
    fs::write(m.mnt.join("a"), b"hello").unwrap();
    assert_eq!(fs::read(src.join("a")).unwrap(), b"hello");
    assert_eq!(arrived(&addr, "ring"), 0);
    assert!(arrived(&addr, "dev") >= 3);
}

#[test]
fn bad_transport_flags_fail_clearly() {
    let (_tmp, src, mnt) = mount_layout();
    fs::create_dir_all(&mnt).unwrap();
    let backend = format!("mirror:{}", src.display());
    for (args, want) in [
        (
            &["--transport", "uring", "--ring-depth", "0"][..],
            "--ring-depth 0",
        ),
        (
            &["--transport", "uring", "--ring-spin-us", "99999"][..],
            "--ring-spin-us",
        ),
        (
            &["--transport", "devfuse", "--passthrough"][..],
            "--passthrough",
        ),
        (&["--transport", "carrier-pigeon"][..], "carrier-pigeon"),
    ] {
        let out = run_fail(
            std::process::Command::new(iolift_bin())
                .args(["fs", "mount", &backend])
                .arg(&mnt)
                .args(args),
        );
        assert!(out.all().contains(want), "{args:?}: {}", out.report());
    }
}
