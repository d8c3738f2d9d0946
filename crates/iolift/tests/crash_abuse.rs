//! Resources held under abuse: many clients that never read their replies
//! against a small server-wide in-flight budget (the server's memory stays
//! under the budget plus a fixed overhead), running out of file descriptors
//! (the server backs off, does not spin, and greets the waiting client once
//! a descriptor is free), and a FUA write to a read-only export (EPERM like
//! any other write there).
//!
//! The clients speak raw NBD (fixed newstyle, NBD_OPT_EXPORT_NAME, simple
//! replies), so that they can misbehave.

mod common;
use common::*;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLAG_FUA: u16 = 1;
const NBD_EPERM: u32 = 1;

/// Reads the server's greeting (NBDMAGIC IHAVEOPT flags); false if it does
/// not come within `t`.
fn greeted(s: &mut UnixStream, t: Duration) -> bool {
    s.set_read_timeout(Some(t)).unwrap();
    let mut g = [0u8; 18];
    let ok = s.read_exact(&mut g).is_ok();
    s.set_read_timeout(None).unwrap();
    if ok {
        assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT", "not an NBD greeting");
    }
    ok
}

/// Connects and negotiates the default export; returns the socket and the
/// transmission flags.
fn connect(sock: &Path) -> (UnixStream, u16) {
    let mut s = UnixStream::connect(sock).unwrap();
    assert!(greeted(&mut s, Duration::from_secs(10)), "no greeting");
    finish_handshake(&mut s)
}

/// After the greeting: client flags (fixed newstyle, no zeroes), then
/// NBD_OPT_EXPORT_NAME "".
fn finish_handshake(s: &mut UnixStream) -> (UnixStream, u16) {
    let mut m = Vec::new();
    m.extend_from_slice(&3u32.to_be_bytes());
    m.extend_from_slice(b"IHAVEOPT");
    m.extend_from_slice(&1u32.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&m).unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    let flags = u16::from_be_bytes([r[8], r[9]]);
    (s.try_clone().unwrap(), flags)
}

fn request(flags: u16, cmd: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&cmd.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// Reads one simple reply header: (error, cookie).
fn reply(s: &mut UnixStream) -> (u32, u64) {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(&h[..4], &0x6744_6698u32.to_be_bytes(), "simple reply magic");
    (
        u32::from_be_bytes(h[4..8].try_into().unwrap()),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    )
}

/// The server's resident memory, bytes.
fn rss(pid: u32) -> u64 {
    proc_mem(pid, "VmRSS")
}

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the ")" that ends the command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn slow_readers_stay_within_the_server_budget() {
    let _h = heavy();
    const CLIENTS: usize = 8;
    const READS: u64 = 48;
    const BUDGET: u64 = 16 << 20;
    let srv = ServerBuilder::iolift()
        // Reads complete on the blocking pool, so their replies queue up
        // behind a client that does not read (a memory backend's complete
        // at once and stall the reader on its socket instead).
        .backend("file:disk.img,size=512M")
        .args(["--max-inflight", "16M"])
        .start();
    let pid = srv.pid();
    // Some data to read back, then the baseline.
    {
        let (mut s, _) = connect(srv.socket());
        let data = vec![0x5au8; 1 << 20];
        for i in 0..4u64 {
            s.write_all(&request(0, CMD_WRITE, i, i << 20, 1 << 20))
                .unwrap();
            s.write_all(&data).unwrap();
            assert_eq!(reply(&mut s).0, 0);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let base = rss(pid);
    // Clients that ask for 48 MiB each and read nothing back.
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (mut s, _) = connect(srv.socket());
        let mut reqs = Vec::new();
        for i in 0..READS {
            reqs.extend(request(0, CMD_READ, i, (i % 64) << 20, 1 << 20));
        }
        s.write_all(&reqs).unwrap();
        clients.push(s);
    }
    let mut peak = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        peak = peak.max(rss(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    let grew = peak.saturating_sub(base);
    // Fixed overhead: receive chunks, tasks, allocator slack.
    let overhead = 40 << 20;
    assert!(
        grew <= BUDGET + overhead,
        "server RSS grew {} MiB with {CLIENTS} clients not reading (budget {} MiB + {} MiB)\n{}",
        grew >> 20,
        BUDGET >> 20,
        overhead >> 20,
        srv.stderr()
    );
    // Every request is still answered once the clients read.
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let mut seen = 0u64;
                for _ in 0..READS {
                    let (err, cookie) = reply(&mut s);
                    assert_eq!(err, 0);
                    s.read_exact(&mut buf).unwrap();
                    seen |= 1 << cookie;
                }
                seen
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().unwrap(), (1u64 << READS) - 1);
    }
}

#[test]
fn out_of_descriptors_backs_off_and_serves_the_waiting_client() {
    let _h = heavy();
    require_tool("prlimit");
    let srv = ServerBuilder::iolift().backend("memory:16M").start();
    let pid = srv.pid();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    // Room for three more descriptors.
    let limit = open + 3;
    run_ok(
        cmd("prlimit")
            .arg(format!("--pid={pid}"))
            .arg(format!("--nofile={limit}:{limit}")),
    );
    let mut held = Vec::new();
    let waiting = loop {
        let mut s = UnixStream::connect(srv.socket()).unwrap();
        if !greeted(&mut s, Duration::from_millis(700)) {
            break s;
        }
        held.push(s);
        assert!(
            held.len() <= 10,
            "10 clients greeted with {limit} descriptors"
        );
    };
    assert!(!held.is_empty(), "no client greeted at all");
    // Waiting without spinning: little CPU over a second.
    let c0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - c0;
    assert!(
        used <= 20,
        "server used {used} ticks in 1 s while out of descriptors"
    );
    // Free a descriptor: the waiting client is greeted.
    held.truncate(held.len() - 1);
    let mut waiting = waiting;
    assert!(
        greeted(&mut waiting, Duration::from_secs(5)),
        "the waiting client was not greeted after a descriptor was freed\n{}",
        srv.stderr()
    );
    let (mut w, _) = finish_handshake(&mut waiting);
    w.write_all(&request(0, CMD_READ, 7, 0, 4096)).unwrap();
    assert_eq!(reply(&mut w), (0, 7));
    let log = srv.stderr();
    let warned = log.matches("Too many open files").count();
    assert_eq!(warned, 1, "want one warning:\n{log}");
}

#[test]
fn fua_write_to_a_read_only_export_is_eperm() {
    let srv = ServerBuilder::iolift()
        .backend("memory:16M")
        .arg("--read-only")
        .start();
    let (mut s, flags) = connect(srv.socket());
    assert_ne!(flags & 2, 0, "export not read-only (flags {flags:#x})");
    let data = vec![1u8; 4096];
    for (cookie, f) in [(1u64, 0u16), (2, CMD_FLAG_FUA)] {
        s.write_all(&request(f, CMD_WRITE, cookie, 0, 4096))
            .unwrap();
        s.write_all(&data).unwrap();
        assert_eq!(reply(&mut s), (NBD_EPERM, cookie), "write flags {f}");
    }
    // The connection is still in order.
    s.write_all(&request(0, CMD_READ, 3, 0, 512)).unwrap();
    assert_eq!(reply(&mut s), (0, 3));
}

#[test]
fn bad_sizes_fail_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    for (args, want) in [
        (&["memory:0"][..], "SIZE \"0\" is zero"),
        (&["null:0"], "SIZE \"0\" is zero"),
        (&["memory: 1G"], "\" 1G\""),
        (&["memory:1G "], "\"1G \""),
        (
            &["--max-inflight", "0", "memory:1M"],
            "--max-inflight: 0 out of range",
        ),
        (&["--max-inflight", " 1G", "memory:1M"], "--max-inflight"),
    ] {
        let o = run_fail(
            std::process::Command::new(iolift_bin())
                .arg("serve")
                .arg("--socket")
                .arg(&sock)
                .args(args),
        );
        assert!(o.stderr.contains(want), "{args:?}: {}", o.stderr);
    }
}
