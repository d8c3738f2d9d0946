//! `iolift serve --fuse`: the same export seen as a FUSE file and over NBD
//! (nbdcopy, nbdinfo --map). Needs root (FUSE mount); CI runs as root.

mod common;
use common::*;

use std::fs;
use std::process::Command;

/// Unmounts a FUSE dir on drop if the server left it behind.
struct MountGuard(std::path::PathBuf);
impl Drop for MountGuard {
    fn drop(&mut self) {
        umount_lazy(&self.0);
    }
}

fn dd(args: &[String]) {
    let mut c = cmd("dd");
    c.args(args).arg("status=none");
    run_ok(&mut c);
}

/// Bytes `nbdinfo --map --totals` reports as data (type 0).
fn data_bytes(uri: &str) -> u64 {
    let map = run_ok(cmd("nbdinfo").args(["--map", "--totals"]).arg(uri));
    // "<bytes> <pct> <type> <description>" per line.
    map.stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"0")).then(|| f[0].parse::<u64>().unwrap_or(0))
        })
        .sum()
}

#[test]
fn fuse_serve_file_and_nbd_see_the_same_bytes() {
    require_root("the FUSE tests need root (mount(2))");
    let _h = heavy();
    let tmp = tempfile::tempdir().unwrap();
    let fdir = tmp.path().join("fuse");
    let file = fdir.join("disk.img");
    let named = tmp.path().join("fuse2").join("b.img");
    let _g1 = MountGuard(fdir.clone());
    let _g2 = MountGuard(named.parent().unwrap().to_path_buf());
    let mut srv = ServerBuilder::iolift()
        .backend("memory:64M")
        .args(["--export", "b=memory:8M", "--fuse"])
        .arg(&file)
        .arg("--fuse")
        .arg(format!("b={}", named.display()))
        .start();
    assert_eq!(fs::metadata(&file).unwrap().len(), 64 << 20);
    assert_eq!(fs::metadata(&named).unwrap().len(), 8 << 20);

    // FUSE write -> NBD read.
    let src = tmp.path().join("src");
    write_random_file(&src, 4 << 20, 5);
    dd(&[
        format!("if={}", src.display()),
        format!("of={}", file.display()),
        "bs=1M".into(),
        "seek=8".into(),
        "oflag=direct".into(),
        "conv=notrunc,fsync".into(),
    ]);
    let whole = tmp.path().join("whole");
    run_ok(cmd("nbdcopy").arg(srv.uri()).arg(&whole));
    let w = fs::read(&whole).unwrap();
    assert!(w[8 << 20..12 << 20] == fs::read(&src).unwrap()[..]);

    // NBD write -> FUSE read (direct I/O: no stale page cache).
    let src2 = tmp.path().join("src2");
    write_random_file(&src2, 8 << 20, 6);
    run_ok(cmd("nbdcopy").arg(&src2).arg(srv.uri_named("b")));
    let back = tmp.path().join("back");
    dd(&[
        format!("if={}", named.display()),
        format!("of={}", back.display()),
        "bs=1M".into(),
        "iflag=direct".into(),
    ]);
    assert_eq!(sha256_file(&back), sha256_file(&src2));

    // Punch a hole through the FUSE file: TRIM reaches the backend, which
    // nbdinfo --map reports as a hole.
    assert!(
        data_bytes(&srv.uri()) >= 4 << 20,
        "written data not mapped as data"
    );
    run_ok(
        cmd("fallocate")
            .args(["-p", "-o", "8M", "-l", "4M"])
            .arg(&file),
    );
    let left = data_bytes(&srv.uri());
    assert_eq!(left, 0, "data left after punching all written data");

    // SIGTERM: the server unmounts its FUSE files and exits cleanly.
    let st = srv.stop();
    assert!(st.success(), "server exit {st}\n{}", srv.stderr());
    assert!(
        !is_mounted(&fdir),
        "FUSE mount left after the server stopped"
    );
}

#[test]
fn fuse_serve_bad_spec_is_a_clear_error() {
    require_root("the FUSE tests need root (mount(2))");
    let tmp = tempfile::tempdir().unwrap();
    let o = run_fail(
        Command::new(iolift_bin())
            .arg("serve")
            .arg("--socket")
            .arg(tmp.path().join("s.sock"))
            .args(["--export", "a=memory:1M", "--export", "b=memory:1M"])
            .arg("--fuse")
            .arg(tmp.path().join("m/x.img")),
    );
    assert!(o.stderr.contains("NAME=FILE"), "{}", o.all());
    assert!(!is_mounted(&tmp.path().join("m")));
}
