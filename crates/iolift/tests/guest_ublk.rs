//! The ublk front-end (`iolift serve --ublk`).
//!
//! - `ublk_error_without_driver`: on a host without the ublk driver (these
//!   machines load no modules), `serve --ublk` fails at once with an error
//!   that names the missing driver.
//! - `ublk_in_guest`: in a QEMU guest with Debian 13's 6.12 kernel
//!   (`modprobe ublk_drv`), iolift runs INSIDE the guest (the binary cargo
//!   built, seen through the guest's 9p root) and serves /dev/ublkb0; one
//!   boot runs every step (see docs/guest.md and docs/ublk.md):
//!   `memory` (mkfs.ext4, files, remount, checksums, fsck, fio verify, the
//!   device removed when iolift stops), `file` (the same through the
//!   cache and scheduler stages on a file backend, then served again by a
//!   new process: fsck clean, data still there), `kill` (iolift killed
//!   with SIGKILL while the device is up: I/O fails instead of hanging).
//!
//! The binary must be built with the `ublk` feature (scripts/test.sh does);
//! without it the guest test fails with iolift's own message saying so.

mod common;
use common::*;
use iolift_testkit::guest::Guest;
use std::path::Path;
use std::time::Duration;

const SCRIPT: &str = r#"
modprobe ublk_drv
[ -e /dev/ublk-control ]
log=/tmp/iolift.log
# Starts iolift serve in the background with the given arguments and waits
# for its device; the pid goes to $srv.
serve() {
    "$IOLIFT" serve --socket /tmp/iolift.sock "$@" > $log 2>&1 &
    srv=$!
    for i in $(seq 600); do
        [ -b /dev/ublkb0 ] && grep -q 'connect with' $log && return 0
        if ! kill -0 $srv 2>/dev/null; then echo "iolift exited:"; cat $log; return 1; fi
        sleep 0.1
    done
    echo "no /dev/ublkb0 after 60 s:"; cat $log; return 1
}
stop() {
    kill -TERM $srv
    timeout 60 tail --pid=$srv -f /dev/null
    for i in $(seq 100); do [ -e /dev/ublkb0 ] || return 0; sleep 0.1; done
    echo "/dev/ublkb0 still there after iolift stopped"; return 1
}
ext4_check() {
    mkfs.ext4 -q -F /dev/ublkb0
    mkdir -p /mnt/u && mount /dev/ublkb0 /mnt/u
    head -c $((16 << 20)) /dev/urandom > /mnt/u/big
    mkdir /mnt/u/small
    for i in $(seq 1 200); do echo "small $i $RANDOM" > /mnt/u/small/f$i; done
    (cd /mnt/u && find . -type f | sort | xargs sha256sum) > /tmp/sums
    sync; umount /mnt/u
    echo 3 > /proc/sys/vm/drop_caches
    mount /dev/ublkb0 /mnt/u
    (cd /mnt/u && sha256sum --quiet -c /tmp/sums)
    umount /mnt/u
    fsck.ext4 -f -n /dev/ublkb0
}
fio_check() {
    timeout 300 fio --name=verify --filename=/dev/ublkb0 --direct=1 --ioengine=libaio \
        --rw=randwrite --bsrange=4k-128k --iodepth=16 --numjobs=2 --size=32M \
        --offset_increment=64M --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --randseed=11 --group_reporting --output-format=terse --terse-version=3 > /tmp/fio.out
    cut -d';' -f1-10 /tmp/fio.out
}

step memory
serve --ublk memory:256M
echo "size=$(blockdev --getsize64 /dev/ublkb0)"
[ "$(blockdev --getsize64 /dev/ublkb0)" = $((256 << 20)) ]
ext4_check
fio_check
stop

step file
serve --stage cache:size=16M,block=4k --stage scheduler --ublk file:/tmp/disk.img,size=256M
ext4_check
mount /dev/ublkb0 /mnt/u
echo persisted > /mnt/u/mark
umount /mnt/u
stop
serve --ublk file:/tmp/disk.img,size=256M
fsck.ext4 -f -n /dev/ublkb0
mount /dev/ublkb0 /mnt/u
[ "$(cat /mnt/u/mark)" = persisted ]
umount /mnt/u
stop

step kill
serve --ublk memory:64M
dd if=/dev/urandom of=/dev/ublkb0 bs=1M count=4 oflag=direct status=none
kill -KILL $srv
wait $srv || true
rc=0; timeout 60 dd if=/dev/ublkb0 of=/dev/null bs=4k count=1 skip=100 iflag=direct status=none || rc=$?
echo "io_after_kill=$rc"
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then echo "I/O after the server died did not fail cleanly"; exit 1; fi
echo "device_after_kill=$([ -e /dev/ublkb0 ] && echo present || echo gone)"
dmesg | grep -i ublk | tail -5 || true
"#;

#[test]
fn ublk_in_guest() {
    let _h = heavy();
    let out = Guest::new(SCRIPT)
        .env("IOLIFT", iolift_bin().display())
        .mem("2G")
        .timeout(Duration::from_secs(900))
        .run();
    out.assert_steps(&["memory", "file", "kill"]);
    assert_eq!(out.value("size").as_deref(), Some("268435456"));
}

#[test]
fn ublk_error_without_driver() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let mut c = cmd(iolift_bin().to_str().unwrap());
    c.args(["serve", "--socket"])
        .arg(&sock)
        .args(["--ublk", "memory:16M"]);
    if Path::new("/dev/ublk-control").exists() {
        // This host has the driver: the error cannot be shown here; check
        // that a bad export name is still refused before any device is made.
        let mut c = cmd(iolift_bin().to_str().unwrap());
        c.args(["serve", "--socket"])
            .arg(&sock)
            .args(["--ublk=nosuch", "memory:16M"]);
        let o = run_fail(&mut c);
        assert!(o.stderr.contains("nosuch"), "{}", o.report());
        eprintln!("this host has /dev/ublk-control: the missing-driver error was not checked");
        return;
    }
    let o = run_fail(&mut c);
    assert!(
        o.stderr.contains("/dev/ublk-control") && o.stderr.contains("ublk_drv"),
        "the error should name the missing driver\n{}",
        o.report()
    );
    assert!(!sock.exists(), "the socket should be removed on the error");
}
