//! `iolift serve` driven by real NBD clients: nbdinfo, nbdcopy, qemu-img,
//! qemu-io, fio (ioengine=nbd). Tests that start their server with
//! `ServerBuilder::peer()` also run against nbdkit with
//! `IOLIFT_TEST_PEER=nbdkit` (a check of the tests themselves).

mod common;
use common::*;
use std::fs;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// The export objects of `nbdinfo --json` / `--list --json` output, as text
/// slices, each starting at its `"export-name"`.
fn json_exports(out: &str) -> Vec<&str> {
    out.split("\"export-name\"").skip(1).collect()
}

/// The raw value of `"key": value` in a JSON object text (no nesting).
fn json_val<'a>(obj: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\":");
    let i = obj.find(&pat)? + pat.len();
    let rest = obj[i..].trim_start();
    let end = rest.find([',', '\n', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim().trim_matches('"'))
}

fn json_bool(obj: &str, key: &str) -> bool {
    match json_val(obj, key) {
        Some("true") => true,
        Some("false") => false,
        v => panic!("nbdinfo: {key} is {v:?} in\n{obj}"),
    }
}

fn json_u64(obj: &str, key: &str) -> u64 {
    json_val(obj, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("nbdinfo: no numeric {key} in\n{obj}"))
}

fn export_name(obj: &str) -> &str {
    // obj starts right after "export-name"
    let rest = obj.trim_start_matches([':', ' ']);
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    &rest[..rest.find('"').unwrap_or(0)]
}

#[test]
fn nbdinfo_size_flags_contexts_block_sizes() {
    let srv = ServerBuilder::peer().backend("memory:1G").start();
    let o = run_ok(cmd("nbdinfo").args(["--json", &srv.uri()]));
    let ex = json_exports(&o.stdout);
    assert_eq!(ex.len(), 1, "{}", o.stdout);
    let e = ex[0];
    assert_eq!(json_u64(e, "export-size"), 1 << 30);
    assert!(o.stdout.contains("\"protocol\": \"newstyle-fixed\""));
    assert!(o.stdout.contains("\"structured\": true"));
    assert!(!json_bool(e, "is_read_only"));
    for f in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_cache",
        "can_multi_conn",
    ] {
        assert!(json_bool(e, f), "{f} not advertised:\n{e}");
    }
    assert!(
        e.contains("\"base:allocation\""),
        "no base:allocation context:\n{e}"
    );
    if srv.peer() == Peer::Iolift {
        let (mn, pref, mx) = (
            json_u64(e, "block_size_minimum"),
            json_u64(e, "block_size_preferred"),
            json_u64(e, "block_size_maximum"),
        );
        assert!(mn >= 1 && pref >= mn && mx >= pref, "{mn} {pref} {mx}");
        assert_eq!(mx, 32 * MIB, "default --max-request is 32M");
    }
    // the one-value forms agree
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    assert_eq!(o.stdout.trim(), (1u64 << 30).to_string());
    run_ok(cmd("nbdinfo").args(["--can", "multi-conn", &srv.uri()]));
    run_fail(cmd("nbdinfo").args(["--is", "read-only", &srv.uri()]));
}

#[test]
fn default_serve_is_a_sparse_1g_file_and_prints_how_to_connect() {
    // `iolift serve` with no backend: the README's first command.
    let srv = ServerBuilder::iolift().start();
    let img = srv.dir().join("iolift-disk.img");
    let m = fs::metadata(&img).expect("iolift-disk.img created in the cwd");
    assert_eq!(m.len(), 1 << 30);
    use std::os::unix::fs::MetadataExt;
    assert!(
        m.blocks() * 512 < 16 * MIB,
        "default image not sparse: {} blocks",
        m.blocks()
    );
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    assert_eq!(o.stdout.trim(), (1u64 << 30).to_string());
    let log = srv.stderr();
    let sock = srv.socket().display().to_string();
    for hint in ["nbdinfo", "qemu-img", "nbd-client", sock.as_str()] {
        assert!(log.contains(hint), "startup output lacks {hint:?}:\n{log}");
    }
}

#[test]
fn nbdinfo_lists_named_exports_with_their_sizes() {
    let srv = ServerBuilder::iolift()
        .args(["-e", "alpha=memory:16M", "-e", "beta=null:3G"])
        .backend("memory:1G")
        .start();
    let o = run_ok(cmd("nbdinfo").args(["--list", "--json", &srv.uri()]));
    let mut got: Vec<(String, u64)> = json_exports(&o.stdout)
        .into_iter()
        .map(|e| (export_name(e).to_string(), json_u64(e, "export-size")))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (String::new(), 1 << 30),
            ("alpha".into(), 16 * MIB),
            ("beta".into(), 3 << 30)
        ],
        "{}",
        o.stdout
    );
    // each export answers by name, over unix
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri_named("alpha")]));
    assert_eq!(o.stdout.trim(), (16 * MIB).to_string());
    // an unknown name is refused
    let o = run_fail(cmd("nbdinfo").args(["--size", &srv.uri_named("gamma")]));
    assert!(o.stderr.contains("no export named 'gamma'"), "{}", o.all());
}

#[test]
fn default_export_flag_answers_the_empty_name() {
    let srv = ServerBuilder::iolift()
        .args([
            "-e",
            "small=memory:8M",
            "-e",
            "big=memory:64M",
            "--default-export",
            "big",
        ])
        .start();
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    assert_eq!(o.stdout.trim(), (64 * MIB).to_string());
}

#[test]
fn read_only_flag_is_advertised_and_enforced() {
    let srv = ServerBuilder::iolift()
        .arg("--read-only")
        .backend("memory:16M")
        .start();
    run_ok(cmd("nbdinfo").args(["--is", "read-only", &srv.uri()]));
    let o = run_ok(cmd("nbdinfo").args(["--json", &srv.uri()]));
    let e = json_exports(&o.stdout)[0];
    assert!(json_bool(e, "is_read_only"));
    assert!(!json_bool(e, "can_trim"), "read-only export offers TRIM");
    assert!(
        !json_bool(e, "can_zero"),
        "read-only export offers WRITE_ZEROES"
    );
    // qemu-io write must fail
    let o = run_timeout(
        cmd("qemu-io").args(["-f", "raw", &srv.uri(), "-c", "write -P 0x11 0 64k"]),
        CMD_TIMEOUT,
    );
    assert!(
        !o.status.success() || o.all().contains("denied") || o.all().contains("read-only"),
        "write to a read-only export did not fail:\n{}",
        o.all()
    );
}

#[test]
fn tcp_and_unix_listeners_serve_the_same_export() {
    let srv = ServerBuilder::iolift().tcp().backend("memory:32M").start();
    let data = srv.dir().join("in.bin");
    write_random_file(&data, 4 * MIB as usize, 3);
    // write over TCP, read over unix
    run_ok(cmd("nbdcopy").args([data.to_str().unwrap(), &srv.tcp_uri("")]));
    let out = srv.dir().join("out.bin");
    run_ok(cmd("nbdcopy").args([&srv.unix_uri(""), out.to_str().unwrap()]));
    let got = fs::read(&out).unwrap();
    assert_eq!(got.len() as u64, 32 * MIB);
    assert_eq!(&got[..4 * MIB as usize], &fs::read(&data).unwrap()[..]);
    assert!(got[4 * MIB as usize..].iter().all(|&b| b == 0));
}

#[test]
fn tcp_only_server() {
    let srv = ServerBuilder::peer().tcp_only().backend("null:2G").start();
    assert!(srv.uri().starts_with("nbd://127.0.0.1:"));
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    assert_eq!(o.stdout.trim(), (2u64 << 30).to_string());
}

#[test]
fn nbdcopy_round_trip_checksums() {
    let _g = heavy();
    let srv = ServerBuilder::peer().backend("memory:64M").start();
    let src = srv.dir().join("src.bin");
    write_random_file(&src, 64 * MIB as usize, 42);
    run_ok(cmd("nbdcopy").args([src.to_str().unwrap(), &srv.uri()]));
    let dst = srv.dir().join("dst.bin");
    run_ok(cmd("nbdcopy").args([&srv.uri(), dst.to_str().unwrap()]));
    assert_eq!(sha256_file(&src), sha256_file(&dst));
    // single connection, no extents: the plain read path
    let dst2 = srv.dir().join("dst2.bin");
    run_ok(cmd("nbdcopy").args([
        "-C",
        "1",
        "--no-extents",
        &srv.uri(),
        dst2.to_str().unwrap(),
    ]));
    assert_eq!(sha256_file(&src), sha256_file(&dst2));
}

#[test]
fn nbdcopy_between_two_exports() {
    let _g = heavy();
    let mut b = ServerBuilder::iolift();
    let disk = b.dir().join("b.img");
    let srv = b
        .args([
            "-e",
            "a=memory:48M",
            "-e",
            &format!("b=file:{},size=48M", disk.display()),
        ])
        .start();
    let src = srv.dir().join("src.bin");
    // half data, half zeros: extents + zero requests on the way
    let mut v = random_bytes(24 * MIB as usize, 9);
    v.resize(48 * MIB as usize, 0);
    fs::write(&src, &v).unwrap();
    run_ok(cmd("nbdcopy").args([src.to_str().unwrap(), &srv.uri_named("a")]));
    run_ok(cmd("nbdcopy").args([&srv.uri_named("a"), &srv.uri_named("b")]));
    let out = srv.dir().join("out.bin");
    run_ok(cmd("nbdcopy").args([&srv.uri_named("b"), out.to_str().unwrap()]));
    assert_eq!(sha256_file(&src), sha256_file(&out));
    // and the file backend holds the same bytes
    assert_eq!(sha256_file(&src), sha256_file(&disk));
}

#[test]
fn qemu_img_convert_and_compare() {
    let srv = ServerBuilder::peer().backend("memory:32M").start();
    let img = srv.dir().join("img.raw");
    write_random_file(&img, 32 * MIB as usize, 77);
    qemu_img_convert(&img, srv.uri());
    assert!(
        qemu_img_compare(&img, srv.uri()),
        "qemu-img compare: the export differs from what was converted onto it"
    );
    // change one byte through the server: compare must now see a difference
    run_ok(cmd("qemu-io").args(["-f", "raw", &srv.uri(), "-c", "write -P 0x00 1048577 1"]));
    assert!(
        !qemu_img_compare(&img, srv.uri()),
        "compare should report a difference"
    );
    // qemu-img info sees the size
    let o = run_ok(cmd("qemu-img").args(["info", "--output=json", &srv.uri()]));
    assert!(
        o.stdout.contains("\"virtual-size\": 33554432"),
        "{}",
        o.stdout
    );
}

/// Runs qemu-io commands against `uri`; fails on any command error or
/// pattern mismatch.
fn qemu_io(uri: &str, cmds: &[&str]) -> Out {
    let mut c = cmd("qemu-io");
    c.args(["-f", "raw", uri]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let o = run_ok(&mut c);
    for bad in ["Pattern verification failed", "failed", "error", "Error"] {
        assert!(
            !o.all().contains(bad),
            "qemu-io reported {bad:?}:\n{}",
            o.all()
        );
    }
    o
}

#[test]
fn qemu_io_patterns_zero_discard() {
    let srv = ServerBuilder::peer().backend("memory:64M").start();
    let u = srv.uri();
    qemu_io(
        &u,
        &[
            "write -P 0xab 0 1M",
            "write -P 0xcd 1M 1M",
            "write -P 0xef 2M 1M",
            "aio_write -P 0x5a 8M 64k",
            "aio_write -P 0xa5 9M 64k",
            "aio_flush",
            "flush",
        ],
    );
    // a new connection sees the same bytes; unaligned reads
    qemu_io(
        &u,
        &[
            "read -P 0xab 0 1M",
            "read -P 0xcd 1M 1M",
            "read -P 0xef 2M 1M",
            "read -P 0xab 1000 3000",
            "read -P 0x5a 8M 64k",
            "read -P 0xa5 9M 64k",
            "read -P 0 3M 1M",
        ],
    );
    // write-zeroes (with and without unmap), discard, FUA write
    qemu_io(
        &u,
        &[
            "write -z 1M 512k",
            "write -z -u 2M 512k",
            "discard 8M 64k",
            "write -f -P 0x77 16M 128k",
        ],
    );
    qemu_io(
        &u,
        &[
            "read -P 0 1M 512k",
            "read -P 0xcd 1536k 512k",
            "read -P 0 2M 512k",
            "read -P 0xef 2560k 512k",
            "read -P 0x77 16M 128k",
            "read -P 0xa5 9M 64k",
        ],
    );
    // qemu-img map (block status) sees data where it was written and
    // zeros where it was not
    let o = run_ok(cmd("qemu-img").args(["map", "--output=json", "-f", "raw", &u]));
    let first = o
        .stdout
        .lines()
        .find(|l| l.contains("\"start\": 0"))
        .unwrap_or("");
    assert!(first.contains("\"data\": true"), "map:\n{}", o.stdout);
    let last = o
        .stdout
        .lines()
        .rev()
        .find(|l| l.contains("\"start\""))
        .unwrap();
    assert!(
        last.contains("\"zero\": true"),
        "tail not zero in map:\n{}",
        o.stdout
    );
}

/// Poll mode (`--poll-us`): fio verify through it at queue depth 1 (where
/// the reader polls) and 32 (where bursts turn polling off), several
/// connections at once, over a unix socket and over TCP.
#[test]
fn poll_mode_fio_verify_qd1_and_qd32() {
    let _g = heavy();
    require_tool("fio");
    let srv = ServerBuilder::iolift()
        .backend("memory:128M")
        .args(["--poll-us", "300"])
        .tcp()
        .start();
    let tcp = srv.tcp_uri("");
    fio_randwrite_verify(&srv.uri(), 1, 2, "2M", "16M");
    fio_randwrite_verify(&tcp, 32, 3, "12M", "16M");
}

#[test]
fn fio_verify_crc32c_qd32_four_connections() {
    let _g = heavy();
    require_tool("fio");
    let srv = ServerBuilder::peer().backend("memory:256M").start();
    fio_randwrite_verify(&srv.uri(), 32, 4, "16M", "32M");
    // a mixed random read/write job with verification, bigger blocks
    run_ok(cmd("fio").args([
        "--name=mixed",
        "--ioengine=nbd",
        &format!("--uri={}", srv.uri()),
        "--rw=randrw",
        "--bsrange=4k-256k",
        "--iodepth=32",
        "--numjobs=2",
        "--size=24M",
        "--offset=128M",
        "--offset_increment=48M",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]));
}

/// `iolift serve file:DIR/disk.img,size=SIZE`; the server and the file.
fn file_server(size: &str) -> (Server, std::path::PathBuf) {
    let mut b = ServerBuilder::iolift();
    let disk = b.dir().join("disk.img");
    let srv = b
        .backend(&format!("file:{},size={size}", disk.display()))
        .start();
    (srv, disk)
}

#[test]
fn sigterm_exits_zero_and_file_holds_the_data() {
    let (mut srv, disk) = file_server("16M");
    let src = srv.dir().join("src.bin");
    write_random_file(&src, 8 * MIB as usize, 11);
    // qemu-io writes without an explicit flush; the shutdown must flush
    run_ok(cmd("qemu-io").args([
        "-f",
        "raw",
        "--cache=writeback",
        &srv.uri(),
        "-c",
        "write -P 0x3c 8M 4M",
    ]));
    run_ok(cmd("nbdcopy").args([src.to_str().unwrap(), &srv.uri()]));
    // a client connected during shutdown does not block it
    let idle = std::os::unix::net::UnixStream::connect(srv.socket()).unwrap();
    let st = srv.stop();
    drop(idle);
    assert_eq!(st.code(), Some(0), "stderr:\n{}", srv.stderr());
    let got = fs::read(&disk).unwrap();
    assert_eq!(got.len() as u64, 16 * MIB);
    assert_eq!(&got[..8 * MIB as usize], &fs::read(&src).unwrap()[..]);
    assert!(got[8 * MIB as usize..12 * MIB as usize]
        .iter()
        .all(|&b| b == 0x3c));
    assert!(got[12 * MIB as usize..].iter().all(|&b| b == 0));
}

#[test]
fn sigint_also_stops_cleanly() {
    let mut srv = ServerBuilder::iolift().backend("memory:1M").start();
    srv.signal(libc::SIGINT);
    let st = srv
        .wait_exit(STOP_TIMEOUT)
        .unwrap_or_else(|| panic!("no exit after SIGINT:\n{}", srv.stderr()));
    assert_eq!(st.code(), Some(0));
}

#[test]
fn kill9_after_flush_keeps_acknowledged_writes() {
    let (mut srv, disk) = file_server("8M");
    let py = python3_nbd();
    let script = format!(
        "import nbd\nh = nbd.NBD()\nh.connect_uri({uri:?})\n\
         h.pwrite(b'\\x42' * 1048576, 1048576)\n\
         h.pwrite(b'\\x43' * 65536, 4194304, nbd.CMD_FLAG_FUA)\nh.flush()\nprint('flushed')\n",
        uri = srv.uri()
    );
    let o = run_ok(std::process::Command::new(py).args(["-c", &script]));
    assert!(o.stdout.contains("flushed"));
    srv.kill9();
    let got = fs::read(&disk).unwrap();
    assert!(got[MIB as usize..2 * MIB as usize]
        .iter()
        .all(|&b| b == 0x42));
    assert!(got[4 * MIB as usize..4 * MIB as usize + 65536]
        .iter()
        .all(|&b| b == 0x43));
}

#[test]
fn multi_conn_flush_on_another_connection_then_kill9() {
    // Writes acknowledged on connections A and B, FLUSH sent on connection
    // C only, then SIGKILL: the flush must have covered A's and B's writes
    // (the CAN_MULTI_CONN promise), so all of them are in the file.
    let (mut srv, disk) = file_server("16M");
    let script = format!(
        "import nbd\n\
         hs = [nbd.NBD() for _ in range(3)]\n\
         [h.connect_uri({uri:?}) for h in hs]\n\
         assert all(h.can_multi_conn() for h in hs)\n\
         for i in range(32):\n    hs[i % 2].pwrite(bytes([i + 1]) * 65536, i * 65536)\n\
         hs[2].flush()\nprint('flushed')\n",
        uri = srv.uri()
    );
    let o = run_ok(std::process::Command::new(python3_nbd()).args(["-c", &script]));
    assert!(o.stdout.contains("flushed"));
    srv.kill9();
    let got = fs::read(&disk).unwrap();
    for i in 0..32usize {
        let blk = &got[i * 65536..(i + 1) * 65536];
        assert!(
            blk.iter().all(|&x| x == i as u8 + 1),
            "block {i} written on connection {} lost after FLUSH on another connection",
            i % 2
        );
    }
}

#[test]
fn toml_config_exports_and_flags() {
    let mut b = ServerBuilder::iolift();
    let dir = b.dir().to_path_buf();
    let sock = b.socket_path();
    let disk = dir.join("cfg.img");
    let cfg = dir.join("iolift.toml");
    fs::write(
        &cfg,
        format!(
            "socket = {sock:?}\nmax_request = \"1M\"\n\n\
             [[export]]\nname = \"mem\"\nbackend = \"memory:24M\"\n\n\
             [[export]]\nname = \"disk\"\nbackend = \"file:{},size=12M\"\nread_only = true\n\
             description = \"from the config\"\n",
            disk.display()
        ),
    )
    .unwrap();
    let srv = b
        .socket_from_config()
        .args(["-c", cfg.to_str().unwrap()])
        .start();
    let o = run_ok(cmd("nbdinfo").args(["--list", "--json", &srv.uri()]));
    let ex = json_exports(&o.stdout);
    let find = |n: &str| {
        *ex.iter()
            .find(|e| export_name(e) == n)
            .unwrap_or_else(|| panic!("export {n} missing:\n{}", o.stdout))
    };
    assert_eq!(json_u64(find("mem"), "export-size"), 24 * MIB);
    assert!(!json_bool(find("mem"), "is_read_only"));
    assert_eq!(json_u64(find("mem"), "block_size_maximum"), MIB);
    assert_eq!(json_u64(find("disk"), "export-size"), 12 * MIB);
    assert!(json_bool(find("disk"), "is_read_only"));
    let o = run_ok(cmd("nbdinfo").args(["--json", &srv.uri_named("disk")]));
    assert!(o.stdout.contains("from the config"), "{}", o.stdout);
    assert!(Path::new(&disk).exists());
}

/// Runs `iolift serve ARGS` expecting a quick failure; returns stderr.
fn serve_fails(dir: &Path, args: &[&str]) -> String {
    let mut c = std::process::Command::new(iolift_bin());
    c.arg("serve");
    if !args.contains(&"--socket") {
        c.arg("--socket").arg(dir.join("never.sock"));
    }
    c.args(args).current_dir(dir);
    let o = run_timeout(&mut c, Duration::from_secs(30));
    assert!(
        !o.status.success() && o.status.code().is_some(),
        "serve {args:?} should fail with an exit code: {}\n{}",
        o.status,
        o.all()
    );
    assert!(
        !o.all().contains("panicked"),
        "serve {args:?} panicked:\n{}",
        o.all()
    );
    o.all()
}

#[test]
fn bad_config_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: &[(&str, &str)] = &[
        ("bogus_field = 1\n", "bogus_field"),
        ("max_request = \"lots\"\n", "max_request"),
        (
            "[[export]]\nname = \"x\"\nbackend = \"memory:1G\"\nsurprise = true\n",
            "surprise",
        ),
        (
            "[[export]]\nname = \"x\"\nbackend = \"nosuchkind:1G\"\n",
            "nosuchkind",
        ),
        ("[[export]]\nname = \"x\"\n", "backend"),
        ("read_only = \"maybe\"\n", "read_only"),
        ("poll_us = 99999\n", "poll_us"),
        ("this is not toml\n", "iolift.toml"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let f = d.join("iolift.toml");
        fs::write(&f, text).unwrap();
        let err = serve_fails(d, &["-c", f.to_str().unwrap()]);
        assert!(
            err.contains(want) || (*want == "iolift.toml" && err.to_lowercase().contains("toml")),
            "case {i}: error does not mention {want:?}:\n{err}"
        );
    }
    let err = serve_fails(d, &["-c", d.join("missing.toml").to_str().unwrap()]);
    assert!(err.contains("missing.toml"), "{err}");
}

#[test]
fn bad_cli_flags_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus-flag"], "--bogus-flag"),
        (&["--max-request", "banana"], "banana"),
        (&["--max-request", "0"], "max-request"),
        (&["--threads", "zero"], "zero"),
        (&["--poll-us", "20000"], "--poll-us"),
        (&["--poll-us", "-1"], "-1"),
        (&["--tcp", "127.0.0.1:notaport"], "notaport"),
        (&["memory:12Q"], "12Q"),
        (&["warp:1G"], "warp"),
        (&["file:/nonexistent-dir/x.img,size=1M"], "nonexistent-dir"),
        (&["memory:1G,colour=blue"], "colour"),
        (&["-e", "noequals"], "noequals"),
        (&["-e", "a=memory:1M", "-e", "a=memory:2M"], "\"a\""),
        (&["-e", "a=memory:1M", "--default-export", "zz"], "zz"),
        (&["--stage", "nosuchstage:1"], "nosuchstage"),
    ];
    for (args, want) in cases {
        let err = serve_fails(d, args);
        assert!(
            err.contains(want),
            "serve {args:?}: error does not mention {want:?}:\n{err}"
        );
    }
    // an unknown subcommand
    let o = run_fail(std::process::Command::new(iolift_bin()).arg("frobnicate"));
    assert!(o.all().contains("frobnicate"), "{}", o.all());
}

#[test]
fn socket_in_use_is_refused() {
    let srv = ServerBuilder::iolift().backend("memory:1M").start();
    let sock = srv.socket().to_str().unwrap().to_string();
    let err = serve_fails(srv.dir(), &["--socket", &sock, "memory:1M"]);
    assert!(err.contains(&sock), "{err}");
    // the first server is unharmed
    run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
}
