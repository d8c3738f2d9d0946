//! `iolift serve qcow2:PATH` against real peers: images qemu-img created,
//! written over NBD by qemu-io, nbdcopy and fio (verify, with a mapping
//! cache so small it thrashes), then `qemu-img check` (must be clean),
//! `qemu-img info` and `qemu-img compare`; images qemu wrote (backing
//! file, compressed clusters, zero clusters, version 2) read over NBD and
//! compared with qemu-img's reading.

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn qimg_create(dir: &Path, name: &str, size: &str, opts: &str) -> PathBuf {
    let p = dir.join(name);
    let mut c = cmd("qemu-img");
    c.args(["create", "-q", "-f", "qcow2"]);
    if !opts.is_empty() {
        c.args(["-o", opts]);
    }
    run_ok(c.arg(&p).arg(size));
    p
}

fn assert_clean(img: &Path) {
    let o = run_timeout(cmd("qemu-img").arg("check").arg(img), CMD_TIMEOUT);
    assert!(
        o.status.code() == Some(0) && !o.all().contains("leaked"),
        "qemu-img check is not clean\n{}",
        o.report()
    );
}

fn serve(b: ServerBuilder, img: &Path, opts: &str) -> Server {
    b.backend(&format!("qcow2:{}{opts}", img.display())).start()
}

#[test]
fn qemu_io_and_nbdcopy_write_then_qemu_img_checks() {
    let mut b = ServerBuilder::iolift();
    let img = qimg_create(b.dir(), "t.qcow2", "64M", "");
    let src = b.dir().join("src.raw");
    write_random_file(&src, 24 << 20, 5);
    let mut srv = serve(b, &img, ",cache=4,paths=2");
    let uri = srv.uri();
    run_ok(cmd("nbdcopy").arg(&src).arg(&uri));
    run_ok(cmd("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 30M 1M",
        "-c",
        "write -z 31M 512k",
        "-c",
        "discard 40M 4M",
        "-c",
        "read -P 0x5a 30M 1M",
        "-c",
        "read -P 0 31M 512k",
        &uri,
    ]));
    assert!(srv.stop().success(), "{}", srv.stderr());
    assert_clean(&img);
    let o = run_ok(cmd("qemu-img").args(["info", "--output=json"]).arg(&img));
    assert!(
        o.stdout.contains("\"virtual-size\": 67108864"),
        "{}",
        o.stdout
    );
    // the first 24 MiB are the source file's
    let raw = srv.dir().join("out.raw");
    run_ok(
        cmd("qemu-img")
            .args(["convert", "-O", "raw"])
            .arg(&img)
            .arg(&raw),
    );
    let got = std::fs::read(&raw).unwrap();
    let want = std::fs::read(&src).unwrap();
    assert!(
        got[..want.len()] == want[..],
        "the image differs from what nbdcopy wrote"
    );
    assert!(got[30 << 20..31 << 20].iter().all(|&x| x == 0x5a));
    assert!(got[31 << 20..(31 << 20) + (512 << 10)]
        .iter()
        .all(|&x| x == 0));
    // qemu-io reads the image directly too
    run_ok(
        cmd("qemu-io")
            .args(["-f", "qcow2", "-c", "read -P 0x5a 30M 1M"])
            .arg(&img),
    );
}

#[test]
fn fio_verify_with_a_thrashing_cache_then_check() {
    let _g = heavy();
    require_tool("fio");
    let mut b = ServerBuilder::iolift();
    let img = qimg_create(b.dir(), "f.qcow2", "64M", "cluster_size=4096");
    let mut srv = serve(b, &img, ",cache=2,paths=4");
    fio_randwrite_verify(&srv.uri(), 16, 2, "8M", "24M");
    assert!(srv.stop().success(), "{}", srv.stderr());
    assert_clean(&img);
    // served again, qemu-img compare over NBD sees what qemu-img reads
    let b = ServerBuilder::iolift();
    let srv = serve(b, &img, ",cache=1,ro");
    let raw = srv.dir().join("f.raw");
    run_ok(
        cmd("qemu-img")
            .args(["convert", "-O", "raw"])
            .arg(&img)
            .arg(&raw),
    );
    assert!(qemu_img_compare(srv.uri(), &raw));
}

#[test]
fn images_qemu_wrote_read_over_nbd() {
    let mut b = ServerBuilder::iolift();
    let d = b.dir().to_path_buf();
    let base = d.join("base.raw");
    write_random_file(&base, 8 << 20, 9);
    run_ok(
        cmd("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&base)
            .arg(d.join("over.qcow2"))
            .arg("16M"),
    );
    let over = d.join("over.qcow2");
    run_ok(
        cmd("qemu-io")
            .args([
                "-f",
                "qcow2",
                "-c",
                "write -P 0x42 1M 100k",
                "-c",
                "write -z 3M 1M",
            ])
            .arg(&over),
    );
    let comp = d.join("comp.qcow2");
    run_ok(
        cmd("qemu-img")
            .args(["convert", "-c", "-O", "qcow2"])
            .arg(&over)
            .arg(&comp),
    );
    let v2 = qimg_create(&d, "v2.qcow2", "16M", "compat=0.10");
    run_ok(
        cmd("qemu-io")
            .args([
                "-f",
                "qcow2",
                "-c",
                "write -P 0x17 0 5M",
                "-c",
                "write -z 1M 64k",
            ])
            .arg(&v2),
    );
    for img in [&over, &comp, &v2] {
        let srv = serve(ServerBuilder::iolift(), img, ",cache=3,ro");
        let raw = d.join("want.raw");
        run_ok(
            cmd("qemu-img")
                .args(["convert", "-O", "raw"])
                .arg(img)
                .arg(&raw),
        );
        assert!(
            qemu_img_compare(srv.uri(), &raw),
            "{} differs over NBD",
            img.display()
        );
    }
}

#[test]
fn bad_images_fail_at_start_with_the_reason() {
    let mut b = ServerBuilder::iolift();
    let img = qimg_create(b.dir(), "bad.qcow2", "4M", "");
    // an unknown incompatible feature bit (bit 20)
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&(1u64 << 20).to_be_bytes(), 72).unwrap();
    }
    let o = run_fail(cmd_iolift().args(["serve", &format!("qcow2:{}", img.display())]));
    assert!(
        o.all().contains("incompatible feature bit 20"),
        "{}",
        o.report()
    );
    let o = run_fail(cmd_iolift().args(["serve", &format!("qcow2:{},paths=65", img.display())]));
    assert!(o.all().contains("paths"), "{}", o.report());
}

fn cmd_iolift() -> std::process::Command {
    std::process::Command::new(iolift_bin())
}

#[test]
fn snapshot_cli_then_served_writes_keep_the_snapshot() {
    let mut b = ServerBuilder::iolift();
    let img = qimg_create(b.dir(), "s.qcow2", "8M", "");
    run_ok(
        cmd("qemu-io")
            .args(["-f", "qcow2", "-c", "write -P 0x21 0 3M"])
            .arg(&img),
    );
    let path = img.display().to_string();
    run_ok(cmd_iolift().args(["qcow2", "snapshot", "create", &path, "before"]));
    let o = run_ok(cmd_iolift().args(["qcow2", "snapshot", "list", &path]));
    assert!(o.stdout.contains("before"), "{}", o.stdout);
    let o = run_fail(cmd_iolift().args(["qcow2", "snapshot", "create", &path, "before"]));
    assert!(o.all().contains("exists"), "{}", o.report());
    assert_clean(&img);
    // served and written: copy-on-write keeps the snapshot's bytes
    let mut srv = serve(b, &img, ",cache=2");
    run_ok(cmd("qemu-io").args(["-f", "raw", "-c", "write -P 0x22 1M 2M", &srv.uri()]));
    assert!(srv.stop().success(), "{}", srv.stderr());
    assert_clean(&img);
    let snap = srv.dir().join("snap.raw");
    run_ok(
        cmd("qemu-img")
            .args(["convert", "-O", "raw", "-l", "snapshot.name=before"])
            .arg(&img)
            .arg(&snap),
    );
    let s = std::fs::read(&snap).unwrap();
    assert!(
        s[..3 << 20].iter().all(|&x| x == 0x21),
        "the snapshot changed"
    );
    run_ok(
        cmd("qemu-io")
            .args([
                "-f",
                "qcow2",
                "-c",
                "read -P 0x22 1M 2M",
                "-c",
                "read -P 0x21 0 1M",
            ])
            .arg(&img),
    );
    // back to the snapshot: the served writes are gone, qemu-io agrees
    run_ok(cmd_iolift().args(["qcow2", "snapshot", "apply", &path, "before"]));
    assert_clean(&img);
    run_ok(
        cmd("qemu-io")
            .args(["-f", "qcow2", "-c", "read -P 0x21 0 3M"])
            .arg(&img),
    );
    let o = run_fail(cmd_iolift().args(["qcow2", "snapshot", "revert", &path, "nope"]));
    assert!(o.all().contains("no snapshot named"), "{}", o.report());
    run_ok(cmd_iolift().args(["qcow2", "snapshot", "delete", &path, "before"]));
    let o = run_ok(cmd("qemu-img").args(["snapshot", "-l"]).arg(&img));
    assert!(!o.stdout.contains("before"), "{}", o.stdout);
    assert_clean(&img);
}
