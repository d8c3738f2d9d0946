//! The `ec:` backend in a real `iolift serve`, through real NBD clients:
//! fio verify, nbdcopy and qemu-img compare against a reference copy,
//! while a child fails (the `error` stage), a backing file is deleted, m
//! children are lost, a chunk is corrupted on disk, the server is killed
//! -9 in the middle of writes; `iolift ec rebuild` restores redundancy.

mod common;
use common::*;

use iolift::backend::ec::layout::{Bitmap, Found, Super};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const CHILD: &str = "24M";

/// `ec:` over six files `s0.img`..`s5.img` in `dir` (k=4, m=2, 64K
/// chunks); `child(i)` may replace the spec of child i.
fn spec(dir: &Path, opts: &str, child: impl Fn(usize, String) -> String) -> String {
    let kids: Vec<String> = (0..6)
        .map(|i| child(i, format!("file:{}/s{i}.img+size={CHILD}", dir.display())))
        .collect();
    format!("ec:{},k=4,m=2,chunk=64K{opts}", kids.join(";"))
}

fn plain(dir: &Path, opts: &str) -> String {
    spec(dir, opts, |_, s| s)
}

fn serve(spec: &str, extra: &[&str]) -> Server {
    ServerBuilder::iolift().args(extra).backend(spec).start()
}

fn size_of(srv: &Server) -> u64 {
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    o.stdout.trim().parse().expect("nbdinfo --size")
}

/// A reference file of the export's size: random bytes, copied into the
/// export (flushed); the reference's path.
fn fill(srv: &Server, dir: &Path, seed: u64) -> PathBuf {
    let size = size_of(srv);
    let r = dir.join("ref.img");
    write_random_file(&r, size as usize, seed);
    run_ok(cmd("nbdcopy").args(["--flush", r.to_str().unwrap(), &srv.uri()]));
    r
}

fn same(r: &Path, srv: &Server) {
    assert!(
        qemu_img_compare(r, srv.uri()),
        "export differs from the reference\nserver: {}",
        srv.stderr()
    );
}

fn fio_verify(uri: &str, bs: &str, rw: &str, iodepth: u32, offset: &str, size: &str) {
    let o = run_ok(cmd("fio").args([
        "--name=ec",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        &format!("--rw={rw}"),
        &format!("--bs={bs}"),
        &format!("--iodepth={iodepth}"),
        &format!("--offset={offset}"),
        &format!("--size={size}"),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]));
    let all = o.all();
    assert!(
        !all.contains("verify: bad") && all.contains("err= 0"),
        "{all}"
    );
}

fn rebuild(spec: &str, check: bool) -> Out {
    let mut c = cmd(iolift_bin().to_str().unwrap());
    c.args(["ec", "rebuild"]);
    if check {
        c.arg("--check");
    }
    c.arg(spec);
    run_timeout(&mut c, Duration::from_secs(300))
}

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    r.split_once("\r\n\r\n").expect("HTTP reply").1.to_string()
}

/// The value of the first sample of `family`.
fn sample(body: &str, family: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(&format!("{family}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no {family} in:\n{body}"))
        .parse()
        .unwrap()
}

fn metrics_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

#[test]
fn healthy_fio_verify_and_compare() {
    let _g = heavy();
    require_tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let mut srv = serve(&plain(dir.path(), ""), &[]);
    let r = fill(&srv, dir.path(), 1);
    same(&r, &srv);
    // fio on the second half (random 4k at QD32, sequential 128k, odd
    // sizes), the first half still equal to the reference
    let size = size_of(&srv);
    let half = format!("{}", size / 2);
    let quarter = format!("{}", size / 4);
    fio_verify(&srv.uri(), "4k", "randwrite", 32, &half, &quarter);
    fio_verify(
        &srv.uri(),
        "128k",
        "write",
        8,
        &format!("{}", size * 3 / 4),
        &quarter,
    );
    fio_verify(&srv.uri(), "1536", "randwrite", 4, &half, "2M");
    srv.stop();
    let o = rebuild(&plain(dir.path(), ""), true);
    assert!(o.status.success(), "{}", o.report());
    assert!(
        o.stdout
            .contains("0 unreadable, 0 with parity not matching data"),
        "{}",
        o.report()
    );
    let srv = serve(&plain(dir.path(), ""), &[]);
    let out = dir.path().join("out.img");
    run_ok(cmd("nbdcopy").args([&srv.uri(), out.to_str().unwrap()]));
    let (a, b) = (std::fs::read(&r).unwrap(), std::fs::read(&out).unwrap());
    assert!(
        a[..size as usize / 2] == b[..size as usize / 2],
        "first half changed"
    );
}

#[test]
fn a_child_returning_errors_is_dropped() {
    let _g = heavy();
    require_tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let mut srv = serve(&plain(dir.path(), ""), &[]);
    let r = fill(&srv, dir.path(), 2);
    srv.stop();
    // child 1 now fails every read and write after its 3rd request
    let bad = spec(dir.path(), ",rebuild=off", |i, s| {
        if i == 1 {
            format!("error:after=3>{s}")
        } else {
            s
        }
    });
    let addr = metrics_addr();
    let srv = serve(&bad, &["--metrics", &addr]);
    same(&r, &srv);
    let size = size_of(&srv);
    fio_verify(
        &srv.uri(),
        "64k",
        "randwrite",
        16,
        &format!("{}", size / 2),
        "8M",
    );
    let m = scrape(&addr);
    assert_eq!(sample(&m, "iolift_ec_children_failed"), 1.0, "{m}");
    assert!(sample(&m, "iolift_ec_decoded_reads_total") > 0.0, "{m}");
    assert!(sample(&m, "iolift_ec_degraded_stripes") > 0.0, "{m}");
}

#[test]
fn deleted_file_is_rebuilt_online_while_io_continues() {
    let _g = heavy();
    require_tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let s = plain(dir.path(), "");
    let mut srv = serve(&s, &[]);
    let r = fill(&srv, dir.path(), 3);
    srv.stop();
    std::fs::remove_file(dir.path().join("s2.img")).unwrap();
    // the file backend creates a new, empty s2.img: not a member, rebuilt
    // in the background from the first request on, while we read and write
    let addr = metrics_addr();
    let mut srv = serve(&s, &["--metrics", &addr]);
    same(&r, &srv);
    let size = size_of(&srv);
    fio_verify(
        &srv.uri(),
        "4k",
        "randwrite",
        32,
        &format!("{}", size / 2),
        "4M",
    );
    let mut m = scrape(&addr);
    for _ in 0..600 {
        if sample(&m, "iolift_ec_children_failed") == 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        m = scrape(&addr);
    }
    assert_eq!(
        sample(&m, "iolift_ec_children_failed"),
        0.0,
        "rebuild did not finish: {m}"
    );
    assert_eq!(sample(&m, "iolift_ec_degraded_stripes"), 0.0, "{m}");
    assert!(
        sample(&m, "iolift_ec_rebuilt_bytes_total") >= (size / 4) as f64,
        "{m}"
    );
    srv.stop();
    // full redundancy: lose two other children, everything still reads
    let o = rebuild(&s, true);
    assert!(
        o.status.success() && o.stdout.contains("no child needs"),
        "{}",
        o.report()
    );
    let out = dir.path().join("out.img");
    {
        let srv = serve(&s, &[]);
        run_ok(cmd("nbdcopy").args([&srv.uri(), out.to_str().unwrap()]));
    }
    for f in ["s0.img", "s5.img"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    let srv = serve(&plain(dir.path(), ",rebuild=off"), &[]);
    same(&out, &srv);
}

#[test]
fn m_children_lost_then_offline_rebuild_restores_redundancy() {
    let _g = heavy();
    let dir = tempfile::tempdir().unwrap();
    let s = plain(dir.path(), ",rebuild=off");
    let mut srv = serve(&s, &[]);
    let r = fill(&srv, dir.path(), 4);
    srv.stop();
    for f in ["s0.img", "s3.img"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    let mut srv = serve(&s, &[]);
    same(&r, &srv);
    srv.stop();
    // a third loss is one too many: refused at start, naming them
    std::fs::rename(dir.path().join("s4.img"), dir.path().join("s4.bak")).unwrap();
    let mut c = cmd(iolift_bin().to_str().unwrap());
    c.args([
        "serve",
        "--socket",
        dir.path().join("x.sock").to_str().unwrap(),
        &s,
    ]);
    let o = run_fail(&mut c);
    assert!(o.all().contains("at most m=2"), "{}", o.report());
    std::fs::rename(dir.path().join("s4.bak"), dir.path().join("s4.img")).unwrap();
    // offline rebuild of the two, checked
    let o = rebuild(&s, true);
    assert!(o.status.success(), "{}", o.report());
    assert!(
        o.stdout.contains("ec rebuild: children [0, 3]"),
        "{}",
        o.report()
    );
    assert!(
        o.stdout
            .contains("0 unreadable, 0 with parity not matching data"),
        "{}",
        o.report()
    );
    // then lose two others: the rebuilt children carry the data
    for f in ["s1.img", "s2.img"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    let srv = serve(&s, &[]);
    same(&r, &srv);
}

fn superblock(p: &Path) -> Super {
    let mut b = vec![0u8; 4096];
    std::fs::File::open(p).unwrap().read_exact(&mut b).unwrap();
    match Super::decode(&b) {
        Found::Super(s) => s,
        f => panic!("{}: {f:?}", p.display()),
    }
}

#[test]
fn corrupt_chunk_is_caught_and_repaired() {
    let _g = heavy();
    let dir = tempfile::tempdir().unwrap();
    let s = plain(dir.path(), "");
    let mut srv = serve(&s, &[]);
    let r = fill(&srv, dir.path(), 5);
    srv.stop();
    // flip bytes in data chunk 1 of stripe 7 and in parity chunk 4 of
    // stripe 9, on disk
    let mut saved = Vec::new();
    for (c, stripe) in [(1usize, 7u64), (4, 9)] {
        let p = dir.path().join(format!("s{c}.img"));
        let at = superblock(&p).geo.chunk_off(stripe) as usize + 5000;
        let mut img = std::fs::read(&p).unwrap();
        saved.push((p.clone(), at, img[at..at + 64].to_vec()));
        for b in &mut img[at..at + 64] {
            *b ^= 0xff;
        }
        std::fs::write(&p, &img).unwrap();
    }
    let addr = metrics_addr();
    let mut srv = serve(&s, &["--metrics", &addr]);
    same(&r, &srv);
    let m = scrape(&addr);
    assert_eq!(sample(&m, "iolift_ec_crc_errors_total"), 1.0, "{m}");
    assert_eq!(sample(&m, "iolift_ec_repairs_total"), 1.0, "{m}");
    srv.stop();
    // the data chunk was repaired by the read; the check finds and
    // repairs the parity one
    let (p, at, orig) = &saved[0];
    assert_eq!(
        &std::fs::read(p).unwrap()[*at..*at + 64],
        &orig[..],
        "not repaired"
    );
    let o = rebuild(&s, true);
    assert!(o.status.success(), "{}", o.report());
    assert!(o.stdout.contains("1 chunk crc errors"), "{}", o.report());
    let (p, at, orig) = &saved[1];
    assert_eq!(
        &std::fs::read(p).unwrap()[*at..*at + 64],
        &orig[..],
        "parity not repaired"
    );
}

/// Whether child 0's write-intent bitmap has a dirty region.
fn dirty_regions(dir: &Path) -> bool {
    let p = dir.join("s0.img");
    let sb = superblock(&p);
    let mut b = vec![0u8; 4096];
    let mut file = std::fs::File::open(&p).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(sb.geo.bitmap_off())).unwrap();
    file.read_exact(&mut b).unwrap();
    let bm = Bitmap::decode(&b, sb.uuid).expect("an intact bitmap on child 0");
    bm.bits.iter().any(|&w| w != 0)
}

#[test]
fn kill9_during_writes_keeps_flushed_data_and_every_stripe_decodes() {
    let _g = heavy();
    require_tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let s = plain(dir.path(), "");
    for round in 0..3u64 {
        let mut srv = serve(&s, &[]);
        let size = size_of(&srv);
        let r = if round == 0 {
            fill(&srv, dir.path(), 6)
        } else {
            dir.path().join("ref.img")
        };
        // unflushed writes into the second half, killed in the middle
        let mut f = cmd("fio")
            .args([
                "--name=crash",
                "--ioengine=nbd",
                &format!("--uri={}", srv.uri()),
                "--rw=randwrite",
                "--bsrange=4k-512k",
                "--iodepth=32",
                &format!("--offset={}", size / 2),
                "--time_based",
                "--runtime=30",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500 + 700 * round));
        // kill once unflushed updates have left dirty regions in the
        // write-intent bitmap (fio may start slowly on a busy machine)
        for _ in 0..300 {
            if dirty_regions(dir.path()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        srv.kill9();
        let _ = f.kill();
        let _ = f.wait();
        // the next open resyncs the dirty regions
        assert!(
            dirty_regions(dir.path()),
            "round {round}: no dirty region after the kill"
        );
        // every stripe decodes, parity matches data
        let o = rebuild(&s, true);
        assert!(o.status.success(), "round {round}: {}", o.report());
        assert!(
            o.stdout
                .contains("0 unreadable, 0 with parity not matching data"),
            "round {round}: {}",
            o.report()
        );
        // the flushed first half is intact
        let srv = serve(&s, &[]);
        let out = dir.path().join("out.img");
        run_ok(cmd("nbdcopy").args([&srv.uri(), out.to_str().unwrap()]));
        let (a, b) = (std::fs::read(&r).unwrap(), std::fs::read(&out).unwrap());
        let h = size as usize / 2;
        assert!(a[..h] == b[..h], "round {round}: flushed data changed");
        assert!(a[h..] != b[h..], "round {round}: the writes did not happen");
        std::fs::remove_file(&out).unwrap();
    }
}

/// `device=gpu` routes whole-chunk stripes to the offload engine's I/O
/// pool; `IOLIFT_EC_GPU_DEVICE=cpu` runs that pool on the offload
/// engine's CPU device, so the route is exercised without a GPU.
#[test]
fn device_gpu_encodes_through_the_offload_pool() {
    let _g = heavy();
    require_tool("fio");
    let dir = tempfile::tempdir().unwrap();
    let s = plain(dir.path(), ",device=gpu");
    let addr = metrics_addr();
    let mut srv = ServerBuilder::iolift()
        .env("IOLIFT_EC_GPU_DEVICE", "cpu")
        .args(["--metrics", &addr])
        .backend(&s)
        .start();
    let r = fill(&srv, dir.path(), 7);
    same(&r, &srv);
    let size = size_of(&srv);
    fio_verify(
        &srv.uri(),
        "256k",
        "randwrite",
        32,
        &format!("{}", size / 2),
        "8M",
    );
    let m = scrape(&addr);
    assert!(
        sample(&m, "iolift_ec_offloaded_stripes_total") >= (size / (256 << 10)) as f64,
        "{m}"
    );
    srv.stop();
    // the parity the pool computed is the codec's: the CPU check agrees
    let o = rebuild(&plain(dir.path(), ""), true);
    assert!(
        o.stdout
            .contains("0 unreadable, 0 with parity not matching data"),
        "{}",
        o.report()
    );
}
