//! NBD protocol corner cases, one test per case, each against a fresh
//! `iolift serve`. The cases live in tests/python/: raw_cases.py (a raw
//! socket client that sends malformed input) and libnbd_cases.py (libnbd
//! with strict mode off, so the server's own errors are checked). Every case
//! checks the exact error, then that a fresh client still works; the Rust
//! side then checks that the server process is still running.

mod common;
use common::*;

const MAX_REQUEST: u64 = 4 << 20;

/// `iolift serve --max-request 4M -e ro=file:ro.img,ro memory:1G`: the
/// default export "" (memory) and a read-only file export "ro".
fn proto_server() -> Server {
    let mut b = ServerBuilder::iolift();
    let ro = b.dir().join("ro.img");
    write_random_file(&ro, 16 << 20, 5);
    b.args([
        "--max-request",
        &MAX_REQUEST.to_string(),
        "-e",
        &format!("ro=file:{},ro", ro.display()),
    ])
    .backend("memory:1G")
    .start()
}

fn raw(case: &str) {
    let mut srv = proto_server();
    let fds_before = srv.open_fds();
    let sock = srv.socket().to_str().unwrap().to_string();
    let o = run_python(
        "raw_cases.py",
        &[
            "--socket",
            &sock,
            "--ro-export",
            "ro",
            "--max-request",
            &MAX_REQUEST.to_string(),
            case,
        ],
    );
    case_passed(&mut srv, case, &o);
    // every connection of the case is gone: no fd left behind
    srv.wait_fds_at_most(fds_before);
}

fn libnbd(case: &str) {
    let mut srv = proto_server();
    let o = run_python(
        "libnbd_cases.py",
        &["--uri", &srv.uri(), "--ro-uri", &srv.uri_named("ro"), case],
    );
    case_passed(&mut srv, case, &o);
}

/// The script printed `ok CASE` (it checked the case and a fresh client
/// afterwards) and the server still runs, with no panic in its log.
fn case_passed(srv: &mut Server, case: &str, o: &Out) {
    assert!(o.stdout.contains(&format!("ok {case}")), "{}", o.all());
    srv.assert_running();
    assert!(
        !srv.stderr().contains("panicked"),
        "server panicked:\n{}",
        srv.stderr()
    );
}

macro_rules! cases {
    ($runner:ident: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let n = stringify!($name);
                $runner(n.strip_prefix(concat!(stringify!($runner), "_")).unwrap());
            }
        )*
    };
}

cases!(raw:
    raw_truncated_handshake,
    raw_bad_client_flags,
    raw_bad_option_magic,
    raw_unknown_option,
    raw_huge_option,
    raw_unknown_export,
    raw_list_and_info,
    raw_abort,
    raw_export_name,
    raw_bad_request_magic,
    raw_unknown_command,
    raw_out_of_range,
    raw_simple_replies,
    raw_structured_replies,
    raw_out_of_order,
    raw_oversized_request,
    raw_read_only,
    raw_client_vanishes,
    raw_disc_flushes_inflight,
);

cases!(libnbd:
    libnbd_errors,
    libnbd_read_only,
    libnbd_block_status,
    libnbd_zero_flags,
    libnbd_cache,
    libnbd_simple_vs_structured,
    libnbd_multi_conn,
    libnbd_fua_and_flush,
    libnbd_many_in_flight,
);

/// nbdsh (the libnbd shell) one-liner: BLOCK_STATUS after a write and a trim.
#[test]
fn nbdsh_block_status_after_write_and_trim() {
    let srv = proto_server();
    let o = run_ok(nbdsh().args([
        "--base-allocation",
        "-u",
        &srv.uri(),
        "-c",
        "h.pwrite(b'\\x01' * 65536, 0)\n\
         h.trim(65536, 0)\n\
         h.pwrite(b'\\x02' * 4096, 1048576)\n\
         ext = []\n\
         h.block_status(2 * 1048576, 0, lambda m, o, e, err: ext.extend(e) or 0)\n\
         print(ext)\n\
         assert ext[1] & 1, ('trimmed start not a hole', ext)\n\
         off = 0\n\
         i = 0\n\
         while off + ext[i] <= 1048576:\n    off += ext[i]; i += 2\n\
         assert ext[i + 1] == 0, ('written block not data', ext)\n",
    ]));
    assert!(o.stdout.starts_with('['), "{}", o.all());
}
