//! Online snapshot revert through the control socket (`iolift qcow2
//! control SOCKET snapshot revert NAME`) on a server with engine=uring
//! whose caches hold the mappings the revert replaces: fio keeps reading
//! from two connections during the revert; afterwards reads through the
//! same caches return the snapshot's bytes (a stale cached mapping would
//! return the bytes written after the snapshot), writes go on, and
//! `qemu-img check` finds the image clean.

mod common;
use common::*;
use std::path::Path;

fn control(sock: &Path, words: &[&str]) -> String {
    run_ok(
        std::process::Command::new(iolift_bin())
            .args(["qcow2", "control"])
            .arg(sock)
            .args(words),
    )
    .stdout
}

/// qemu-io commands over `target` (`-f FMT`); fails on any failed
/// command or pattern mismatch.
fn qemu_io(fmt: &str, target: &str, cmds: &[&str]) {
    let mut c = cmd("qemu-io");
    c.args(["-f", fmt]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let o = run_ok(c.arg(target));
    assert!(
        !o.all().contains("Pattern verification failed") && !o.all().contains("failed:"),
        "qemu-io {cmds:?} on {target}\n{}",
        o.report()
    );
}

#[test]
fn online_revert_drops_cached_mappings_while_clients_read() {
    let _g = heavy();
    require_tool("fio");
    let mut b = ServerBuilder::iolift();
    let img = b.dir().join("r.qcow2");
    let path = img.display().to_string();
    run_ok(cmd("qemu-img").args(["create", "-q", "-f", "qcow2", &path, "16M"]));
    qemu_io("qcow2", &path, &["write -P 0x11 0 16M"]);
    let sock = b.dir().join("ctl.sock");
    let mut srv = b
        .backend(&format!(
            "qcow2:{path},direct,engine=uring,cache=4096,paths=2,placement=conn,control={}",
            sock.display()
        ))
        .start();
    let uri = srv.uri();
    control(&sock, &["snapshot", "create", "a"]);
    // copy-on-write of the first half, then read twice: the new mappings
    // are in the caches, the second read served by hits
    qemu_io(
        "raw",
        &uri,
        &[
            "write -P 0x22 0 8M",
            "read -P 0x22 0 8M",
            "read -P 0x22 0 8M",
        ],
    );
    let reader = {
        let uri = uri.clone();
        std::thread::spawn(move || {
            run_ok(cmd("fio").args([
                "--name=during",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randread",
                "--bs=4k",
                "--iodepth=8",
                "--numjobs=2",
                "--size=16M",
                "--time_based",
                "--runtime=3",
                "--group_reporting",
            ]))
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(1000));
    control(&sock, &["snapshot", "revert", "a"]);
    let o = reader.join().unwrap();
    let all = o.all();
    assert!(
        all.matches("err=").count() > 0
            && all.matches("err=").count() == all.matches("err= 0").count(),
        "fio reported errors during the revert:\n{all}"
    );
    // the snapshot's bytes, through the caches that held the 0x22 mappings
    qemu_io("raw", &uri, &["read -P 0x11 0 16M", "read -P 0x11 0 16M"]);
    // writes after the revert; the snapshot keeps its bytes
    qemu_io(
        "raw",
        &uri,
        &[
            "write -P 0x33 4M 1M",
            "read -P 0x33 4M 1M",
            "read -P 0x11 0 4M",
        ],
    );
    let stats = control(&sock, &["stats"]);
    let ops: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("uring_ops "))
        .unwrap_or_else(|| panic!("uring_ops missing:\n{stats}"))
        .parse()
        .unwrap();
    assert!(ops > 0, "no request took the io_uring path:\n{stats}");
    let bad = run_fail(
        std::process::Command::new(iolift_bin())
            .args(["qcow2", "control"])
            .arg(&sock)
            .args(["snapshot", "revert", "nope"]),
    );
    assert!(bad.all().contains("no snapshot named"), "{}", bad.report());
    assert!(srv.stop().success(), "{}", srv.stderr());
    let o = run_timeout(cmd("qemu-img").args(["check", &path]), CMD_TIMEOUT);
    assert!(
        o.status.code() == Some(0) && !o.all().contains("leaked"),
        "qemu-img check is not clean\n{}",
        o.report()
    );
    qemu_io(
        "qcow2",
        &path,
        &[
            "read -P 0x11 0 4M",
            "read -P 0x33 4M 1M",
            "read -P 0x11 5M 11M",
        ],
    );
    // the snapshot itself still reads as it was
    let snap = srv.dir().join("snap.raw");
    run_ok(cmd("qemu-img").args([
        "convert",
        "-l",
        "snapshot.name=a",
        "-O",
        "raw",
        &path,
        &snap.display().to_string(),
    ]));
    let bytes = std::fs::read(&snap).unwrap();
    assert!(
        bytes.len() == 16 << 20 && bytes.iter().all(|&x| x == 0x11),
        "snapshot a changed"
    );
}
