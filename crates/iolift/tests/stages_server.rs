//! Stages in a real `iolift serve`: fio verify through cache + scheduler on
//! the file backend, kill -9 durability of flushed/FUA data, the
//! `--metrics` endpoint, the cache's memory against its size.

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// fio writes with crc32c verification through a write-back cache and the
/// scheduler over a file, several connections at queue depth 32, then a
/// mixed random read/write job; fio checks every block it reads back.
#[test]
fn fio_verify_through_cache_and_scheduler_on_file() {
    let _g = heavy();
    require_tool("fio");
    let mut b = ServerBuilder::iolift();
    let img = b.dir().join("disk.img");
    let srv = b
        .args(["--stage", "cache:size=8M,block=4k"])
        .args(["--stage", "scheduler"])
        .backend(&format!("file:{},size=256M", img.display()))
        .start();
    fio_randwrite_verify(&srv.uri(), 32, 4, "16M", "32M");
    // Sequential bigger blocks (merged by the scheduler, larger than the
    // cache's dirty limit) and a mixed job.
    run_ok(cmd("fio").args([
        "--name=seq",
        "--ioengine=nbd",
        &format!("--uri={}", srv.uri()),
        "--rw=write",
        "--bs=64k",
        "--iodepth=16",
        "--size=48M",
        "--offset=128M",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]));
    run_ok(cmd("fio").args([
        "--name=mixed",
        "--ioengine=nbd",
        &format!("--uri={}", srv.uri()),
        "--rw=randrw",
        "--bsrange=512-128k",
        "--iodepth=32",
        "--numjobs=2",
        "--size=12M",
        "--offset=192M",
        "--offset_increment=16M",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]));
}

/// Writes through python3-libnbd (many writes in flight, some FUA, some
/// partial cache blocks), flushes, keeps writing, kills the server with
/// SIGKILL, and checks the file: every block holds its value as of the last
/// acknowledged flush or FUA write, or a value written after that.
const KILL_SCRIPT: &str = r#"
import nbd, os, random, signal, sys, time
uri, pid, path, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
BS = 4096
NB = 1024              # 4 MiB region
rnd = random.Random(seed)

def pat(tag):
    r = random.Random(tag)
    return tag.to_bytes(8, 'little') + r.randbytes(BS - 8)

def decode(b):
    if b == bytes(BS):
        return 0
    tag = int.from_bytes(b[:8], 'little')
    if b != pat(tag):
        return None
    return tag

with open(path, 'rb') as f:
    init = f.read(NB * BS)
durable = [decode(init[i*BS:(i+1)*BS]) for i in range(NB)]
assert all(d is not None for d in durable), "garbage in the file before the round"
since = [set() for _ in range(NB)]
latest = list(durable)

h = nbd.NBD()
h.connect_uri(uri)
assert h.can_fua() and h.can_flush()
next_tag = seed * 1000000 + 1

def batch(n, fua_share):
    """n writes of 1-6 blocks in flight at once; returns [(blocks, tag, fua)]."""
    global next_tag
    used = set()
    cmds = []
    for _ in range(n):
        ln = rnd.randint(1, 6)
        s = rnd.randrange(0, NB - ln)
        blocks = list(range(s, s + ln))
        if used.intersection(blocks):
            continue
        used.update(blocks)
        tags = []
        data = b''
        for b in blocks:
            tags.append(next_tag)
            data += pat(next_tag)
            next_tag += 1
        fua = rnd.random() < fua_share
        for b, t in zip(blocks, tags):
            since[b].add(t)
        c = h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data)), s * BS,
                         flags=nbd.CMD_FLAG_FUA if fua else 0)
        cmds.append((c, blocks, tags, fua))
    return cmds

def wait_all(cmds):
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for c, blocks, tags, fua in cmds:
        h.aio_command_completed(c)   # raises on error
        for b, t in zip(blocks, tags):
            latest[b] = t
            if fua:
                # Stable now; anything written later may also have landed.
                durable[b] = t
                since[b] = set()

rounds = rnd.randint(3, 6)
for r in range(rounds):
    for _ in range(rnd.randint(1, 4)):
        wait_all(batch(rnd.randint(4, 40), 0.1))
    h.flush()
    for b in range(NB):
        durable[b] = latest[b]
        since[b] = set()
# Acknowledged but unflushed writes, then writes still in flight.
wait_all(batch(30, 0.2))
batch(30, 0.0)
os.kill(pid, signal.SIGKILL)
for _ in range(500):
    try:
        with open('/proc/%d/stat' % pid) as f:
            st = f.read().rsplit(')', 1)[1].split()[0]
        if st in ('Z', 'X'):
            break
    except FileNotFoundError:
        break
    time.sleep(0.01)
with open(path, 'rb') as f:
    got = f.read(NB * BS)
bad = []
for b in range(NB):
    v = decode(got[b*BS:(b+1)*BS])
    if v is None or (v != durable[b] and v not in since[b]):
        bad.append((b, v, durable[b], sorted(since[b])[:4]))
if bad:
    print("LOST %d blocks, e.g. (block, found, durable, later):" % len(bad), bad[:8])
    sys.exit(1)
print("ok: %d blocks checked, %d flush rounds" % (NB, rounds))
"#;

#[test]
fn kill9_keeps_flushed_and_fua_data() {
    let py = python3_nbd();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let script = dir.path().join("kill.py");
    std::fs::write(&script, KILL_SCRIPT).unwrap();
    for round in 0..4u64 {
        let mut srv = ServerBuilder::iolift()
            .args([
                "--stage",
                "cache:size=2M,block=16k,dirty_limit=1536k,dirty_target=1M,max_age=10s",
            ])
            .args(["--stage", "scheduler"])
            .backend(&format!("file:{},size=8M", img.display()))
            .start();
        let out = run_timeout(
            std::process::Command::new(&py).args([
                script.to_str().unwrap(),
                &srv.uri(),
                &srv.pid().to_string(),
                img.to_str().unwrap(),
                &(round + 1).to_string(),
            ]),
            Duration::from_secs(120),
        );
        let st = srv.wait_exit(Duration::from_secs(10));
        assert!(
            out.status.success(),
            "round {round}: {}\nserver: {}",
            out.all(),
            srv.stderr()
        );
        assert!(st.is_some(), "round {round}: server not killed");
    }
}

fn scrape(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").expect("HTTP reply");
    (head.to_string(), body.to_string())
}

/// The value of the sample `name{labels}` in a Prometheus text body.
fn sample(body: &str, key: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {key} in:\n{body}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn metrics_endpoint_counts_io() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut b = ServerBuilder::iolift();
    let src = b.dir().join("src.bin");
    write_random_file(&src, 8 << 20, 11);
    let srv = b
        .args(["--metrics", &addr])
        .args(["--stage", "stats:name=top"])
        .args(["--stage", "cache:size=4M,name=c1"])
        .args(["--stage", "scheduler:name=s1"])
        .args(["--stage", "stats:name=bottom"])
        .backend("memory:64M")
        .start();
    let (head, before) = scrape(&addr, "/metrics");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let w0 = sample(
        &before,
        "iolift_stats_requests_total{stage=\"stats\",instance=\"top\",op=\"write\"}",
    );
    run_ok(cmd("nbdcopy").arg("--flush").arg(&src).arg(srv.uri()));
    let dst = srv.dir().join("dst.bin");
    run_ok(cmd("nbdcopy").arg(srv.uri()).arg(&dst));
    let (_, after) = scrape(&addr, "/metrics");
    let w1 = sample(
        &after,
        "iolift_stats_requests_total{stage=\"stats\",instance=\"top\",op=\"write\"}",
    );
    assert!(w1 > w0, "top writes did not move: {w0} -> {w1}");
    let wb = sample(
        &after,
        "iolift_stats_bytes_total{stage=\"stats\",instance=\"top\",op=\"write\"}",
    );
    assert!(wb >= (8 << 20) as f64, "top write bytes {wb}");
    let rb = sample(
        &after,
        "iolift_stats_bytes_total{stage=\"stats\",instance=\"top\",op=\"read\"}",
    );
    assert!(rb >= (8 << 20) as f64, "top read bytes {rb}");
    assert!(
        sample(
            &after,
            "iolift_stats_requests_total{stage=\"stats\",instance=\"top\",op=\"flush\"}"
        ) >= 1.0
    );
    assert!(
        sample(
            &after,
            "iolift_stats_latency_seconds_count{stage=\"stats\",instance=\"top\",op=\"write\"}"
        ) >= w1
    );
    assert!(
        sample(
            &after,
            "iolift_sched_requests_total{stage=\"scheduler\",instance=\"s1\"}"
        ) > 0.0
    );
    assert!(
        sample(
            &after,
            "iolift_cache_writebacks_total{stage=\"cache\",instance=\"c1\"}"
        ) > 0.0
    );
    // Writes below the cache are write-backs: no more than the writes above.
    let wbot = sample(
        &after,
        "iolift_stats_requests_total{stage=\"stats\",instance=\"bottom\",op=\"write\"}",
    );
    assert!(wbot > 0.0 && wbot <= w1, "bottom writes {wbot}, top {w1}");
    // Each family has its HELP/TYPE once.
    for fam in [
        "iolift_stats_requests_total",
        "iolift_cache_hits_total",
        "iolift_sched_merged_requests_total",
    ] {
        let n = after.matches(&format!("# TYPE {fam} ")).count();
        assert_eq!(n, 1, "{fam}: {n} TYPE lines");
    }
    let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    assert!(
        b.len() >= a.len() && a[..] == b[..a.len()],
        "data read back differs"
    );
    let (head, _) = scrape(&addr, "/nope");
    assert!(head.starts_with("HTTP/1.0 404"), "{head}");
}

/// The cache holds its budget under load: 128 MiB written and then read
/// through `cache:size=16M` over a file raise the server's peak resident
/// size (VmHWM) by at most the 16 MiB plus a fixed overhead (the buffers
/// of the requests in flight, the runtime's threads, allocator slack); the
/// same load through `cache:size=112M` raises it by more than 80 MiB, so
/// the measurement does see a cache's blocks.
#[test]
fn the_cache_stage_stays_within_its_size() {
    let _g = heavy();
    require_tool("fio");
    const OVERHEAD: u64 = 32 << 20;
    let grew = |size: &str| -> u64 {
        let mut b = ServerBuilder::iolift();
        let img = b.dir().join("disk.img");
        let srv = b
            .args(["--stage", &format!("cache:size={size},block=4k")])
            .backend(&format!("file:{},size=256M", img.display()))
            .start();
        let base = proc_mem(srv.pid(), "VmRSS");
        for rw in ["write", "read"] {
            run_ok(cmd("fio").args([
                &format!("--name={rw}"),
                "--ioengine=nbd",
                &format!("--uri={}", srv.uri()),
                &format!("--rw={rw}"),
                "--bs=128k",
                "--iodepth=4",
                "--size=128M",
            ]));
        }
        let peak = proc_mem(srv.pid(), "VmHWM");
        println!(
            "cache:size={size}: RSS {} MiB at start, peak {} MiB",
            base >> 20,
            peak >> 20
        );
        peak.saturating_sub(base)
    };
    let small = grew("16M");
    assert!(
        small <= (16 << 20) + OVERHEAD,
        "cache:size=16M grew the server by {} MiB (budget 16 MiB + {} MiB)",
        small >> 20,
        OVERHEAD >> 20
    );
    let large = grew("112M");
    assert!(
        large > 80 << 20,
        "cache:size=112M grew the server by only {} MiB: the measurement misses the cache",
        large >> 20
    );
}

#[test]
fn bad_stage_and_metrics_args_fail_cleanly() {
    for (args, want) in [
        (vec!["--stage", "cache:size=1Q"], "size"),
        (vec!["--stage", "scheduler:max_delay=fast"], "max_delay"),
        (vec!["--stage", "frob"], "frob"),
        (vec!["--metrics", "256.0.0.1:99999"], "metrics"),
    ] {
        let mut b = ServerBuilder::iolift()
            .args(args.clone())
            .backend("memory:16M");
        let (mut c, _) = b.command();
        let o = run_timeout(&mut c, Duration::from_secs(30));
        assert!(!o.status.success(), "{args:?} accepted");
        assert!(o.all().contains(want), "{args:?}: {}", o.all());
    }
}
