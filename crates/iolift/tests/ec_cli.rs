//! `iolift ec` against Ceph's `ceph-erasure-code-tool` (Debian ceph-osd):
//! same subcommands, same output files, byte-identical shards; decode from
//! surviving shards; bad input gives one error line, exit 1 and no files.

use iolift_testkit::random_bytes as random;
use std::path::Path;
use std::process::{Command, Output};

const TOOL: &str = "ceph-erasure-code-tool";

fn iolift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iolift"))
        .arg("ec")
        .args(args)
        .output()
        .unwrap()
}

fn ceph(args: &[&str]) -> Output {
    let out = Command::new(TOOL).args(args).output().unwrap_or_else(|e| {
        panic!("{TOOL} could not be run ({e}): these tests compare with Ceph's tool; install the Debian package ceph-osd")
    });
    assert!(
        out.status.success(),
        "{TOOL} {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "iolift failed: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Exit status 1 and exactly one line on stderr that contains `part`.
fn one_error(o: &Output, part: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.contains(part), "{err:?} does not name {part:?}");
}

fn shard(dir: &Path, name: &str, i: usize) -> Vec<u8> {
    std::fs::read(dir.join(format!("{name}.{i}"))).unwrap()
}

#[test]
fn info_subcommands_match_ceph() {
    for plugin in ["jerasure", "isa"] {
        ok(&iolift(&["test-plugin-exists", plugin]));
        ceph(&["test-plugin-exists", plugin]);
    }
    let o = iolift(&["test-plugin-exists", "shec"]);
    one_error(&o, "shec");
    for (profile, params) in [
        ("plugin=isa,k=3,m=2", vec![]),
        (
            "plugin=jerasure,technique=cauchy_good,k=8,m=4",
            vec!["chunk_count"],
        ),
        (
            "plugin=jerasure,technique=reed_sol_van,k=5,m=3",
            vec!["data_chunk_count", "coding_chunk_count"],
        ),
    ] {
        let mut args = vec!["validate-profile", profile];
        args.extend(params.iter());
        assert_eq!(
            ok(&iolift(&args)),
            String::from_utf8(ceph(&args).stdout).unwrap(),
            "{args:?}"
        );
    }
    for (profile, size) in [
        ("plugin=isa,k=3,m=2", "10000"),
        ("plugin=jerasure,technique=reed_sol_r6_op,k=6,m=2", "123457"),
        (
            "plugin=jerasure,technique=cauchy_orig,k=4,m=2,packetsize=64",
            "1000000",
        ),
    ] {
        let args = ["calc-chunk-size", profile, size];
        assert_eq!(
            ok(&iolift(&args)),
            String::from_utf8(ceph(&args).stdout).unwrap(),
            "{args:?}"
        );
    }
}

#[test]
fn encode_decode_match_ceph() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (seed, (profile, su, len)) in [
        (
            "plugin=jerasure,technique=reed_sol_van,k=8,m=4",
            4096usize,
            100_000usize,
        ),
        ("plugin=jerasure,technique=reed_sol_r6_op,k=4,m=2", 64, 5000),
        (
            "plugin=jerasure,technique=cauchy_good,k=6,m=3,packetsize=32",
            1024,
            33_333,
        ),
        (
            "plugin=jerasure,technique=cauchy_orig,k=3,m=2,packetsize=8",
            256,
            999,
        ),
        ("plugin=isa,technique=reed_sol_van,k=10,m=4", 32, 7777),
        ("plugin=isa,technique=cauchy,k=12,m=4", 8192, 400_001),
    ]
    .into_iter()
    .enumerate()
    {
        let input = random(len, seed as u64 + 1);
        let n = profile.split(',').fold(0, |acc, kv| {
            acc + kv
                .strip_prefix("k=")
                .or(kv.strip_prefix("m="))
                .map_or(0, |v| v.parse::<usize>().unwrap())
        });
        let k: usize = profile
            .split(',')
            .find_map(|kv| kv.strip_prefix("k="))
            .unwrap()
            .parse()
            .unwrap();
        let all: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let all = all.join(",");
        std::fs::write(d.join("ours"), &input).unwrap();
        std::fs::write(d.join("theirs"), &input).unwrap();
        let su_s = su.to_string();
        ok(&iolift(&[
            "encode",
            profile,
            &su_s,
            &all,
            d.join("ours").to_str().unwrap(),
        ]));
        ceph(&[
            "encode",
            profile,
            &su_s,
            &all,
            d.join("theirs").to_str().unwrap(),
        ]);
        for i in 0..n {
            assert!(
                shard(d, "ours", i) == shard(d, "theirs", i),
                "{profile}: shard {i} differs"
            );
        }
        // Every --engine writes the same shards (the default, auto, is
        // iolift's AVX2 kernel on an AVX2 CPU; isal needs libisal2).
        for engine in ["isal", "native", "scalar"] {
            std::fs::write(d.join("eng"), &input).unwrap();
            ok(&iolift(&[
                "--engine",
                engine,
                "encode",
                profile,
                &su_s,
                &all,
                d.join("eng").to_str().unwrap(),
            ]));
            for i in 0..n {
                assert!(
                    shard(d, "eng", i) == shard(d, "theirs", i),
                    "{profile} --engine {engine}: shard {i} differs"
                );
            }
        }
        // Decode with the first m shards gone (data), and with the last m
        // (parity): both give the padded input, as Ceph's decode does.
        let m = n - k;
        for lost in [(0..m).collect::<Vec<_>>(), (k..n).collect()] {
            let have: Vec<String> = (0..n)
                .filter(|i| !lost.contains(i))
                .map(|i| i.to_string())
                .collect();
            let have = have.join(",");
            for i in &lost {
                std::fs::remove_file(d.join(format!("ours.{i}"))).unwrap();
            }
            std::fs::remove_file(d.join("ours")).unwrap();
            ok(&iolift(&[
                "decode",
                profile,
                &su_s,
                &have,
                d.join("ours").to_str().unwrap(),
            ]));
            let got = std::fs::read(d.join("ours")).unwrap();
            assert_eq!(got.len(), len.div_ceil(k * su) * k * su, "{profile}");
            assert!(got[..len] == input[..], "{profile}: decode lost {lost:?}");
            assert!(got[len..].iter().all(|&b| b == 0));
            ceph(&[
                "decode",
                profile,
                &su_s,
                &have,
                d.join("theirs").to_str().unwrap(),
            ]);
            assert!(
                std::fs::read(d.join("theirs")).unwrap() == got,
                "{profile}: Ceph's decode differs"
            );
            for i in &lost {
                std::fs::copy(d.join(format!("theirs.{i}")), d.join(format!("ours.{i}"))).unwrap();
            }
        }
    }
}

#[test]
fn want_to_encode_subset_and_empty_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = d.join("obj");
    std::fs::write(&f, random(3000, 5)).unwrap();
    ok(&iolift(&[
        "encode",
        "plugin=isa,k=3,m=2",
        "64",
        "4,0,0,9",
        f.to_str().unwrap(),
    ]));
    let mut names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["obj", "obj.0", "obj.4"]);
    let e = d.join("empty");
    std::fs::write(&e, b"").unwrap();
    ok(&iolift(&[
        "encode",
        "plugin=isa,k=3,m=2",
        "64",
        "0,1,2,3,4",
        e.to_str().unwrap(),
    ]));
    assert!(!d.join("empty.0").exists());
}

#[test]
fn bad_input_is_one_error_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let f = d.join("obj");
    let fs = f.to_str().unwrap();
    std::fs::write(&f, random(5000, 9)).unwrap();
    let listing = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    for (profile, part) in [
        ("plugin=jerasure,technique=reed_sol_van,k=0,m=2", "k=0"),
        ("plugin=jerasure,technique=reed_sol_r6_op,k=4,m=3", "m=3"),
        ("plugin=isa,k=4,m=5", "m=5"),
        ("plugin=jerasure,technique=nope,k=4,m=2", "technique=nope"),
        ("plugin=jerasure,technique=reed_sol_van,k=4,m=2,w=9", "w=9"),
        (
            "plugin=jerasure,technique=cauchy_good,k=4,m=2,packetsize=12",
            "packetsize=12",
        ),
        ("plugin=nope,k=4,m=2", "plugin=nope"),
    ] {
        one_error(
            &iolift(&["encode", profile, "4096", "0,1,2,3,4,5", fs]),
            part,
        );
        one_error(&iolift(&["validate-profile", profile]), part);
    }
    assert_eq!(listing(d), ["obj"]);
    one_error(
        &iolift(&["encode", "plugin=isa,k=4,m=2", "100", "0,1", fs]),
        "stripe_unit=100",
    );
    one_error(
        &iolift(&["encode", "plugin=isa,k=4,m=2", "64", "0,x", fs]),
        "want_to_encode=x",
    );
    let gpu_encode = iolift(&[
        "--device",
        "gpu",
        "encode",
        "plugin=isa,k=4,m=2",
        "64",
        "0",
        fs,
    ]);
    if std::path::Path::new("/dev/nvidiactl").exists() {
        // A GPU machine: the GPU path encodes (tests/gpu.rs and
        // scripts/gpu-check.sh compare its shards with the CPU's).
        ok(&gpu_encode);
        std::fs::remove_file(d.join("obj.0")).unwrap();
    } else {
        // No GPU: one error line naming the device, nothing written.
        one_error(&gpu_encode, "gpu");
    }
    assert_eq!(listing(d), ["obj"]);

    ok(&iolift(&[
        "encode",
        "plugin=isa,k=4,m=2",
        "64",
        "0,1,2,3,4,5",
        fs,
    ]));
    std::fs::remove_file(&f).unwrap();
    // Three shards of six: more than m=2 missing.
    one_error(
        &iolift(&["decode", "plugin=isa,k=4,m=2", "64", "0,1,5", fs]),
        "at least k=4",
    );
    // A listed shard that is not there.
    std::fs::remove_file(d.join("obj.1")).unwrap();
    one_error(
        &iolift(&["decode", "plugin=isa,k=4,m=2", "64", "0,1,2,3", fs]),
        "obj.1",
    );
    // Shards of different sizes.
    let mut s2 = std::fs::read(d.join("obj.2")).unwrap();
    s2.extend_from_slice(&[0u8; 64]);
    std::fs::write(d.join("obj.2"), s2).unwrap();
    one_error(
        &iolift(&["decode", "plugin=isa,k=4,m=2", "64", "0,2,3,4", fs]),
        "shard 2",
    );
    assert!(!f.exists(), "decode wrote its output despite the error");
    assert!(
        listing(d).iter().all(|n| !n.contains("tmp")),
        "{:?}",
        listing(d)
    );
}
