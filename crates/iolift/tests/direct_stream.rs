//! `iolift accelfs gen-fasta` and `stream`: the streaming application's
//! counts through the io_uring engine and through read(2) agree with
//! `wc -l` and `grep -c '^>'` on the same file; bad arguments give one
//! error line.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// `records R lines L bytes B ...` -> (R, L, B).
fn counts(out: &str) -> (u64, u64, u64) {
    let w: Vec<&str> = out.split_whitespace().collect();
    let at = |k: &str| -> u64 {
        let i = w
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("{k} in {out}"));
        w[i + 1].parse().unwrap()
    };
    (at("records"), at("lines"), at("bytes"))
}

fn tool_count(f: &Path) -> (u64, u64, u64) {
    let n = |c: &mut Command| -> u64 {
        run_ok(c)
            .stdout
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let records = n(cmd("grep").arg("-c").arg("^>").arg(f));
    let lines = n(cmd("wc").arg("-l").arg(f));
    (records, lines, std::fs::metadata(f).unwrap().len())
}

#[test]
fn stream_counts_agree_with_wc_and_grep() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("genome.fa");
    let wrote = counts(
        &run_ok(
            Command::new(iolift_bin())
                .args(["accelfs", "gen-fasta", "--size", "12M", "--seed", "4"])
                .arg(&f),
        )
        .stdout,
    );
    let want = tool_count(&f);
    assert_eq!(wrote, want);
    assert!(want.0 > 500, "{want:?}");
    for args in [
        vec!["--io", "uring"],
        vec![
            "--io", "uring", "--depth", "1", "--chunk", "4K", "--direct", "on",
        ],
        vec!["--io", "uring", "--sqpoll", "--chunk", "1M"],
        vec!["--io", "read"],
    ] {
        let out = run_ok(
            Command::new(iolift_bin())
                .args(["accelfs", "stream"])
                .args(&args)
                .arg(&f),
        )
        .stdout;
        assert_eq!(counts(&out), want, "{args:?}: {out}");
        assert!(out.contains("GB/s"), "{out}");
    }
}

#[test]
fn stream_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    for (args, what) in [
        (
            vec!["stream", "--chunk", "1000", "/etc/hostname"],
            "chunk size",
        ),
        (vec!["stream", "--depth", "0", "/etc/hostname"], "depth"),
        (vec!["stream", "/nonexistent/x.fa"], "/nonexistent/x.fa"),
    ] {
        let o = run_fail(
            Command::new(iolift_bin())
                .arg("accelfs")
                .args(&args)
                .current_dir(dir.path()),
        );
        let e = &o.stderr;
        assert!(e.contains(what) && e.lines().count() == 1, "{args:?}: {e}");
    }
}
