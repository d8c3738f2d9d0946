//! `iolift fs serve-virtiofs`: the kernel's own virtio-fs client in a QEMU
//! guest (scripts/vm/guest.sh, Debian 13's 6.12 kernel, emulated CPU)
//! mounts a host directory served by iolift's mirror backend over
//! vhost-user and works on it; the host then checks what landed in the
//! directory. One boot, one step per check (see docs/fs.md):
//!
//! - `mount`: `mount -t virtiofs`, the files the host put there read back
//!   with their checksums.
//! - `write`: dd of random data (checksum compared on the host) and fio
//!   verify (4k random writes, direct I/O, crc32c).
//! - `names`: mkdir, rename, hard link (nlink 2 seen through both names),
//!   symlink, unlink, rmdir, 200 files created and removed, a file
//!   unlinked while open still read and written.
//! - `host-change`: a file the host writes while mounted is seen.
//! - `umount`: unmounted; the guest powers off and the server exits 0.
//!
//! guest.sh has no virtio-fs attachment, so the test puts a
//! `qemu-system-x86_64` wrapper first on guest.sh's PATH that adds the
//! vhost-user-fs device and the shared guest memory it needs.

mod common;
use common::*;
use iolift_testkit::guest::Guest;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TAG: &str = "iolift";

const SCRIPT: &str = r#"
mkdir -p /mnt/v
step mount
modprobe virtiofs
mount -t virtiofs "$TAG" /mnt/v
grep " /mnt/v virtiofs " /proc/mounts
(cd /mnt/v/pre && sha256sum --quiet -c sums)
[ "$(ls /mnt/v/pre | wc -l)" = 3 ]

step write
head -c $((6 << 20)) /dev/urandom > /tmp/rand
dd if=/tmp/rand of=/mnt/v/dd.bin bs=64k status=none conv=fsync
echo "dd_sha=$(sha256sum < /tmp/rand | cut -d' ' -f1)"
echo 3 > /proc/sys/vm/drop_caches
cmp /tmp/rand /mnt/v/dd.bin
timeout 300 fio --name=verify --filename=/mnt/v/fio.dat --size=4M --direct=1 \
    --ioengine=psync --rw=randwrite --bs=4k --verify=crc32c --verify_fatal=1 \
    --do_verify=1 --randseed=11 --output-format=terse --terse-version=3 > /tmp/fio.out
echo "fio_ok=1"

step names
cd /mnt/v
mkdir -p d1/d2
echo hello > d1/f
ln d1/f d1/hard
[ "$(stat -c %h d1/f)" = 2 ]
[ "$(stat -c %i d1/f)" = "$(stat -c %i d1/hard)" ]
ln -s f d1/sym
[ "$(readlink d1/sym)" = f ]
[ "$(cat d1/sym)" = hello ]
mv d1/d2 d1/d3
[ ! -e d1/d2 ] && [ -d d1/d3 ]
mv d1/hard d1/d3/moved
[ "$(stat -c %h d1/f)" = 2 ]
rm d1/d3/moved
[ "$(stat -c %h d1/f)" = 1 ]
mkdir d1/gone && rmdir d1/gone
mkdir many
for i in $(seq 1 200); do echo "$i" > many/f$i; done
[ "$(ls many | wc -l)" = 200 ]
rm many/f*
[ "$(ls many | wc -l)" = 0 ]
rmdir many
echo before > open.txt
exec 3<>open.txt
rm open.txt
[ ! -e open.txt ]
echo after >&3
[ "$(cat /proc/self/fd/3)" = "$(printf 'before\nafter')" ] || [ "$(cat <&3 || true)" = "" ]
exec 3>&-
cd /

step host-change
host_request host-write
sleep 2
[ "$(cat /mnt/v/from-host.txt)" = "written on the host" ]

step umount
umount /mnt/v
! grep -q " /mnt/v " /proc/mounts
"#;

#[test]
fn guest_mounts_mirror_over_virtiofs() {
    require_root("the guest test runs QEMU and guest.sh, which want root");
    let qemu = "/usr/bin/qemu-system-x86_64";
    if !Path::new(qemu).exists() {
        eprintln!("SKIP: {qemu} is missing (Debian qemu-system-x86): no guest to mount virtio-fs");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let share = work.path().join("share");
    fs::create_dir_all(share.join("pre")).unwrap();
    let mut sums = String::new();
    for (name, len) in [("a.bin", 1 << 20), ("b.txt", 100)] {
        let data = Rng::new(len as u64).bytes(len);
        fs::write(share.join("pre").join(name), &data).unwrap();
        sums += &format!("{}  {name}\n", sha256_file(&share.join("pre").join(name)));
    }
    fs::write(share.join("pre/sums"), sums).unwrap();

    // The server: one connection, then it exits.
    let sock = work.path().join("vfs.sock");
    let mut server = Command::new(iolift_bin())
        .args(["fs", "serve-virtiofs"])
        .arg("--shared-dir")
        .arg(&share)
        .arg("--socket-path")
        .arg(&sock)
        .args(["--thread-pool-size", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn iolift fs serve-virtiofs");
    let out = server.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("serve-virtiofs printed nothing: {:?}", server.try_wait()));
    assert!(line.contains("vhost-user"), "{line}");
    assert!(sock.exists(), "no socket at {}", sock.display());

    // A qemu-system-x86_64 that adds the virtio-fs device to guest.sh's
    // command line (guest memory must be shared for vhost-user).
    let bin = work.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    let wrapper = bin.join("qemu-system-x86_64");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {qemu} \"$@\" -chardev socket,id=vfs,path={} \
             -device vhost-user-fs-pci,chardev=vfs,tag={TAG} \
             -object memory-backend-memfd,id=vmem,size=1G,share=on -numa node,memdev=vmem\n",
            sock.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // SAFETY: this test file has one test; nothing else reads the
    // environment concurrently.
    std::env::set_var("PATH", path);

    let t0 = Instant::now();
    let mut g = Guest::new(SCRIPT)
        .mem("1G")
        .env("TAG", TAG)
        .timeout(Duration::from_secs(540))
        .spawn();
    let share2 = share.clone();
    let served = g.serve("host-write", Duration::from_secs(480), move || {
        fs::write(share2.join("from-host.txt"), "written on the host").unwrap();
        "ok".into()
    });
    let out = g.finish();
    eprintln!("guest run took {:?}", t0.elapsed());
    let st = wait_child(&mut server, Duration::from_secs(30));
    let mut err = String::new();
    if let Some(mut e) = server.stderr.take() {
        use std::io::Read;
        if st.is_some() {
            let _ = e.read_to_string(&mut err);
        }
    }
    if st.is_none() {
        let _ = server.kill();
        let _ = server.wait();
    }
    out.assert_steps(&["mount", "write", "names", "host-change", "umount"]);
    assert!(
        served,
        "the guest never asked for the host write\n{}",
        out.report()
    );
    assert!(
        st.is_some_and(|s| s.success()),
        "serve-virtiofs after the guest left: {st:?}\n{err}"
    );

    // What the guest did, seen on the host.
    let dd_sha = out.value("dd_sha").expect("the guest printed dd_sha");
    assert_eq!(sha256_file(&share.join("dd.bin")), dd_sha);
    assert_eq!(fs::metadata(share.join("fio.dat")).unwrap().len(), 4 << 20);
    let f = fs::metadata(share.join("d1/f")).unwrap();
    assert_eq!(f.nlink(), 1);
    assert_eq!(fs::read_to_string(share.join("d1/f")).unwrap(), "hello\n");
    assert_eq!(fs::read_link(share.join("d1/sym")).unwrap(), Path::new("f"));
    assert!(share.join("d1/d3").is_dir());
    assert!(!share.join("d1/d2").exists());
    assert!(!share.join("many").exists());
    assert!(!share.join("open.txt").exists());
    assert!(!sock.exists(), "the socket was left behind");
}
