//! Shared helpers: run crushtool (the peer), compile and build maps with
//! it. The map generator ([`text_map`], [`Spec`]) and the generator of
//! random numbers ([`Rng`]) come from iolift-testkit.
#![allow(dead_code, unused_imports)]

pub use iolift_testkit::crushmap::{text_map, tunables_lines, Spec, ALGS, PROFILES};
pub use iolift_testkit::Rng;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long one crushtool run may take (the largest `--test` runs map
/// 10000 devices).
const CRUSHTOOL_TIMEOUT: Duration = Duration::from_secs(600);

/// Path to crushtool; a missing one fails the test (not a skip).
pub fn crushtool() -> PathBuf {
    iolift_testkit::require_tool("crushtool")
}

/// Runs crushtool with `args` (time-limited); asserts success and returns
/// its stdout followed by its stderr.
pub fn run_crushtool(args: &[&str]) -> Vec<u8> {
    let o = iolift_testkit::run_timeout(Command::new(crushtool()).args(args), CRUSHTOOL_TIMEOUT);
    assert!(o.status.success(), "crushtool failed\n{}", o.report());
    // crushtool --test writes its report to stdout in 16.2; keep stderr too.
    let mut v = o.stdout.into_bytes();
    v.extend_from_slice(o.stderr.as_bytes());
    v
}

/// `crushtool -c DIR/NAME.txt -o DIR/NAME` of `text`; returns the binary
/// map's path. A compile error fails the test, showing the text.
pub fn compile(dir: &Path, name: &str, text: &str) -> PathBuf {
    let src = dir.join(format!("{name}.txt"));
    let bin = dir.join(name);
    std::fs::write(&src, text).unwrap();
    let o = iolift_testkit::run_timeout(
        Command::new(crushtool())
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&bin),
        CRUSHTOOL_TIMEOUT,
    );
    assert!(
        o.status.success(),
        "crushtool -c {name} failed: {}\n{text}",
        o.stderr
    );
    bin
}

/// `crushtool --build ARGS -o DIR/NAME`; returns the map's path.
pub fn build(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let bin = dir.join(name);
    let o = iolift_testkit::run_timeout(
        Command::new(crushtool())
            .arg("--build")
            .args(args)
            .arg("-o")
            .arg(&bin),
        CRUSHTOOL_TIMEOUT,
    );
    assert!(
        o.status.success(),
        "crushtool --build {args:?}: {}",
        o.stderr
    );
    bin
}
