//! The mirror backend called directly with requests a kernel would never
//! send (a malformed or hostile FUSE client could): made-up node ids and
//! handles, names with `/`, `..` or NUL, opens of symlinks. Each gets an
//! errno and nothing outside the directory is touched. No root needed.

use iolift_fs::mirror::{MirrorFs, MirrorOptions};
use iolift_fs::model::*;
use iolift_fs::FileSystem;
use std::ffi::OsStr;
use std::fs;
use std::sync::mpsc;

fn call<T: Send + 'static>(f: impl FnOnce(Done<T>)) -> FsResult<T> {
    let (tx, rx) = mpsc::channel();
    f(Done::new(move |r| tx.send(r).unwrap()));
    rx.recv().unwrap()
}

#[test]
fn hostile_requests_get_errnos_and_touch_nothing_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(tmp.path().join("secret"), b"keep").unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    std::os::unix::fs::symlink("../secret", src.join("esc")).unwrap();
    let m = MirrorFs::open(
        &src,
        MirrorOptions {
            max_nodes: 8,
            max_handles: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let c = Ctx::default();

    for bad in ["..", ".", "a/b", "../secret", "/etc/passwd", "x\0y", ""] {
        let r = call(|d| m.lookup(&c, ROOT, OsStr::new(bad), d));
        assert_eq!(r.err(), Some(Errno::EINVAL), "lookup {bad:?}");
        let r = call(|d| m.create(&c, ROOT, OsStr::new(bad), 0o644, libc::O_RDWR, d));
        assert_eq!(r.err(), Some(Errno::EINVAL), "create {bad:?}");
        let r = call(|d| m.rename(&c, ROOT, OsStr::new("f"), ROOT, OsStr::new(bad), 0, d));
        assert_eq!(r.err(), Some(Errno::EINVAL), "rename to {bad:?}");
    }
    let long = "l".repeat(256);
    assert_eq!(
        call(|d| m.mkdir(&c, ROOT, OsStr::new(&long), 0o755, d)).err(),
        Some(Errno::ENAMETOOLONG)
    );

    // Made-up node ids and handles.
    assert_eq!(
        call(|d| m.getattr(&c, 999_999, None, d)).err(),
        Some(Errno::ENOENT)
    );
    assert_eq!(
        call(|d| m.lookup(&c, 424_242, OsStr::new("f"), d)).err(),
        Some(Errno::ENOENT)
    );
    assert_eq!(
        call(|d| m.read(&c, ROOT, 77, 0, 4096, d)).err(),
        Some(Errno::EBADF)
    );
    assert_eq!(
        call(|d| m.write(&c, ROOT, 77, 0, b"x", false, d)).err(),
        Some(Errno::EBADF)
    );
    assert_eq!(
        call(|d| m.release(&c, ROOT, 77, d)).err(),
        Some(Errno::EBADF)
    );
    m.forget(123_456, 5);
    m.forget(ROOT, 1_000);

    // A file is not a directory; a symlink is never opened (the server
    // would follow it) and its target is untouched.
    let f = call(|d| m.lookup(&c, ROOT, OsStr::new("f"), d)).unwrap();
    assert_eq!(
        call(|d| m.lookup(&c, f.attr.ino, OsStr::new("x"), d)).err(),
        Some(Errno::ENOTDIR)
    );
    let l = call(|d| m.lookup(&c, ROOT, OsStr::new("esc"), d)).unwrap();
    assert_eq!(l.attr.kind(), libc::S_IFLNK);
    assert_eq!(
        call(|d| m.open(&c, l.attr.ino, libc::O_RDWR | libc::O_TRUNC, d)).err(),
        Some(Errno::ELOOP)
    );
    let set = SetAttr {
        size: Some(0),
        mode: Some(0o777),
        ..Default::default()
    };
    assert!(call(|d| m.setattr(&c, l.attr.ino, set, d)).is_err());
    assert!(call(|d| m.lookup(&c, l.attr.ino, OsStr::new("x"), d)).is_err());
    assert_eq!(fs::read(tmp.path().join("secret")).unwrap(), b"keep");
    assert_eq!(
        call(|d| m.readlink(&c, l.attr.ino, d)).unwrap(),
        b"../secret"
    );

    // Budgets: handles beyond max_handles fail with ENFILE, and come back.
    let h1 = call(|d| m.open(&c, f.attr.ino, libc::O_RDONLY, d)).unwrap();
    let h2 = call(|d| m.open(&c, f.attr.ino, libc::O_RDONLY, d)).unwrap();
    assert_eq!(
        call(|d| m.open(&c, f.attr.ino, libc::O_RDONLY, d)).err(),
        Some(Errno::ENFILE)
    );
    assert_eq!(
        &call(|d| m.read(&c, f.attr.ino, h1.fh, 0, 100, d)).unwrap()[..],
        b"data"
    );
    call(|d| m.release(&c, f.attr.ino, h1.fh, d)).unwrap();
    call(|d| m.release(&c, f.attr.ino, h2.fh, d)).unwrap();
    assert!(call(|d| m.open(&c, f.attr.ino, libc::O_RDONLY, d)).is_ok());
    // Nodes beyond max_nodes fail with ENFILE.
    for i in 0..10 {
        fs::write(src.join(format!("n{i}")), b"").unwrap();
    }
    let errs: Vec<_> = (0..10)
        .map(|i| call(|d| m.lookup(&c, ROOT, OsStr::new(&format!("n{i}")), d)).err())
        .collect();
    assert!(errs.contains(&Some(Errno::ENFILE)), "{errs:?}");
    assert!(m.held().0 <= 8);
}
