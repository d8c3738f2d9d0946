//! `iolift attach` end to end on the real kernel: FUSE file + loop device
//! (direct I/O) + ext4. Needs root (mount(2), losetup); CI runs as root.
//!
//! Every test cleans up its mounts, loop devices and server through Drop
//! guards, also when it fails half-way.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn require_root() {
    common::require_root("the FUSE/loop tests need root (mount(2), losetup)");
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: the FUSE tests need a kernel with FUSE"
    );
}

/// What the file-backed tests start from: root checked, the heavy-test
/// lock held, a fresh temp dir and `backend.img` inside it (not created).
fn file_backed() -> (
    std::sync::MutexGuard<'static, ()>,
    tempfile::TempDir,
    PathBuf,
) {
    require_root();
    let h = heavy();
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("backend.img");
    (h, tmp, img)
}

fn rand_tag() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Writes files of assorted sizes (and one in a subdirectory) and returns
/// name -> sha256.
fn write_files(root: &Path, seed: u64) -> BTreeMap<String, String> {
    let mut sums = BTreeMap::new();
    fs::create_dir_all(root.join("sub")).unwrap();
    for (i, len) in [1usize, 4096, 65537, 1 << 20, 3 << 20, 777_777]
        .iter()
        .enumerate()
    {
        let name = if i % 2 == 0 {
            format!("f{seed}_{i}")
        } else {
            format!("sub/f{seed}_{i}")
        };
        let p = root.join(&name);
        write_random_file(&p, *len, seed * 100 + i as u64);
        sums.insert(name, sha256_file(&p));
    }
    sums
}

fn verify_files(root: &Path, sums: &BTreeMap<String, String>) {
    for (name, want) in sums {
        let p = root.join(name);
        assert!(p.exists(), "{} missing", p.display());
        assert_eq!(&sha256_file(&p), want, "{} changed", p.display());
    }
}

/// Allocated bytes of a (sparse) file.
fn allocated(p: &Path) -> u64 {
    fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn fuse_attach_ext4_roundtrip() {
    require_root();
    let _h = heavy();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Attached::start(tmp.path(), "memory:256M", &[]);
    assert!(
        a.dev.to_string_lossy().starts_with("/dev/loop"),
        "attach printed {:?}",
        a.dev
    );
    let name = a.dev.file_name().unwrap().to_string_lossy().to_string();
    let dio = fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap();
    assert_eq!(dio.trim(), "1", "loop device without direct I/O");
    assert_eq!(
        fs::metadata(&a.file).unwrap().len(),
        256 << 20,
        "FUSE file size != device size"
    );

    mkfs_ext4(&a.dev);
    let mnt = tmp.path().join("mnt");
    let mut m = Mount::new(&a.dev, &mnt);
    let sums = write_files(&mnt, 1);
    sync();
    m.umount();
    fsck_clean(&a.dev);
    let mut m = Mount::new(&a.dev, &mnt);
    verify_files(&mnt, &sums);
    // Detach refuses while the file system is mounted.
    let o = run_fail(Command::new(iolift_bin()).arg("detach").arg(&a.dev));
    assert!(o.all().contains("in use"), "{}", o.all());
    m.umount();
    fsck_clean(&a.dev);
    a.detach();
    let log = a.log();
    assert!(!log.contains("ERROR"), "server log has errors:\n{log}");
}

#[test]
fn fuse_fstrim_reaches_file_backend() {
    let (_h, tmp, img) = file_backed();
    let a = Attached::start(
        tmp.path(),
        &format!("file:{},size=256M", img.display()),
        &[],
    );
    mkfs_ext4(&a.dev);
    let mnt = tmp.path().join("mnt");
    let mut m = Mount::new(&a.dev, &mnt);
    write_random_file(&mnt.join("big"), 48 << 20, 7);
    sync();
    let before = allocated(&img);
    assert!(
        before >= 48 << 20,
        "backend holds only {before} bytes after writing 48 MiB"
    );
    fs::remove_file(mnt.join("big")).unwrap();
    sync();
    run_ok(cmd("fstrim").arg(&mnt));
    sync();
    let after = allocated(&img);
    assert!(
        after + (40 << 20) <= before,
        "fstrim did not reach the backend: allocated {before} -> {after} bytes"
    );
    m.umount();
    fsck_clean(&a.dev);
}

#[test]
fn fuse_kill9_then_reattach_keeps_synced_files() {
    let (_h, tmp, img) = file_backed();
    let backend = format!("file:{},size=256M", img.display());
    let mnt = tmp.path().join("mnt");
    let sums;
    {
        let mut a = Attached::start(tmp.path(), &backend, &[]);
        mkfs_ext4(&a.dev);
        let mut m = Mount::new(&a.dev, &mnt);
        let mut s = write_files(&mnt, 3);
        s.extend(write_files(&mnt, 4));
        sums = s;
        sync();
        // Unsynced writes in flight when the server dies.
        let mut w = Command::new("dd")
            .arg("if=/dev/urandom")
            .arg(format!("of={}", mnt.join("inflight").display()))
            .args(["bs=1M", "count=120", "oflag=direct"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(400));
        let pid = a.pid();
        assert!(pid > 0);
        a.kill9();
        let _ = wait_child(&mut w, Duration::from_secs(60)).or_else(|| {
            let _ = w.kill();
            w.wait().ok()
        });
        // The file system sees I/O errors now; unmount it, then let detach
        // clean up the loop device and the dead FUSE mount.
        m.release();
        run_ok(Command::new(iolift_bin()).arg("detach").arg(&a.dev));
        assert!(
            !is_mounted(a.file.parent().unwrap()),
            "dead FUSE mount left"
        );
    }
    let a = Attached::start(tmp.path(), &backend, &[]);
    // Journal replay by the kernel, then a full check must be clean.
    let mut m = Mount::new(&a.dev, &mnt);
    m.umount();
    fsck_clean(&a.dev);
    let _m = Mount::new(&a.dev, &mnt);
    verify_files(&mnt, &sums);
}

/// The FUSE file alone (--no-loop): direct I/O, size, no truncation,
/// fallocate punch/zero reaching the backend.
#[test]
fn fuse_file_ops_without_loop() {
    let (_h, tmp, img) = file_backed();
    let a = Attached::start(
        tmp.path(),
        &format!("file:{},size=64M", img.display()),
        &["--no-loop"],
    );
    assert_eq!(a.dev, a.file.canonicalize().unwrap());
    let f = &a.file;
    assert_eq!(fs::metadata(f).unwrap().len(), 64 << 20);
    // Direct-I/O write through the FUSE file lands in the backend file.
    let src = tmp.path().join("src");
    write_random_file(&src, 8 << 20, 11);
    run_ok(
        cmd("dd")
            .arg(format!("if={}", src.display()))
            .arg(format!("of={}", f.display()))
            .args([
                "bs=1M",
                "seek=4",
                "oflag=direct",
                "conv=notrunc,fsync",
                "status=none",
            ]),
    );
    let back = fs::read(&img).unwrap();
    let want = fs::read(&src).unwrap();
    assert!(back[4 << 20..12 << 20] == want[..], "backend file differs");
    let copy = tmp.path().join("copy");
    run_ok(
        cmd("dd")
            .arg(format!("if={}", f.display()))
            .arg(format!("of={}", copy.display()))
            .args(["bs=1M", "skip=4", "count=8", "iflag=direct", "status=none"]),
    );
    assert_eq!(sha256_file(&copy), sha256_file(&src));
    // Writing past the end fails; truncation is refused.
    let o = run_fail(
        cmd("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", f.display()))
            .args([
                "bs=1M",
                "seek=64",
                "count=1",
                "oflag=direct",
                "conv=notrunc",
                "status=none",
            ]),
    );
    assert!(o.all().contains("space"), "{}", o.all());
    run_fail(cmd("truncate").args(["-s", "1M"]).arg(f));
    assert_eq!(fs::metadata(f).unwrap().len(), 64 << 20);
    // Punch a hole: TRIM reaches the file backend.
    let before = allocated(&img);
    run_ok(cmd("fallocate").args(["-p", "-o", "4M", "-l", "4M"]).arg(f));
    let after = allocated(&img);
    assert!(
        after + (4 << 20) <= before,
        "punch hole did not reach the backend: {before} -> {after}"
    );
    // Zero range: WRITE_ZEROES.
    run_ok(cmd("fallocate").args(["-z", "-o", "8M", "-l", "1M"]).arg(f));
    let back = fs::read(&img).unwrap();
    assert!(
        back[4 << 20..9 << 20].iter().all(|b| *b == 0),
        "range not zeroed"
    );
    assert!(
        back[9 << 20..12 << 20] == want[5 << 20..],
        "data beyond the zeroed range changed"
    );
    // fsync works.
    run_ok(
        cmd("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", f.display()))
            .args([
                "bs=4k",
                "count=1",
                "oflag=direct,dsync",
                "conv=notrunc,fsync",
                "status=none",
            ]),
    );
}

#[test]
fn fuse_attach_errors_are_clear() {
    require_root();
    // Not root: one clear line, no panic.
    let o = run_fail(
        cmd("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(iolift_bin())
            .args(["attach", "memory:1M"]),
    );
    assert!(o.stderr.contains("root"), "{}", o.all());
    assert!(!o.stderr.contains("panicked"), "{}", o.all());
    // Bad backend.
    let tmp = tempfile::tempdir().unwrap();
    let o = run_fail(
        Command::new(iolift_bin())
            .arg("attach")
            .arg("--file")
            .arg(tmp.path().join("m/disk.img"))
            .arg("bogus:1M"),
    );
    assert!(o.stderr.contains("unknown backend"), "{}", o.all());
    assert!(!is_mounted(&tmp.path().join("m")));
    // Detach of something that is not ours.
    let o = run_fail(Command::new(iolift_bin()).args(["detach", "/etc/hostname"]));
    assert!(o.stderr.contains("neither"), "{}", o.all());
}

/// Cleans up an attachment made with `--name` (its mount dir under
/// /run/iolift and the pidfile next to it), also when the test fails.
struct NamedAttachment(PathBuf);

impl Drop for NamedAttachment {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new(iolift_bin())
                .arg("detach")
                .arg(&self.0)
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir(&self.0);
        let _ = fs::remove_file(self.0.with_extension("pid"));
    }
}

#[test]
fn fuse_detach_by_attach_name() {
    require_root();
    // A name no other run uses; no dots, so NAME.pid is its pidfile.
    let name = format!("t{}", rand_tag() % 1_000_000_000_000);
    let dir = Path::new("/run/iolift").join(&name);
    let _cleanup = NamedAttachment(dir.clone());
    let o = run_ok(
        Command::new(iolift_bin())
            .args(["attach", "memory:64M", "--name", &name, "--daemon"])
            .env("IOLIFT_LOG", "warn"),
    );
    let dev = PathBuf::from(o.stdout.trim());
    assert!(
        o.stdout.starts_with("/dev/loop"),
        "attach printed {:?}",
        o.stdout
    );
    assert!(is_mounted(&dir), "no FUSE mount at {}", dir.display());
    let pid: i32 = fs::read_to_string(dir.with_extension("pid"))
        .expect("attach --name writes /run/iolift/NAME.pid")
        .trim()
        .parse()
        .unwrap();
    // From a directory where NAME is no path: the name alone finds it.
    let cwd = tempfile::tempdir().unwrap();
    run_ok(
        Command::new(iolift_bin())
            .current_dir(cwd.path())
            .args(["detach", &name]),
    );
    // Gone, or a zombie waiting to be reaped (its parent, attach, exited).
    let state = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = state
        .rsplit_once(')')
        .map(|(_, r)| r.trim_start().chars().next());
    assert!(
        matches!(state, None | Some(Some('Z' | 'X'))),
        "server pid {pid} still runs after detach ({state:?})"
    );
    assert!(!is_mounted(&dir), "FUSE mount left after detach {name}");
    let loop_name = dev.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        !Path::new(&format!("/sys/block/{loop_name}/loop/backing_file")).exists(),
        "{} still bound after detach {name}",
        dev.display()
    );
    assert!(!dir.with_extension("pid").exists(), "pidfile left");
}
