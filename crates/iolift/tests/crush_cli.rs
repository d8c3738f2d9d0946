//! `iolift crush` on bad input: one clear error line on stderr, exit code 1.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_iolift"))
        .args(args)
        .output()
        .expect("run iolift");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_one_error_line(args: &[&str], expect: &str) {
    let (code, out, err) = run(args);
    assert_eq!(code, 1, "{args:?}: exit code; stderr {err}");
    assert!(out.is_empty(), "{args:?}: stdout {out:?}");
    assert_eq!(err.lines().count(), 1, "{args:?}: stderr {err:?}");
    assert!(
        err.starts_with("iolift: error: decoding crush map") && err.contains(expect),
        "{args:?}: stderr {err:?}"
    );
}

#[test]
fn empty_and_random_maps_are_one_line_errors() {
    assert_one_error_line(
        &["crush", "test", "-i", "/dev/null"],
        "truncated at byte 0: magic needs 4 bytes, 0 left",
    );
    let dir = tempfile::tempdir().unwrap();
    // Random bytes (deterministic), with and without the right magic.
    let mut bytes = iolift_testkit::random_bytes(4096, 0x2545_f491);
    let p = dir.path().join("random.bin");
    std::fs::write(&p, &bytes).unwrap();
    let ps = p.to_str().unwrap();
    assert_one_error_line(&["crush", "test", "-i", ps], "bad magic");
    bytes[..4].copy_from_slice(&0x0001_0000u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert_one_error_line(&["crush", "test", "-i", ps], "at byte ");
    assert_one_error_line(&["crush", "info", "-i", ps], "at byte ");
    assert_one_error_line(&["crush", "decompile", "-i", ps], "at byte ");
}
