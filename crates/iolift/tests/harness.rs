//! Checks of the test harness itself (tests/common), against nbdkit, the
//! known-good peer: if these fail, the other integration tests cannot be
//! trusted either.

mod common;
use common::*;

#[test]
fn harness_nbdkit_unix_and_random_data() {
    require_tool("nbdinfo");
    let srv = ServerBuilder::nbdkit().backend("memory:64M").start();
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    assert_eq!(o.stdout.trim(), (64u64 << 20).to_string());
    // Deterministic data helpers.
    assert_eq!(random_bytes(1000, 7), random_bytes(1000, 7));
    assert_ne!(random_bytes(1000, 7), random_bytes(1000, 8));
    let f = srv.dir().join("r.bin");
    write_random_file(&f, 4096, 1);
    assert_eq!(sha256_file(&f).len(), 64);
}

#[test]
fn harness_nbdkit_tcp_only() {
    require_tool("nbdinfo");
    let srv = ServerBuilder::nbdkit()
        .backend("null:1M")
        .tcp_only()
        .start();
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    assert_eq!(o.stdout.trim(), (1u64 << 20).to_string());
    assert!(srv.uri().starts_with("nbd://127.0.0.1:"));
}

#[test]
fn harness_stop_reports_exit_and_run_fail_sees_errors() {
    let mut srv = ServerBuilder::nbdkit().backend("memory:1M").start();
    srv.assert_running();
    let st = srv.stop();
    assert!(st.code().is_some() || std::os::unix::process::ExitStatusExt::signal(&st).is_some());
    assert!(!srv.is_running());
    let o = run_fail(cmd("nbdinfo").args(["--size", "nbd+unix:///?socket=/nonexistent/x.sock"]));
    assert!(!o.all().is_empty());
}

#[test]
#[should_panic(expected = "missing no-such-tool-xyz: run scripts/test.sh, which installs it")]
fn harness_require_tool_fails_loudly() {
    require_tool("no-such-tool-xyz");
}
