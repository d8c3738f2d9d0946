//! The mirror backend mounted through the kernel's FUSE client (root
//! needed): POSIX semantics checked through the mount against the host
//! directory underneath.

use iolift_fs::kernel::{self, KernelOptions, Mounted};
use iolift_fs::mirror::{MirrorFs, MirrorOptions};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test mounts FUSE and needs root (run the suite as root, as CI does)");
    }
    true
}

struct Setup {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
    outside: PathBuf,
    m: Option<Mounted>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(m) = self.m.take() {
            let _ = m.unmount(true);
        }
    }
}

fn setup(opts: MirrorOptions, k: KernelOptions) -> Setup {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mnt = tmp.path().join("mnt");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&mnt).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret"), b"outside").unwrap();
    let fs = Arc::new(MirrorFs::open(&src, opts).unwrap());
    let m = kernel::mount(fs, &mnt, &k).unwrap();
    Setup {
        _tmp: tmp,
        src,
        mnt,
        outside,
        m: Some(m),
    }
}

fn default_setup() -> Setup {
    setup(MirrorOptions::default(), KernelOptions::default())
}

fn errno(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

#[test]
fn data_written_through_the_mount_is_in_the_host_file_and_back() {
    let s = default_setup();
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    fs::write(s.mnt.join("f"), &data).unwrap();
    assert_eq!(fs::read(s.src.join("f")).unwrap(), data);
    assert_eq!(fs::read(s.mnt.join("f")).unwrap(), data);
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(s.mnt.join("f"))
        .unwrap();
    f.seek(SeekFrom::Start(4095)).unwrap();
    f.write_all(b"xyz").unwrap();
    f.sync_all().unwrap();
    let host = fs::read(s.src.join("f")).unwrap();
    assert_eq!(&host[4095..4098], b"xyz");
    assert_eq!(host.len(), data.len());
}

#[test]
fn hard_links_share_one_node_and_their_link_count() {
    let s = default_setup();
    fs::write(s.mnt.join("a"), b"1").unwrap();
    fs::create_dir(s.mnt.join("d")).unwrap();
    fs::hard_link(s.mnt.join("a"), s.mnt.join("d/b")).unwrap();
    let (a, b) = (
        fs::metadata(s.mnt.join("a")).unwrap(),
        fs::metadata(s.mnt.join("d/b")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 2);
    assert_eq!(fs::metadata(s.src.join("a")).unwrap().nlink(), 2);
    fs::remove_file(s.mnt.join("a")).unwrap();
    assert_eq!(fs::metadata(s.mnt.join("d/b")).unwrap().nlink(), 1);
    fs::rename(s.mnt.join("d/b"), s.mnt.join("c")).unwrap();
    assert_eq!(fs::read(s.mnt.join("c")).unwrap(), b"1");
    assert!(!s.src.join("d/b").exists());
}

#[test]
fn an_unlinked_open_file_stays_readable_and_writable() {
    let s = default_setup();
    let p = s.mnt.join("tmpfile");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all(b"before").unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!s.src.join("tmpfile").exists());
    f.write_all(b" after").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "before after");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    assert_eq!(f.metadata().unwrap().len(), 12);
}

#[test]
fn paths_longer_than_path_max_work() {
    let s = default_setup();
    let comp = "d".repeat(200);
    let mut rel = PathBuf::new();
    // 30 levels of 201 bytes: about 6000 bytes, beyond PATH_MAX (4096).
    for _ in 0..30 {
        rel.push(&comp);
    }
    // Create level by level with relative paths (the full path is too long
    // for one system call), from a directory fd walked down the mount.
    let mut dir = fs::File::open(&s.mnt).unwrap();
    for _ in 0..30 {
        let c = std::ffi::CString::new(comp.clone()).unwrap();
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain system calls with valid fds and names.
        unsafe {
            let r = libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755);
            assert_eq!(r, 0, "mkdirat: {}", std::io::Error::last_os_error());
            let fd = libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            );
            assert!(fd >= 0);
            dir = fs::File::from_raw_fd(fd);
        }
    }
    // A file at the bottom, written through the deep fd, read on the host.
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: as above.
    let mut f = unsafe {
        let fd = libc::openat(
            dir.as_raw_fd(),
            c"leaf".as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
        );
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        fs::File::from_raw_fd(fd)
    };
    f.write_all(b"deep").unwrap();
    drop(f);
    assert!(s.src.join(&rel).as_os_str().len() > libc::PATH_MAX as usize);
    // The host path is too long for one call too: walk it there as well.
    let mut h = fs::File::open(&s.src).unwrap();
    for _ in 0..30 {
        let c = std::ffi::CString::new(comp.clone()).unwrap();
        // SAFETY: as above.
        h = unsafe {
            let fd = libc::openat(
                h.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            );
            assert!(fd >= 0);
            fs::File::from_raw_fd(fd)
        };
    }
    // SAFETY: as above.
    let mut leaf = unsafe {
        fs::File::from_raw_fd(libc::openat(
            h.as_raw_fd(),
            c"leaf".as_ptr(),
            libc::O_RDONLY,
        ))
    };
    let mut got = String::new();
    leaf.read_to_string(&mut got).unwrap();
    assert_eq!(got, "deep");
}

#[test]
fn names_over_255_bytes_are_refused_with_enametoolong() {
    let s = default_setup();
    let long = "n".repeat(256);
    assert_eq!(
        errno(fs::write(s.mnt.join(&long), b"x")),
        libc::ENAMETOOLONG
    );
    assert_eq!(errno(fs::create_dir(s.mnt.join(&long))), libc::ENAMETOOLONG);
    let ok = "n".repeat(255);
    fs::write(s.mnt.join(&ok), b"x").unwrap();
    assert!(s.src.join(&ok).exists());
}

#[test]
fn symlinks_are_never_followed_by_the_server() {
    let s = default_setup();
    // A link inside the tree pointing outside it, made on the host.
    std::os::unix::fs::symlink(s.outside.join("secret"), s.src.join("esc")).unwrap();
    std::os::unix::fs::symlink("../outside", s.src.join("up")).unwrap();
    // Reading it through the mount is the client resolving the link in its
    // own namespace; what the server must never do is act on the target
    // itself: set attributes, open for write through a name it resolves.
    let md = fs::symlink_metadata(s.mnt.join("esc")).unwrap();
    assert!(md.file_type().is_symlink());
    assert_eq!(
        fs::read_link(s.mnt.join("esc")).unwrap(),
        s.outside.join("secret")
    );
    // lchown-like and xattr calls on the link stay on the link.
    let before = fs::metadata(s.outside.join("secret")).unwrap();
    let c = std::ffi::CString::new(s.mnt.join("esc").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path.
    unsafe {
        libc::lchown(c.as_ptr(), 1234, 1234);
    }
    let after = fs::metadata(s.outside.join("secret")).unwrap();
    assert_eq!((before.uid(), before.gid()), (after.uid(), after.gid()));
    assert_eq!(fs::read(s.outside.join("secret")).unwrap(), b"outside");
    // `..` from the root stays at the mount's root (the kernel resolves it).
    assert_eq!(
        fs::metadata(s.mnt.join("..").join("mnt")).unwrap().ino(),
        fs::metadata(&s.mnt).unwrap().ino()
    );
    assert!(!s.outside.join("created").exists());
}

#[test]
fn times_follow_utime_omit_and_utime_now() {
    let s = default_setup();
    let p = s.mnt.join("t");
    fs::write(&p, b"x").unwrap();
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 5,
        },
        libc::timespec {
            tv_sec: 2_000_000,
            tv_nsec: 7,
        },
    ];
    // SAFETY: valid path and two timespecs.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let m = fs::metadata(s.src.join("t")).unwrap();
    assert_eq!(
        (m.atime(), m.atime_nsec(), m.mtime(), m.mtime_nsec()),
        (1_000_000, 5, 2_000_000, 7)
    );
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let m = fs::metadata(s.src.join("t")).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000, 5));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - m.mtime()).abs() < 60,
        "mtime {} now {now}",
        m.mtime()
    );
    let through = fs::metadata(&p).unwrap();
    assert_eq!(through.mtime(), m.mtime());
}

#[test]
fn fallocate_modes_reach_the_host_file() {
    let s = default_setup();
    let p = s.mnt.join("fa");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .custom_flags(0)
        .open(&p)
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: plain system calls on an fd we own.
    unsafe {
        assert_eq!(libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20), 0);
        assert_eq!(fs::metadata(s.src.join("fa")).unwrap().len(), 1 << 20);
        assert_eq!(
            libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20),
            0
        );
        assert_eq!(fs::metadata(s.src.join("fa")).unwrap().len(), 1 << 20);
        assert!(fs::metadata(s.src.join("fa")).unwrap().blocks() >= 4096);
    }
    (&f).write_all(&vec![0xaa; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    // SAFETY: as above.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            65536,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let host = fs::read(s.src.join("fa")).unwrap();
    assert!(host[4096..4096 + 65536].iter().all(|&b| b == 0));
    assert_eq!(host[0], 0xaa);
    assert_eq!(host[4096 + 65536], 0xaa);
    // An unknown mode bit is refused, not ignored.
    // SAFETY: as above.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0x4000_0000, 0, 4096) };
    assert_eq!(r, -1);
}

#[test]
fn renames_move_the_node_with_it() {
    let s = default_setup();
    fs::create_dir_all(s.mnt.join("a/b")).unwrap();
    fs::write(s.mnt.join("a/b/f"), b"v").unwrap();
    let f = fs::File::open(s.mnt.join("a/b/f")).unwrap();
    fs::rename(s.mnt.join("a"), s.mnt.join("z")).unwrap();
    // On the host too, behind the server's back.
    fs::rename(s.src.join("z/b"), s.src.join("y")).unwrap();
    assert_eq!(fs::read(s.mnt.join("y/f")).unwrap(), b"v");
    fs::write(s.mnt.join("y/g"), b"w").unwrap();
    assert_eq!(fs::read(s.src.join("y/g")).unwrap(), b"w");
    drop(f);
    // RENAME_NOREPLACE is honoured.
    fs::write(s.mnt.join("p"), b"1").unwrap();
    fs::write(s.mnt.join("q"), b"2").unwrap();
    let (p, q) = (s.mnt.join("p"), s.mnt.join("q"));
    assert_eq!(
        errno(renameat2(&p, &q, libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    // RENAME_EXCHANGE swaps.
    renameat2(&p, &q, libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(s.src.join("p")).unwrap(), b"2");
}

/// renameat2(2) of `a` to `b` with `flags` (RENAME_NOREPLACE, _EXCHANGE).
fn renameat2(a: &std::path::Path, b: &std::path::Path, flags: u32) -> std::io::Result<()> {
    let c = |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes());
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn a_large_directory_lists_every_entry_once() {
    let s = default_setup();
    for i in 0..3000 {
        fs::write(s.src.join(format!("e{i:05}")), b"").unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&s.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3000);
    assert_eq!(names[0], "e00000");
    assert_eq!(names[2999], "e02999");
    names.dedup();
    assert_eq!(names.len(), 3000);
    let ino = fs::metadata(s.mnt.join("e00042")).unwrap().ino();
    let listed = fs::read_dir(&s.mnt)
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.file_name() == "e00042")
        .unwrap();
    use std::os::unix::fs::DirEntryExt;
    assert_eq!(listed.ino(), ino);
}

/// The names in a listing of `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn kept_listings_follow_changes_through_the_mount_at_once_and_on_the_host_within_the_timeout() {
    let ttl = std::time::Duration::from_millis(300);
    let s = setup(
        MirrorOptions {
            ttl,
            ..MirrorOptions::default()
        },
        KernelOptions {
            ttl,
            ..KernelOptions::default()
        },
    );
    let d = s.mnt.join("d");
    fs::create_dir(&d).unwrap();
    for i in 0..200 {
        fs::write(d.join(format!("f{i:03}")), b"").unwrap();
    }
    let first = listing(&d);
    assert_eq!(first.len(), 200);
    assert_eq!(listing(&d), first, "a second (kept) listing differs");
    // Through the mount: seen by the very next listing.
    fs::write(d.join("m"), b"").unwrap();
    fs::remove_file(d.join("f000")).unwrap();
    let l = listing(&d);
    assert!(l.contains(&"m".to_string()) && !l.contains(&"f000".to_string()));
    assert_eq!(l.len(), 200);
    // On the host: seen once the directory's attributes are older than
    // the timeout (a kept listing is checked against its mtime).
    let hd = s.src.join("d");
    fs::write(hd.join("h"), b"").unwrap();
    fs::remove_file(hd.join("f001")).unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let l = listing(&d);
        if l.contains(&"h".to_string()) && !l.contains(&"f001".to_string()) {
            assert_eq!(l.len(), 200);
            break;
        }
        assert!(
            t0.elapsed() < ttl * 10,
            "host-side changes not listed after {:?} (timeout {ttl:?})",
            t0.elapsed()
        );
        std::thread::sleep(ttl / 4);
    }
}

#[test]
fn a_write_by_another_user_clears_the_set_user_id_bit() {
    let s = default_setup();
    use std::os::unix::fs::PermissionsExt;
    let p = s.mnt.join("suid");
    fs::write(&p, b"0123456789").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o4777)).unwrap();
    assert_eq!(
        fs::metadata(s.src.join("suid")).unwrap().mode() & 0o7777,
        0o4777
    );
    // Written as root (CAP_FSETID): the bit stays, as on a local file system.
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .write_all(b"r")
        .unwrap();
    assert_eq!(
        fs::metadata(s.src.join("suid")).unwrap().mode() & 0o7777,
        0o4777
    );
    // Written as nobody: the bit goes, on the host file too.
    let st = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(format!(
            "printf x | dd of={} conv=notrunc status=none",
            p.display()
        ))
        .status()
        .expect("setpriv (util-linux)");
    assert!(st.success());
    assert_eq!(&fs::read(s.src.join("suid")).unwrap()[..2], b"x1");
    assert_eq!(
        fs::metadata(s.src.join("suid")).unwrap().mode() & 0o7777,
        0o777
    );
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o777);
}

#[test]
fn copy_file_range_copies_between_files_in_the_mount() {
    let s = default_setup();
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(s.src.join("a"), &data).unwrap();
    fs::write(s.src.join("b"), vec![7u8; 4096]).unwrap();
    let a = fs::File::open(s.mnt.join("a")).unwrap();
    let b = fs::OpenOptions::new()
        .write(true)
        .open(s.mnt.join("b"))
        .unwrap();
    use std::os::fd::AsRawFd;
    let (mut off_in, mut off_out) = (4096i64, 8192i64);
    let mut left = 300_000usize;
    while left > 0 {
        // SAFETY: both descriptors are open; the offsets are ours.
        let n = unsafe {
            libc::copy_file_range(
                a.as_raw_fd(),
                &mut off_in,
                b.as_raw_fd(),
                &mut off_out,
                left,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        left -= n as usize;
    }
    drop(b);
    let got = fs::read(s.src.join("b")).unwrap();
    assert_eq!(got.len(), 8192 + 300_000);
    assert!(got[..4096].iter().all(|&x| x == 7), "bytes before the hole");
    assert!(got[4096..8192].iter().all(|&x| x == 0), "the hole");
    assert!(got[8192..] == data[4096..4096 + 300_000], "copied range");
}
