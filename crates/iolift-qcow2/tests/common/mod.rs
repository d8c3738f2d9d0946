//! Helpers shared by the qcow2 tests: qemu-img as the peer that creates,
//! checks and converts images.
#![allow(dead_code)]

use iolift_qcow2::{ControlPlane, DataPath, Options};
use iolift_testkit::process::{cmd, run_ok, run_timeout, CMD_TIMEOUT};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `qemu-img create -f qcow2 [-o OPTS] PATH SIZE`.
pub fn create(dir: &Path, name: &str, size: &str, opts: &str) -> PathBuf {
    let p = dir.join(name);
    let mut c = cmd("qemu-img");
    c.args(["create", "-q", "-f", "qcow2"]);
    if !opts.is_empty() {
        c.args(["-o", opts]);
    }
    run_ok(c.arg(&p).arg(size));
    p
}

/// qemu-img check must exit 0 (no corruption, no leak).
pub fn assert_clean(p: &Path) {
    let o = run_timeout(cmd("qemu-img").arg("check").arg(p), CMD_TIMEOUT);
    assert!(
        o.status.code() == Some(0) && !o.all().contains("leaked"),
        "qemu-img check {} is not clean\n{}",
        p.display(),
        o.report()
    );
}

/// The image's guest bytes as qemu-img reads them.
pub fn qemu_raw(img: &Path) -> Vec<u8> {
    let raw = img.with_extension("qemu.raw");
    run_ok(
        cmd("qemu-img")
            .args(["convert", "-O", "raw"])
            .arg(img)
            .arg(&raw),
    );
    let v = std::fs::read(&raw).unwrap();
    std::fs::remove_file(&raw).unwrap();
    v
}

/// `qemu-io -f qcow2 -c CMD... PATH`.
pub fn qemu_io(img: &Path, cmds: &[&str]) {
    let mut c = cmd("qemu-io");
    c.args(["-f", "qcow2"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let o = run_ok(c.arg(img));
    assert!(!o.all().contains("error"), "qemu-io: {}", o.report());
}

pub fn open(p: &Path, cache: u64, paths: usize, ro: bool) -> Arc<ControlPlane> {
    let opts = Options {
        read_only: ro,
        cache_entries: cache,
        data_paths: paths,
        direct: false,
    };
    ControlPlane::open(p, &opts).unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
}

/// Every guest byte as iolift reads it, through data path 0.
pub fn iolift_raw(cp: &Arc<ControlPlane>) -> Vec<u8> {
    let dp = DataPath::new(cp.clone(), 0);
    let mut v = vec![0u8; cp.size() as usize];
    for (i, chunk) in v.chunks_mut(1 << 20).enumerate() {
        dp.read((i as u64) << 20, chunk).unwrap();
    }
    v
}

/// Overwrites bytes of a file (to corrupt an image on purpose).
pub fn poke(p: &Path, off: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

pub fn peek_u64(p: &Path, off: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(p).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, off).unwrap();
    u64::from_be_bytes(b)
}

/// Where index-equal bytes first differ, for messages.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}
