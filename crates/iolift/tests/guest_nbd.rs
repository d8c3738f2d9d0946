//! The kernel's own NBD client against iolift: a QEMU guest (Debian 13's
//! 6.12 kernel, scripts/vm/guest.sh) connects /dev/nbd0 and /dev/nbd1 with
//! `nbd-client` to iolift servers on the host (the guest reaches the host's
//! 127.0.0.1 at 10.0.2.2). One boot runs every check in sequence, one step
//! each (see docs/guest.md):
//!
//! - `ext4`: mkfs.ext4, mount, write a large file and many small ones,
//!   sync, unmount, drop caches, remount, compare checksums, `fsck.ext4 -f -n`.
//! - `fstrim`: a file deleted and `fstrim` run; the host checks that the
//!   backing file's allocated blocks shrink (trim reached the file backend
//!   as holes).
//! - `timeout`: the server is paused (SIGSTOP) under `nbd-client -t 5`:
//!   the request fails with EIO instead of hanging; see docs/guest.md.
//! - `restart`: the server stops while the device is connected, then starts
//!   again; the guest records what the driver does (see docs/guest.md) and
//!   reconnects; the data written before the restart reads back.
//! - `fio`: four connections (`nbd-client -C 4`) to a memory export behind
//!   the cache and scheduler stages (the host counts the connections); fio
//!   writes with checksums from four jobs and verifies.

mod common;
use common::*;
use iolift_testkit::guest::{Guest, Running};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What the guest runs after the step prelude (iolift_testkit::guest).
const SCRIPT: &str = r#"
modprobe nbd nbds_max=4
mkdir -p /mnt/t
nbd() { timeout 60 nbd-client 10.0.2.2 "$@"; }

step connect
nbd "$PORT_A" /dev/nbd0 -b 4096
[ "$(blockdev --getsize64 /dev/nbd0)" = $((256 << 20)) ]
echo "discard_max_bytes=$(cat /sys/block/nbd0/queue/discard_max_bytes)"

step ext4
mkfs.ext4 -q -F /dev/nbd0
mount /dev/nbd0 /mnt/t
head -c $((24 << 20)) /dev/urandom > /mnt/t/big
mkdir /mnt/t/small
for i in $(seq 1 300); do echo "small file $i $RANDOM" > /mnt/t/small/f$i; done
(cd /mnt/t && find . -type f | sort | xargs sha256sum) > /tmp/sums
sync
umount /mnt/t
echo 3 > /proc/sys/vm/drop_caches
mount /dev/nbd0 /mnt/t
(cd /mnt/t && sha256sum --quiet -c /tmp/sums)
[ "$(ls /mnt/t/small | wc -l)" = 300 ]
umount /mnt/t
fsck.ext4 -f -n /dev/nbd0

step fstrim
mount /dev/nbd0 /mnt/t
head -c $((64 << 20)) /dev/urandom > /mnt/t/trimmed
sync
host_request alloc-full
rm /mnt/t/trimmed
sync
timeout 120 fstrim -v /mnt/t
sync
host_request alloc-trimmed
umount /mnt/t
fsck.ext4 -f -n /dev/nbd0

step timeout
# A server that keeps the connection but stops answering: with
# `nbd-client -t 5` the driver fails the request with EIO once the timeout
# passes, and the device stays failed after the server answers again.
nbd-client -d /dev/nbd0
nbd "$PORT_A" /dev/nbd0 -b 4096 -t 5
host_request pause-server
t0=$(date +%s)
rc=0; timeout 120 dd if=/dev/nbd0 of=/dev/null bs=4k count=1 skip=2000 iflag=direct status=none || rc=$?
echo "io_while_paused=$rc after $(($(date +%s) - t0)) s"
host_request resume-server
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then echo "I/O to a stalled server did not time out cleanly"; exit 1; fi
rc=0; timeout 60 dd if=/dev/nbd0 of=/dev/null bs=4k count=1 skip=2001 iflag=direct status=none || rc=$?
echo "io_after_resume_same_device=$rc"
nbd-client -d /dev/nbd0
nbd "$PORT_A" /dev/nbd0 -b 4096
fsck.ext4 -f -n /dev/nbd0

step restart
head -c $((1 << 20)) /dev/urandom > /tmp/pattern
dd if=/tmp/pattern of=/dev/nbd0 bs=1M seek=200 oflag=direct status=none
host_request stop-server
# The server is gone: the driver's socket is dead. Direct I/O must fail
# (EIO) rather than hang: the timeout turns a hang into a failure.
rc=0; timeout 60 dd if=/dev/nbd0 of=/dev/null bs=4k count=1 skip=1000 iflag=direct status=none || rc=$?
echo "io_while_down=$rc"
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then echo "I/O to a dead server did not fail cleanly"; exit 1; fi
host_request start-server
rc=0; timeout 60 dd if=/dev/nbd0 of=/dev/null bs=4k count=1 skip=1001 iflag=direct status=none || rc=$?
echo "io_after_restart_same_device=$rc"
dmesg | grep -E 'nbd0: (Receive|Dead|shutting|Connection)' || true
nbd-client -d /dev/nbd0
nbd "$PORT_A" /dev/nbd0 -b 4096
dd if=/dev/nbd0 of=/tmp/back bs=1M skip=200 count=1 iflag=direct status=none
cmp /tmp/pattern /tmp/back
fsck.ext4 -f -n /dev/nbd0
nbd-client -d /dev/nbd0

step fio
nbd "$PORT_B" /dev/nbd1 -b 4096 -C 4
# The driver's hardware queues are capped at the guest's CPUs: the host
# counts the connections instead.
host_request count-connections
timeout 400 fio --name=verify --filename=/dev/nbd1 --direct=1 --ioengine=libaio \
    --rw=randwrite --bsrange=4k-64k --iodepth=8 --numjobs=4 --size=24M \
    --offset_increment=32M --verify=crc32c --verify_fatal=1 --do_verify=1 \
    --randseed=7 --group_reporting --output-format=terse --terse-version=3 > /tmp/fio.out
cut -d';' -f1-10 /tmp/fio.out
nbd-client -d /dev/nbd1
"#;

/// Bytes the file's blocks take on disk.
fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .blocks()
        * 512
}

/// Established TCP connections whose local port is `port` (the server's
/// side of its clients' connections), from /proc/net/tcp and tcp6.
fn established(port: u16) -> usize {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| {
            t.lines()
                .skip(1)
                .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        })
        .filter(|c| c.len() > 3 && c[1].ends_with(&want) && c[3] == "01")
        .count()
}

/// Answers the guest's next request `name` with `f`; a guest that exits or
/// stalls first fails the test with its output.
fn serve(g: &mut Option<Running>, name: &str, f: impl FnOnce() -> String) {
    let r = g.as_mut().unwrap();
    if !r.serve(name, Duration::from_secs(600), f) {
        let out = g.take().unwrap().finish();
        panic!(
            "the guest never asked for {name} (it failed or stalled)\n{}",
            out.report()
        );
    }
}

#[test]
fn kernel_nbd_client_in_guest() {
    let _h = heavy();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let port_a = free_port();
    let start_a = || {
        ServerBuilder::iolift()
            .args(["--tcp", &format!("127.0.0.1:{port_a}")])
            .backend(&format!("file:{},size=256M", img.display()))
            .start()
    };
    let mut a = Some(start_a());
    let b = ServerBuilder::iolift()
        .tcp()
        .args(["--stage", "cache:size=16M,block=4k"])
        .args(["--stage", "scheduler"])
        .backend("memory:256M")
        .start();
    let port_b = b.tcp_addr().unwrap().port();

    let mut g = Some(
        Guest::new(SCRIPT)
            .net()
            .env("PORT_A", port_a)
            .env("PORT_B", port_b)
            .timeout(Duration::from_secs(1200))
            .spawn(),
    );
    let mut full = 0;
    serve(&mut g, "alloc-full", || {
        full = allocated(&img);
        full.to_string()
    });
    let mut trimmed = 0;
    serve(&mut g, "alloc-trimmed", || {
        trimmed = allocated(&img);
        trimmed.to_string()
    });
    let signal = |sig: &str, pid: u32| {
        run_ok(Command::new("kill").args([sig, &pid.to_string()]));
        sig.to_string()
    };
    let pid_a = a.as_ref().unwrap().pid();
    serve(&mut g, "pause-server", || signal("-STOP", pid_a));
    serve(&mut g, "resume-server", || signal("-CONT", pid_a));
    serve(&mut g, "stop-server", || {
        drop(a.take());
        "stopped".into()
    });
    serve(&mut g, "start-server", || {
        a = Some(start_a());
        "started".into()
    });
    let mut conns = 0;
    serve(&mut g, "count-connections", || {
        conns = established(port_b);
        conns.to_string()
    });
    let out = g.take().unwrap().finish();
    out.assert_steps(&["connect", "ext4", "fstrim", "timeout", "restart", "fio"]);

    // 64 MiB written then trimmed: the backing file must have given back
    // most of it as holes.
    assert!(
        full >= 64 << 20 && trimmed + (48 << 20) <= full,
        "fstrim did not punch holes in the backing file: {full} bytes \
         allocated with the file, {trimmed} after fstrim\n{}",
        out.report()
    );
    assert_eq!(
        conns,
        4,
        "nbd-client -C 4 should have opened 4 connections\n{}",
        out.report()
    );
    eprintln!("fstrim: {full} bytes allocated with the file written, {trimmed} after fstrim");
    let mut a = a.expect("server A restarted");
    a.assert_running();
    let mut b = b;
    b.assert_running();
}
