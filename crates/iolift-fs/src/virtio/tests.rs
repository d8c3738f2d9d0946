//! The virtio-fs session driven with request bytes as a guest sends them:
//! a round trip through the mirror backend, and malformed requests
//! (truncated, lying lengths, unknown opcodes, random bytes): each one
//! gets exactly one answer, an errno where it is bad, and never a panic.

use super::reply::collect;
use super::session::{Session, SessionOptions};
use super::wire::{self, op};
use crate::stats::OpStats;
use crate::{FileSystem, ROOT};
use std::sync::Arc;
use std::time::Duration;

fn req(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    let len = (wire::IN_HEADER_LEN + body.len()) as u32;
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&opcode.to_le_bytes());
    v.extend_from_slice(&unique.to_le_bytes());
    v.extend_from_slice(&nodeid.to_le_bytes());
    v.extend_from_slice(&[0u8; 16]); // uid, gid, pid, extlen, padding
    v.extend_from_slice(body);
    v
}

/// Sends `bytes`; returns (errno, body) of the single answer.
fn call(s: &Session, bytes: &[u8], room: usize) -> Option<(i32, Vec<u8>)> {
    let (r, rx) = collect::reply(room);
    s.handle(bytes, r);
    let got = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("every request is answered");
    assert!(rx.try_recv().is_err(), "answered twice");
    let v = got?;
    assert!(v.len() >= 16 && v.len() <= room);
    assert_eq!(
        u32::from_le_bytes(v[0..4].try_into().unwrap()) as usize,
        v.len()
    );
    let err = i32::from_le_bytes(v[4..8].try_into().unwrap());
    Some((-err, v[16..].to_vec()))
}

fn session(fs: Arc<dyn FileSystem>) -> Session {
    let s = Session::new(fs, Arc::new(OpStats::default()), SessionOptions::default());
    let mut init = Vec::new();
    for v in [7u32, 38, 1 << 20, u32::MAX] {
        init.extend_from_slice(&v.to_le_bytes());
    }
    init.extend_from_slice(&[0u8; 48]);
    let (e, body) = call(&s, &req(op::INIT, 1, 0, &init), 4096).unwrap();
    assert_eq!(e, 0);
    assert_eq!(body.len(), 64);
    assert_eq!(&body[0..4], &7u32.to_le_bytes());
    s
}

fn name(n: &str) -> Vec<u8> {
    let mut v = n.as_bytes().to_vec();
    v.push(0);
    v
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn a_request_before_init_fails_with_eio() {
    let s = Session::new(
        Arc::new(crate::null::NullFs::new(4096)),
        Arc::new(OpStats::default()),
        SessionOptions::default(),
    );
    let (e, _) = call(&s, &req(op::GETATTR, 2, ROOT, &[0; 16]), 4096).unwrap();
    assert_eq!(e, libc::EIO);
}

#[test]
fn create_write_read_and_escape_through_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let fs = crate::open_backend(
        &format!("mirror:{}", dir.path().display()),
        &Default::default(),
    )
    .unwrap();
    let s = session(fs);
    // CREATE "f" 0644, O_RDWR.
    let mut b = Vec::new();
    for v in [libc::O_RDWR as u32, 0o100644, 0o022, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend(name("f"));
    let (e, body) = call(&s, &req(op::CREATE, 3, ROOT, &b), 4096).unwrap();
    assert_eq!(e, 0, "create");
    assert_eq!(body.len(), wire::ENTRY_OUT_LEN + 16);
    let node = u64_at(&body, 0);
    let fh = u64_at(&body, wire::ENTRY_OUT_LEN);
    // WRITE "hello" at 3.
    let mut b = Vec::new();
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&3u64.to_le_bytes());
    b.extend_from_slice(&5u32.to_le_bytes());
    b.extend_from_slice(&[0u8; 20]);
    b.extend_from_slice(b"hello");
    let (e, body) = call(&s, &req(op::WRITE, 4, node, &b), 4096).unwrap();
    assert_eq!((e, &body[0..4]), (0, &5u32.to_le_bytes()[..]));
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"\0\0\0hello");
    // READ 100 bytes from 0: the file's 8.
    let mut b = Vec::new();
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&100u32.to_le_bytes());
    b.extend_from_slice(&[0u8; 20]);
    let (e, body) = call(&s, &req(op::READ, 5, node, &b), 4096).unwrap();
    assert_eq!((e, body.as_slice()), (0, &b"\0\0\0hello"[..]));
    // A write whose size claims more than it carries.
    let mut b = Vec::new();
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(&[0u8; 20]);
    b.extend_from_slice(b"short");
    let (e, _) = call(&s, &req(op::WRITE, 6, node, &b), 4096).unwrap();
    assert_eq!(e, libc::EINVAL);
    // Names that leave the directory.
    for bad in ["..", ".", "a/b"] {
        let (e, _) = call(&s, &req(op::LOOKUP, 7, ROOT, &name(bad)), 4096).unwrap();
        assert_eq!(e, libc::EINVAL, "{bad}");
    }
    let long = "x".repeat(300);
    let (e, _) = call(&s, &req(op::LOOKUP, 8, ROOT, &name(&long)), 4096).unwrap();
    assert_eq!(e, libc::ENAMETOOLONG);
    // READDIR of the root in a 4 KiB buffer: ".", "..", "f".
    let mut b = Vec::new();
    b.extend_from_slice(&0u32.to_le_bytes()); // OPENDIR flags
    b.extend_from_slice(&0u32.to_le_bytes());
    let (e, body) = call(&s, &req(op::OPENDIR, 9, ROOT, &b), 4096).unwrap();
    assert_eq!(e, 0);
    let dfh = u64_at(&body, 0);
    let mut b = Vec::new();
    b.extend_from_slice(&dfh.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(&[0u8; 20]);
    let (e, body) = call(&s, &req(op::READDIR, 10, ROOT, &b), 4096).unwrap();
    assert_eq!(e, 0);
    let mut names = Vec::new();
    let mut at = 0;
    while at + wire::DIRENT_LEN <= body.len() {
        let n = u32::from_le_bytes(body[at + 16..at + 20].try_into().unwrap()) as usize;
        names.push(String::from_utf8_lossy(&body[at + 24..at + 24 + n]).into_owned());
        at += wire::DIRENT_LEN + n + wire::pad8(n);
    }
    names.sort();
    assert_eq!(names, [".", "..", "f"]);
}

#[test]
fn malformed_requests_get_an_errno_never_a_panic() {
    let s = session(Arc::new(crate::null::NullFs::new(1 << 20)));
    // Truncated header; a header whose len is larger than the bytes.
    assert_eq!(call(&s, &[1, 2, 3], 4096).unwrap().0, libc::EINVAL);
    let mut r = req(op::GETATTR, 2, ROOT, &[0; 16]);
    r[0..4].copy_from_slice(&1000u32.to_le_bytes());
    assert_eq!(call(&s, &r, 4096).unwrap().0, libc::EINVAL);
    r[0..4].copy_from_slice(&10u32.to_le_bytes());
    assert_eq!(call(&s, &r, 4096).unwrap().0, libc::EINVAL);
    // Unknown opcode; a name without its NUL; a batch forget that claims
    // more entries than it carries; a short body.
    assert_eq!(
        call(&s, &req(999, 3, ROOT, &[]), 4096).unwrap().0,
        libc::ENOSYS
    );
    assert_eq!(
        call(&s, &req(op::LOOKUP, 4, ROOT, b"abc"), 4096).unwrap().0,
        libc::EINVAL
    );
    let mut b = u32::MAX.to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 20]);
    assert_eq!(
        call(&s, &req(op::BATCH_FORGET, 5, 0, &b), 4096).unwrap().0,
        libc::EINVAL
    );
    assert_eq!(
        call(&s, &req(op::READ, 6, 2, &[0; 7]), 4096).unwrap().0,
        libc::EINVAL
    );
    // No room for even a header: the element is returned empty.
    assert_eq!(call(&s, &req(op::GETATTR, 7, ROOT, &[0; 16]), 8), None);
    // A reply larger than the guest's buffers: EIO, not an overrun.
    assert_eq!(
        call(&s, &req(op::GETATTR, 8, ROOT, &[0; 16]), 40)
            .unwrap()
            .0,
        libc::EIO
    );
    // Random requests: every opcode, random lengths and bytes.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20_000u64 {
        let opcode = (next() % 52) as u32;
        let n = (next() % 200) as usize;
        let mut body: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        if next() % 2 == 0 {
            body.push(0);
        }
        let mut r = req(opcode, i, next() % 4, &body);
        if next() % 8 == 0 {
            let l = (next() % 300) as u32;
            r[0..4].copy_from_slice(&l.to_le_bytes());
        }
        if opcode == op::DESTROY || opcode == op::INIT {
            continue;
        }
        let room = (next() % 5000) as usize;
        if let Some((e, _)) = call(&s, &r, room.max(16)) {
            assert!((0..4096).contains(&e), "errno {e} for opcode {opcode}");
        }
    }
}

/// A vhost-user server over a mirror of a fresh directory holding one
/// 1 MiB file of zeros, `data`, serving on its own thread.
struct Served {
    _dir: tempfile::TempDir,
    share: std::path::PathBuf,
    sock: std::path::PathBuf,
    stats: Arc<OpStats>,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

/// Starts a [`Served`] with options `o` and waits until it listens.
fn serve_mirror(o: super::VirtioOptions) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(share.join("data"), vec![0u8; 1 << 20]).unwrap();
    let fs =
        crate::open_backend(&format!("mirror:{}", share.display()), &Default::default()).unwrap();
    let sock = dir.path().join("s.sock");
    let server = super::Server::new(fs, &sock, &o).unwrap();
    let stats = server.stats.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || server.serve(move || tx.send(()).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    Served {
        _dir: dir,
        share,
        sock,
        stats,
        thread,
    }
}

/// The whole vhost-user path on the host: the benchmark driver (playing
/// the guest: shared memory, virtqueues, kicks and calls) against the
/// server, over a mirror directory; the data the driver writes lands in
/// the file, and the server ends cleanly when the driver disconnects.
#[test]
fn driver_and_server_talk_vhost_user() {
    use super::driver::{DriveOptions, Driver};
    let s = serve_mirror(super::VirtioOptions {
        thread_pool_size: 2,
        ..Default::default()
    });
    let (share, sock, stats, t) = (s.share, s.sock, s.stats, s.thread);
    // The server serves one connection: one run of writes at depth 8.
    let mut d = Driver::connect(&sock, "data", 8, 1).unwrap();
    let r = d
        .run(&DriveOptions {
            file: "data".into(),
            write: true,
            bs: 4096,
            depth: 8,
            span: 1 << 20,
            runtime: Duration::from_millis(300),
            verify: false,
        })
        .unwrap();
    assert!(r.ops > 0 && r.lat_p50_us > 0.0, "{r:?}");
    drop(d);
    // The driver writes 0x5a blocks at random 4k offsets.
    let data = std::fs::read(share.join("data")).unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert!(data.contains(&0x5a));
    assert!(data.chunks(4096).all(|c| c.iter().all(|&b| b == c[0])));
    t.join().unwrap().unwrap();
    assert!(stats.count(crate::stats::op("write")) > 0);
    assert!(!sock.exists());
}

/// Several request queues (a guest's `num-request-queues`): the driver
/// spreads writes and then reads over four queues of a server offering
/// four; each queue carries requests, every block lands at its own offset
/// (the driver checks each block it reads back, the test the host file).
#[test]
fn several_request_queues_each_carry_requests() {
    use super::driver::{DriveOptions, Driver};
    let s = serve_mirror(super::VirtioOptions {
        queues: 4,
        ..Default::default()
    });
    let (share, sock, stats, t) = (s.share, s.sock, s.stats, s.thread);
    let mut d = Driver::connect(&sock, "data", 16, 4).unwrap();
    let mut run = |write: bool| {
        d.run(&DriveOptions {
            file: "data".into(),
            write,
            bs: 4096,
            depth: 16,
            span: 1 << 20,
            runtime: Duration::from_millis(300),
            verify: true,
        })
        .unwrap()
    };
    let w = run(true);
    let r = run(false);
    for x in [&w, &r] {
        assert_eq!(x.per_queue.len(), 4);
        assert!(x.per_queue.iter().all(|&n| n > 0), "{x:?}");
        assert_eq!(x.per_queue.iter().sum::<u64>(), x.ops);
    }
    drop(d);
    let data = std::fs::read(share.join("data")).unwrap();
    let mut written = 0;
    for (i, c) in data.chunks(4096).enumerate() {
        if c.iter().all(|&b| b == 0) {
            continue;
        }
        written += 1;
        for (j, w) in c.chunks(8).enumerate() {
            let v = u64::from_le_bytes(w.try_into().unwrap());
            assert_eq!(v, (i * 4096 + j * 8) as u64, "block {i} word {j}");
        }
    }
    assert!(written > 0);
    t.join().unwrap().unwrap();
    assert!(stats.count(crate::stats::op("write")) >= w.ops);
    assert!(stats.count(crate::stats::op("read")) >= r.ops);
}
