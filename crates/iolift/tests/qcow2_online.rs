//! Online control of a served qcow2 image (`qcow2:...,control=SOCKET`):
//! fio writes and verifies over NBD while `iolift qcow2 control` takes
//! and deletes snapshots, discards ranges, resizes the caches and
//! compacts the image, with mapping caches of 2 entries so they thrash.
//! Afterwards: zero verify errors, `qemu-img check` clean, the bytes
//! qemu-io reads are the expected ones, and the file shrank. Run twice:
//! with the blocking-pool data paths, and with `engine=uring` (hits read
//! and written through io_uring, their mappings pinned until the
//! completion; data paths per connection) and caches that alternate
//! between a quarter of and all the clusters one fio job touches, so
//! many requests hit while the control plane invalidates under them.
//! And a third time at queue depth 1 with the default engine of `direct`
//! (uring): there requests alone on their data path run on the reader's
//! thread (hits and misses with a blocking pread / pwrite there), which
//! the stats must show; and a fourth time so with `spin_us`, where they
//! go through the path's inline ring instead.

mod common;
use common::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

fn assert_clean(img: &Path) {
    let o = run_timeout(cmd("qemu-img").arg("check").arg(img), CMD_TIMEOUT);
    assert!(
        o.status.code() == Some(0) && !o.all().contains("leaked"),
        "qemu-img check is not clean\n{}",
        o.report()
    );
}

fn control(sock: &Path, words: &[&str]) -> String {
    let o = run_ok(
        std::process::Command::new(iolift_bin())
            .args(["qcow2", "control"])
            .arg(sock)
            .args(words),
    );
    o.stdout
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn fio_verify_while_snapshots_discards_and_compaction_run() {
    online("cache=2,paths=4", ["1", "2"], &[], 0, ("8M", "3", "16"));
}

#[test]
fn fio_verify_on_the_uring_path_while_the_control_plane_changes_mappings() {
    online(
        "cache=4096,paths=4,direct,engine=uring,placement=conn",
        ["1024", "4096"],
        &[("uring_ops", 1000)],
        1000,
        ("2M", "10", "16"),
    );
}

#[test]
fn fio_verify_at_depth_1_on_the_inline_ring_while_mappings_change() {
    online(
        "cache=4096,paths=4,direct",
        ["1024", "4096"],
        // misses alone on their path: translated on the reader's thread,
        // then read or written there like hits, with a blocking pread /
        // pwrite (spin_us=0, the default) while the mapping is pinned
        // (at least 300 of the ~10,000 requests of the two depth-1 jobs:
        // how many find their path idle depends on how the jobs
        // interleave, which moves with the machine's load: 666 to 4921
        // seen)
        &[
            ("uring_inline_hits", 300),
            ("uring_inline_misses", 50),
            ("uring_inline_sync", 300),
        ],
        1000,
        ("256K", "40", "1"),
    );
}

#[test]
fn fio_verify_at_depth_1_on_the_spinning_inline_ring_while_mappings_change() {
    online(
        "cache=4096,paths=4,direct,spin_us=20",
        ["1024", "4096"],
        // with spin_us the lone hits and misses go through the inline
        // ring (counted in uring_ops) instead of pread / pwrite
        &[
            ("uring_inline_hits", 300),
            ("uring_inline_misses", 50),
            ("uring_ops", 300),
        ],
        1000,
        ("256K", "40", "1"),
    );
}

/// The scenario above on a server with backend options `opts`; the
/// control loop alternates the caches between the budgets `sizes`.
/// `uring`: counters of the stats (the io_uring engines') that must
/// pass a minimum each. `pause_ms`: between control rounds (each snapshot and
/// compaction invalidates cached mappings; a pause lets hits happen in
/// between). `fio`: each job's region size, the number of write+verify
/// loops and the queue depth.
fn online(
    opts: &str,
    sizes: [&'static str; 2],
    uring: &[(&str, u64)],
    pause_ms: u64,
    fio: (&str, &str, &str),
) {
    let _g = heavy();
    require_tool("fio");
    let mut b = ServerBuilder::iolift();
    let img = b.dir().join("o.qcow2");
    run_ok(
        cmd("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-o", "cluster_size=4096"])
            .arg(&img)
            .arg("64M"),
    );
    // 40M..64M first (low in the file), then 0..32M (high in the file):
    // discarding the first leaves holes that compaction fills with the
    // clusters fio is writing and verifying
    run_ok(
        cmd("qemu-io")
            .args(["-f", "qcow2", "-c", "write -P 0x77 40M 24M"])
            .arg(&img),
    );
    run_ok(
        cmd("qemu-io")
            .args(["-f", "qcow2", "-c", "write -P 0x11 0 32M"])
            .arg(&img),
    );
    let full = file_len(&img);
    // a file that is not a socket is never replaced
    let not_sock = b.dir().join("not.sock");
    std::fs::write(&not_sock, b"keep").unwrap();
    let o = run_fail(std::process::Command::new(iolift_bin()).args([
        "serve",
        "--socket",
        &b.dir().join("x.sock").display().to_string(),
        &format!("qcow2:{},control={}", img.display(), not_sock.display()),
    ]));
    assert!(o.all().contains("not a socket"), "{}", o.report());
    assert_eq!(std::fs::read(&not_sock).unwrap(), b"keep");
    let sock = b.dir().join("ctl.sock");
    let mut srv = b
        .backend(&format!(
            "qcow2:{},{opts},control={}",
            img.display(),
            sock.display()
        ))
        .start();
    let uri = srv.uri();
    let done = Arc::new(AtomicBool::new(false));
    let ctl = {
        let (sock, done) = (sock.clone(), done.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            let mut compacted = 0;
            while !done.load(SeqCst) || i < 4 {
                control(&sock, &["snapshot", "create", &format!("s{i}")]);
                if i < 24 {
                    let off = (40 + i) << 20;
                    control(&sock, &["discard", &off.to_string(), "1048576"]);
                }
                control(&sock, &["cache", sizes[(i % 2) as usize]]);
                let out = control(&sock, &["compact"]);
                assert!(out.contains("moved data="), "{out}");
                control(&sock, &["snapshot", "delete", &format!("s{i}")]);
                std::thread::sleep(std::time::Duration::from_millis(pause_ms));
                let out = control(&sock, &["compact"]);
                if !out.contains("moved data=0 ") {
                    compacted += 1;
                }
                i += 1;
            }
            for j in i.min(24)..24 {
                let off = (40 + j) << 20;
                control(&sock, &["discard", &off.to_string(), "1048576"]);
            }
            (i, compacted)
        })
    };
    let o = run_ok(cmd("fio").args([
        "--name=online",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        &format!("--iodepth={}", fio.2),
        "--numjobs=2",
        &format!("--size={}", fio.0),
        "--offset_increment=24M",
        &format!("--loops={}", fio.1),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]));
    done.store(true, SeqCst);
    let (rounds, compacted) = ctl.join().unwrap();
    let all = o.all();
    assert!(!all.contains("verify: bad"), "{all}");
    assert!(
        all.matches("err=").count() > 0
            && all.matches("err=").count() == all.matches("err= 0").count(),
        "fio reported errors:\n{all}"
    );
    assert!(all.contains("read: IOPS="), "no verify read phase:\n{all}");
    assert!(
        compacted > 0,
        "no compaction moved anything in {rounds} rounds"
    );
    // a final compaction with every hole there, then the stats
    let out = control(&sock, &["compact"]);
    eprintln!("{rounds} rounds, {compacted} moved clusters; last: {out}");
    let stats = control(&sock, &["stats"]);
    for k in [
        "cache_hits ",
        "cache_invalidations ",
        "compaction_moved ",
        "latency_hit count=",
    ] {
        assert!(stats.contains(k), "{k} missing:\n{stats}");
    }
    for &(key, min) in uring {
        let ops: u64 = stats
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{key} missing:\n{stats}"))
            .parse()
            .unwrap();
        eprintln!("{key} {ops}");
        assert!(ops > min, "few requests took the io_uring path:\n{stats}");
    }
    let bad = run_fail(
        std::process::Command::new(iolift_bin())
            .args(["qcow2", "control"])
            .arg(&sock)
            .args(["discard", "0", "999999999999"]),
    );
    assert!(bad.all().contains("past the end"), "{}", bad.report());
    control(&sock, &["snapshot", "create", "keep"]);
    assert!(srv.stop().success(), "{}", srv.stderr());
    assert!(!sock.exists(), "the control socket was left behind");
    assert_clean(&img);
    let after = file_len(&img);
    assert!(
        after < full * 3 / 4,
        "the file did not shrink: {full} bytes before, {after} after"
    );
    let list = run_ok(cmd("qemu-img").args(["snapshot", "-l"]).arg(&img)).stdout;
    assert!(list.contains("keep") && !list.contains(" s0 "), "{list}");
    // what fio did not write is as it was; the discarded range is zero
    run_ok(
        cmd("qemu-io")
            .args([
                "-f",
                "qcow2",
                "-c",
                "read -P 0x11 8M 16M",
                "-c",
                "read -P 0 40M 24M",
            ])
            .arg(&img),
    );
}
