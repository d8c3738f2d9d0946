//! Checks of the test harness itself (tests/common), against nbdkit, the
//! known-good peer: if these fail, the other integration tests cannot be
//! trusted either.

mod common;
use common::*;
use std::os::unix::process::ExitStatusExt;

/// (The data, tool and process helpers are checked by iolift-testkit's
/// own tests.)
#[test]
fn harness_nbdkit_unix() {
    require_tool("nbdinfo");
    let srv = ServerBuilder::nbdkit().backend("memory:64M").start();
    let o = run_ok(cmd("nbdinfo").args(["--size", &srv.uri()]));
    assert_eq!(o.stdout.trim(), (64u64 << 20).to_string());
    assert_eq!(
        srv.uri(),
        format!("nbd+unix:///?socket={}", srv.socket().display())
    );
    assert!(srv.socket().starts_with(srv.dir()));
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
    require_tool("nbdinfo");
    // A server stopped by our SIGTERM exits by itself with status 0.
    let mut srv = ServerBuilder::nbdkit().backend("memory:1M").start();
    srv.assert_running();
    let st = srv.stop();
    assert!(st.success(), "nbdkit after SIGTERM: {st}");
    assert!(!srv.is_running());
    // Stopping it again reports the same exit (no signal to a reused pid).
    assert_eq!(srv.stop(), st);
    assert_eq!(srv.kill9(), None, "kill9 of a reaped server");
    // A server that died before stop(): stop() reports how it died.
    let mut srv = ServerBuilder::nbdkit().backend("memory:1M").start();
    srv.signal(libc::SIGKILL);
    let st = srv.stop();
    assert_eq!(
        st.signal(),
        Some(libc::SIGKILL),
        "stop() of a killed server: {st}"
    );
    assert!(!srv.is_running());
    // run_fail: a non-zero exit with the client's own error message.
    let o = run_fail(cmd("nbdinfo").args(["--size", "nbd+unix:///?socket=/nonexistent/x.sock"]));
    assert_eq!(o.status.code(), Some(1), "{}", o.all());
    assert!(
        o.stderr.contains("No such file or directory"),
        "{}",
        o.all()
    );
}

#[test]
#[should_panic(expected = "missing no-such-tool-xyz: run scripts/test.sh, which installs it")]
fn harness_require_tool_fails_loudly() {
    require_tool("no-such-tool-xyz");
}
