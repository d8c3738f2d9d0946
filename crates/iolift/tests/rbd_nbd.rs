//! An RBD image served by `iolift serve rbd:POOL/IMAGE,conf=...` on a real
//! local Ceph cluster (scripts/ceph-local.sh), checked with real NBD clients
//! (qemu-img, nbdcopy, fio) against Ceph's own view of the image (`rbd
//! export`, qemu's rbd driver), including while an OSD is killed (that
//! test starts a cluster of its own; the other uses a pool of its own on
//! the suite's shared cluster, iolift_testkit::ceph).

mod common;
mod rbd_util;

use common::*;
use rbd_util::Cluster;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn fio_verify(uri: &str, size: &str, bs: &str, rw: &str, iodepth: u32) -> Command {
    let mut c = cmd("fio");
    c.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        &format!("--rw={rw}"),
        &format!("--bs={bs}"),
        &format!("--size={size}"),
        &format!("--iodepth={iodepth}"),
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--do_verify=1",
        "--randrepeat=0",
    ]);
    c
}

#[test]
fn rbd_served_over_nbd() {
    for t in ["qemu-img", "nbdcopy", "fio", "nbdinfo"] {
        require_tool(t);
    }
    let cl = Cluster::shared("rbd", 3, Some("128M"));
    let _g = heavy();
    let srv = ServerBuilder::iolift().backend(&cl.spec()).start();
    let uri = srv.uri();
    let work = tempfile::tempdir().unwrap();
    let w = |n: &str| work.path().join(n).to_str().unwrap().to_string();

    // The export's size is the image's.
    let o = run_ok(cmd("nbdinfo").args(["--size", &uri]));
    assert_eq!(o.stdout.trim(), (128 * MIB).to_string(), "nbdinfo --size");

    // qemu-img convert a 24 MiB file (random data plus a zero hole) onto the
    // image, then compare through NBD and through qemu's own rbd driver.
    let mut data = random_bytes(24 * MIB, 6);
    data[8 * MIB..10 * MIB].fill(0);
    std::fs::write(w("src.raw"), &data).unwrap();
    qemu_img_convert(w("src.raw"), &uri);
    assert!(qemu_img_compare(w("src.raw"), &uri), "NBD export != source");
    let qemu_rbd = format!("rbd:{}/{}:conf={}", cl.pool, cl.image, cl.conf.display());
    assert!(
        qemu_img_compare(&uri, &qemu_rbd),
        "NBD export != qemu's rbd view"
    );

    // fio writes with checksums through iolift and verifies them by reading back.
    run_ok(fio_verify(&uri, "16M", "4k", "randwrite", 16).arg("--offset=32M"));
    run_ok(fio_verify(&uri, "24M", "128k", "write", 8).arg("--offset=64M"));

    // nbdcopy the whole export out; it must equal `rbd export` byte for byte.
    run_ok(cmd("nbdcopy").args([&uri, &w("nbdcopy.raw")]));
    cl.export(std::path::Path::new(&w("export.raw")));
    assert_eq!(
        sha256_file(std::path::Path::new(&w("nbdcopy.raw"))),
        sha256_file(std::path::Path::new(&w("export.raw"))),
        "nbdcopy through iolift and rbd export differ"
    );
    let copied = std::fs::read(w("nbdcopy.raw")).unwrap();
    assert!(
        copied[..24 * MIB] == data[..],
        "the qemu-img converted data did not survive"
    );

    // nbdcopy back in (a second writer path), compared with qemu's rbd driver.
    let back = random_bytes(4 * MIB, 9);
    std::fs::write(w("back.raw"), &back).unwrap();
    qemu_img_convert(w("back.raw"), &uri);
    run_ok(cmd("nbdcopy").args([&w("back.raw"), &uri]));
    assert!(
        qemu_img_compare(&uri, &qemu_rbd),
        "NBD export != qemu's rbd view"
    );
    drop(srv);
}

#[test]
fn rbd_osd_killed_during_fio_verify() {
    require_tool("fio");
    // A cluster of its own: it kills an OSD.
    let cl = Cluster::start("128M", &[]);
    let _g = heavy();
    let srv = ServerBuilder::iolift().backend(&cl.spec()).start();
    let uri = srv.uri();
    // Sequential 4k writes with checksums, then a read-back verify pass; an
    // OSD is SIGKILLed while the writes are in flight. Pool size 3, min_size
    // 2: I/O must carry on and every block must verify.
    let mut c = fio_verify(&uri, "48M", "4k", "write", 8);
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("fio.out");
    c.arg(format!("--output={}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut fio = c.spawn().expect("start fio");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio finished before the OSD was killed: make the run longer"
    );
    let pid = cl.kill_osd(1);
    let killed_at = Instant::now();
    assert!(pid > 0);
    let deadline = killed_at + Duration::from_secs(150);
    let st = loop {
        if let Some(st) = fio.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = fio.kill();
            panic!(
                "fio did not finish within 150 s of killing osd.1:\n{}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                cl.status()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        st.success(),
        "fio verify failed after osd.1 was killed ({st}):\n{out}\n{}",
        cl.status()
    );
    assert!(
        !out.contains("verify: bad"),
        "fio found corrupt blocks:\n{out}"
    );
    // The cluster noticed: osd.1 is down, the other two carry the data.
    let s = cl.status();
    assert!(
        s.contains("2 up"),
        "expected 2 of 3 OSDs up after the kill:\n{s}"
    );
    // Still serving: a fresh verify pass after the failure.
    run_ok(fio_verify(&uri, "8M", "64k", "randwrite", 4).arg("--offset=64M"));
    drop(srv);
}
