//! Stable-Rust fuzzing of the map decoder and, through it, the mapper.
//!
//! Seeds are real maps (crushtool-compiled text maps of the corpus and
//! `crushtool --build` maps of every bucket algorithm). Each case mutates a
//! seed (truncation, byte flips, u32 overwrites with boundary values and
//! huge counts, inserted / deleted bytes, combinations) and decodes it under
//! `catch_unwind`. A decoded map must survive the mapper (every rule, numrep
//! 1..=max_size, a few x, with and without choose_args), the tester, and
//! re-encoding. A panic, an error without a byte offset, or a case that
//! runs longer than the watchdog allows fails the test; the offending input
//! is written to `$CARGO_TARGET_TMPDIR/fuzz-fail-*.bin`.
//!
//! Environment: `IOLIFT_FUZZ_SEED` (default 1), `IOLIFT_FUZZ_ITERS`
//! (default sized for ~20 s in release on one core), `IOLIFT_FUZZ_TIMEOUT`
//! (seconds per case before it counts as a hang, default 20).
//! A longer run: `IOLIFT_FUZZ_ITERS=5000000 IOLIFT_FUZZ_SEED=$RANDOM cargo
//! test --release -p iolift-crush --test decode_fuzz -- --nocapture`.

mod common;
use common::*;
use iolift_crush::map::ITEM_NONE;
use iolift_crush::tester::{run_test, test_weights, TestOptions};
use iolift_crush::{decode, do_rule, encode, CrushError, CrushMap, Workspace};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        Err(_) => default,
    }
}

/// Seed maps: compiled text maps of a few corpus shapes plus built maps.
fn seeds(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let base = Spec {
        tunables: "jewel",
        algs: ["straw2"; 3],
        racks: 2,
        hosts: 3,
        osds: 3,
        weights: 2,
        classes: false,
        choose_args: false,
        seed: 1,
    };
    let specs = [
        (
            "straw2_classes_choose_args",
            Spec {
                classes: true,
                choose_args: true,
                ..base
            },
        ),
        (
            "mixed_argonaut",
            Spec {
                tunables: "argonaut",
                algs: ["straw", "uniform", "list"],
                weights: 0,
                seed: 2,
                ..base
            },
        ),
        (
            "tree_firefly",
            Spec {
                tunables: "firefly",
                algs: ["tree", "list", "tree"],
                seed: 3,
                ..base
            },
        ),
        (
            "uniform_hammer",
            Spec {
                tunables: "hammer",
                algs: ["uniform", "straw2", "uniform"],
                weights: 0,
                seed: 4,
                ..base
            },
        ),
        (
            "straw_vary_r3",
            Spec {
                tunables: "vary_r3",
                algs: ["straw", "straw", "straw2"],
                choose_args: true,
                seed: 5,
                ..base
            },
        ),
    ];
    let mut v = Vec::new();
    for (name, spec) in &specs {
        let p = compile(dir, name, &text_map(spec));
        v.push((name.to_string(), std::fs::read(p).unwrap()));
    }
    for alg in ["straw2", "straw", "list", "tree", "uniform"] {
        let name = format!("built_{alg}");
        let p = build(
            dir,
            &name,
            &[
                "--num_osds",
                "24",
                "host",
                alg,
                "4",
                "rack",
                alg,
                "3",
                "root",
                alg,
                "0",
            ],
        );
        v.push((name, std::fs::read(p).unwrap()));
    }
    for (name, bytes) in &v {
        let m = decode(bytes).unwrap_or_else(|e| panic!("seed {name} does not decode: {e}"));
        assert_eq!(&encode(&m), bytes, "seed {name} does not re-encode");
    }
    v
}

const BOUNDARY: [u32; 12] = [
    0,
    1,
    2,
    0x7fff_ffff,
    0xffff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0x0001_0000,
    0xffff,
    0x4000_0000,
    0x00ff_ffff,
    0x1000,
];

/// Apply one random mutation; returns a short description.
fn mutate(rng: &mut Rng, buf: &mut Vec<u8>) -> String {
    let len = buf.len();
    match rng.index(7) {
        0 => {
            let at = rng.index(len);
            buf.truncate(at);
            format!("truncate@{at}")
        }
        1 => {
            let mut d = String::from("flip");
            for _ in 0..1 + rng.index(3) {
                if buf.is_empty() {
                    break;
                }
                let at = rng.index(buf.len());
                let bit = 1u8 << rng.index(8);
                buf[at] ^= bit;
                d += &format!(" {at}^{bit:#x}");
            }
            d
        }
        2 => {
            if buf.is_empty() {
                return "noop".into();
            }
            let at = rng.index(buf.len());
            buf[at] = rng.next_u64() as u8;
            format!("byte@{at}={:#x}", buf[at])
        }
        3 | 4 => {
            // u32 overwrite, usually at a 4-aligned offset (most fields are).
            if len < 4 {
                return "noop".into();
            }
            let mut at = rng.index(len - 3);
            if rng.index(4) != 0 {
                at &= !3;
            }
            let v = if rng.index(5) == 0 {
                let old = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap());
                old.wrapping_add(rng.index(5) as u32).wrapping_sub(2)
            } else {
                BOUNDARY[rng.index(BOUNDARY.len())]
            };
            buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
            format!("u32@{at}={v:#x}")
        }
        5 => {
            let at = rng.index(len + 1);
            let n = 1 + rng.index(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            buf.splice(at..at, bytes);
            format!("insert@{at}+{n}")
        }
        _ => {
            if len == 0 {
                return "noop".into();
            }
            let at = rng.index(len);
            let n = (1 + rng.index(8)).min(len - at);
            buf.drain(at..at + n);
            format!("delete@{at}-{n}")
        }
    }
}

/// Everything a decoded map must survive. Panics are caught by the caller.
fn exercise(map: &CrushMap) -> Result<(), String> {
    // Re-encoding must decode to the same map (Ceph's string map codec
    // cannot carry an empty name: its zero length reads as a 64-bit key).
    let has_empty_name = [
        &map.type_names,
        &map.names,
        &map.rule_names,
        &map.class_names,
    ]
    .iter()
    .any(|m| m.values().any(String::is_empty));
    if !has_empty_name {
        let again = decode(&encode(map)).map_err(|e| format!("re-encoded map fails: {e}"))?;
        if &again != map {
            return Err("decode(encode(map)) != map".into());
        }
    }
    let weight = test_weights(map, &[]);
    let mut ws = Workspace::default();
    for (ruleno, rule) in map.rules.iter().enumerate() {
        let Some(rule) = rule else { continue };
        let max = (rule.max_size as usize).clamp(1, 12);
        for nr in 1..=max {
            let mut out = vec![0i32; nr];
            for x in [0, 12345, -1] {
                for cargs in [None, map.choose_args_for(0)] {
                    let n = do_rule(map, ruleno as i32, x, &mut out, &weight, &mut ws, cargs);
                    if n > nr {
                        return Err(format!("do_rule returned {n} > {nr}"));
                    }
                    for &it in &out[..n] {
                        if it != ITEM_NONE && it >= map.max_devices {
                            return Err(format!("rule {ruleno} x {x} mapped item {it}"));
                        }
                    }
                }
            }
        }
    }
    // The tester on a short range (statistics, utilization, bad mappings).
    // Its per-device work is linear in max_devices (up to 4M) by design,
    // like crushtool's: skip it for huge device counts to keep cases fast.
    if map.max_devices > 1 << 16 {
        return Ok(());
    }
    let o = TestOptions {
        min_x: 0,
        max_x: 3,
        max_rep: 4,
        min_rep: 1,
        show_mappings: true,
        show_bad_mappings: true,
        show_statistics: true,
        show_utilization_all: true,
        ..TestOptions::default()
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run_test(map, &o, &mut out, &mut err, &mut |_| {}).map_err(|e| format!("tester: {e}"))?;
    Ok(())
}

/// An error must say where (a byte offset) and be one line.
fn check_error(e: &CrushError) -> Result<(), String> {
    let s = e.to_string();
    let ok = match e {
        CrushError::Truncated { .. } | CrushError::Corrupt { .. } => s.contains("at byte "),
        CrushError::BadMagic(_) => true,
        _ => false,
    };
    if !ok || s.contains('\n') || s.len() > 400 {
        return Err(format!("unclear decode error: {s:?}"));
    }
    Ok(())
}

/// Decode one input and exercise the result. Err(description) on a bug.
fn one_case(input: &[u8]) -> Result<bool, String> {
    // The lenient decode (decompile, info) and the decompiler must not
    // panic either, whatever they are given.
    match catch_unwind(AssertUnwindSafe(|| {
        iolift_crush::decode::decode_for_text(input).map(|m| {
            let _ = iolift_crush::decompile::decompile_partial(&m);
            let _ = iolift_crush::decompile::info(&m);
        })
    })) {
        Err(p) => {
            return Err(format!(
                "decode_for_text/decompile panicked: {}",
                panic_msg(&p)
            ))
        }
        Ok(Err(e)) => check_error(&e)?,
        Ok(Ok(())) => {}
    }
    match catch_unwind(AssertUnwindSafe(|| decode(input))) {
        Err(p) => Err(format!("decode panicked: {}", panic_msg(&p))),
        Ok(Err(e)) => check_error(&e).map(|_| false),
        Ok(Ok(map)) => match catch_unwind(AssertUnwindSafe(|| exercise(&map))) {
            Err(p) => Err(format!("decoded map panics: {}", panic_msg(&p))),
            Ok(r) => r.map(|_| true),
        },
    }
}

fn panic_msg(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic)".into()
    }
}

fn save(input: &[u8], tag: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-fail-{tag}.bin"));
    let _ = std::fs::write(&p, input);
    p
}

/// Shared with the watchdog: the case being run.
#[derive(Default)]
struct Current {
    label: String,
    input: Vec<u8>,
    started: Option<Instant>,
}

#[test]
fn mutated_maps_decode_to_error_or_mappable_map() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = seeds(dir.path());
    let nseeds = seeds.len();
    let seed = env_u64("IOLIFT_FUZZ_SEED", 1);
    let default_iters = if cfg!(debug_assertions) {
        1_000
    } else {
        16_000
    };
    let iters = env_u64("IOLIFT_FUZZ_ITERS", default_iters);
    let timeout = Duration::from_secs(env_u64("IOLIFT_FUZZ_TIMEOUT", 20));

    // Quiet the default hook: caught panics are reported below.
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));

    let cur = Arc::new(Mutex::new(Current::default()));
    let (done_tx, done_rx) = mpsc::channel();
    let worker_cur = cur.clone();
    let worker = std::thread::spawn(move || {
        let mut failures: Vec<String> = Vec::new();
        let mut decoded_ok = 0u64;
        let mut cases = 0u64;
        let mut slowest = (Duration::ZERO, String::new());
        let mut run = |label: String, input: &[u8], failures: &mut Vec<String>| {
            {
                let mut c = worker_cur.lock().unwrap();
                c.label.clone_from(&label);
                c.input.clear();
                c.input.extend_from_slice(input);
                c.started = Some(Instant::now());
            }
            cases += 1;
            let t0 = Instant::now();
            let res = one_case(input);
            let dt = t0.elapsed();
            if dt > slowest.0 {
                slowest = (dt, label.clone());
                save(input, "slowest");
            }
            match res {
                Ok(true) => decoded_ok += 1,
                Ok(false) => {}
                Err(e) => {
                    if failures.len() < 50 {
                        let p = save(input, &failures.len().to_string());
                        failures.push(format!("{label}: {e} (input: {})", p.display()));
                    }
                }
            }
            worker_cur.lock().unwrap().started = None;
        };
        // Deterministic part: every truncation of every seed.
        for (name, bytes) in &seeds {
            for at in 0..bytes.len() {
                run(format!("{name} truncate@{at}"), &bytes[..at], &mut failures);
            }
        }
        let mut rng = Rng::new(seed);
        for i in 0..iters {
            let (name, bytes) = &seeds[rng.index(seeds.len())];
            let mut buf = bytes.clone();
            let mut desc = Vec::new();
            // Mostly one mutation; sometimes a few stacked.
            let n = if rng.index(4) == 0 {
                2 + rng.index(3)
            } else {
                1
            };
            for _ in 0..n {
                desc.push(mutate(&mut rng, &mut buf));
            }
            run(
                format!("seed {seed} iter {i} {name} [{}]", desc.join(", ")),
                &buf,
                &mut failures,
            );
        }
        eprintln!(
            "decode_fuzz: slowest case {:?}: {} (input: fuzz-fail-slowest.bin)",
            slowest.0, slowest.1
        );
        let _ = done_tx.send(());
        (failures, cases, decoded_ok)
    });
    // Watchdog: a case that runs past the timeout is a hang.
    loop {
        match done_rx.recv_timeout(Duration::from_millis(500)) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let c = cur.lock().unwrap();
                if let Some(t) = c.started {
                    if t.elapsed() > timeout {
                        let p = save(&c.input, "hang");
                        std::panic::set_hook(prev);
                        panic!(
                            "case ran longer than {timeout:?} (hang): {} (input: {})",
                            c.label,
                            p.display()
                        );
                    }
                }
            }
        }
    }
    let joined = worker.join();
    std::panic::set_hook(prev);
    let (failures, cases, decoded_ok) = joined.expect("fuzz worker");
    eprintln!(
        "decode_fuzz: seed {seed}, {cases} cases ({nseeds} seeds, {iters} random), {decoded_ok} decoded and mapped"
    );
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Hand-made corruptions: each must be refused with a message that names
/// the problem.
#[test]
fn corrupt_maps_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let p = build(
        dir.path(),
        "m",
        &[
            "--num_osds",
            "8",
            "host",
            "straw2",
            "2",
            "root",
            "straw2",
            "0",
        ],
    );
    let good = std::fs::read(p).unwrap();
    let map = decode(&good).unwrap();
    let err = |bytes: &[u8]| decode(bytes).unwrap_err().to_string();

    assert!(err(&[]).contains("truncated at byte 0: magic"));
    assert!(err(b"not a crush map at all").contains("bad magic"));
    // A bucket item count larger than the rest of the map.
    let mut b = good.clone();
    b[32..36].copy_from_slice(&100_000u32.to_le_bytes());
    let e = err(&b);
    assert!(
        e.contains("truncated at byte 32: bucket -1 (slot 0) item count (100000 entries)"),
        "{e}"
    );
    // Cut inside the rules.
    let rules_at = encode(&CrushMap {
        rules: Vec::new(),
        type_names: Default::default(),
        names: Default::default(),
        rule_names: Default::default(),
        optional_groups: 0,
        ..map.clone()
    })
    .len()
        - 12;
    let e = err(&good[..rules_at + 6]);
    assert!(
        e.contains(&format!("truncated at byte {}", rules_at + 4))
            && e.contains("rule 0 step count"),
        "{e}"
    );
    // Header counts.
    let mut b = good.clone();
    b[12..16].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    assert!(
        err(&b).contains("max_devices 2147483647 out of range"),
        "{}",
        err(&b)
    );
    let mut b = good.clone();
    b[4..8].copy_from_slice(&0x4000_0000u32.to_le_bytes());
    assert!(
        err(&b).contains("max_buckets 1073741824 out of range"),
        "{}",
        err(&b)
    );
    // A bucket containing its parent: host -1 gets the root as an item.
    let root = (0..map.buckets.len())
        .find(|&i| {
            map.buckets[i]
                .as_ref()
                .is_some_and(|b| b.items.iter().any(|&it| it < 0))
        })
        .unwrap();
    let root_id = -1 - root as i32;
    let child = map.buckets[root].as_ref().unwrap().items[0];
    let mut m2 = map.clone();
    m2.buckets[(-1 - child) as usize].as_mut().unwrap().items[0] = root_id;
    let e = err(&encode(&m2));
    assert!(e.contains("cycle"), "{e}");
    // Unknown algorithm, wrong id.
    let mut b = good.clone();
    b[16..20].copy_from_slice(&9u32.to_le_bytes());
    assert!(
        err(&b).contains("unknown bucket algorithm 9"),
        "{}",
        err(&b)
    );
    let mut b = good.clone();
    b[20..24].copy_from_slice(&(-7i32).to_le_bytes());
    assert!(err(&b).contains("holds id -7, expected -1"), "{}", err(&b));
    // Absurd tunables / steps.
    let mut m2 = map.clone();
    m2.tunables.choose_total_tries = 0x7fff_ffff;
    assert!(err(&encode(&m2)).contains("choose_total_tries 2147483647 out of range"));
    let mut m2 = map.clone();
    let r = m2.rules[0].as_mut().unwrap();
    let s = r.steps.iter_mut().find(|s| s.op >= 2 && s.op != 4).unwrap();
    s.arg1 = 1 << 30;
    let e = err(&encode(&m2));
    assert!(
        e.contains("rule 0") && e.contains("argument 1073741824 out of range"),
        "{e}"
    );
    // Trailing garbage.
    let mut b = good.clone();
    b.extend_from_slice(&[1, 2, 3]);
    let e = err(&b);
    assert!(e.contains("3 unexpected trailing bytes"), "{e}");
}

/// One workspace used for maps of different shapes, interleaved, gives the
/// results of a fresh workspace per map (the permutation cache of uniform
/// buckets must never leak from one map's bucket into another's).
#[test]
fn one_workspace_serves_maps_of_any_shape() {
    let dir = tempfile::tempdir().unwrap();
    let maps: Vec<CrushMap> = seeds(dir.path())
        .iter()
        .map(|(_, b)| decode(b).unwrap())
        .collect();
    let mut shared = Workspace::default();
    for x in 0..200 {
        for m in &maps {
            let weight = test_weights(m, &[]);
            for (ruleno, rule) in m.rules.iter().enumerate() {
                if rule.is_none() {
                    continue;
                }
                let (mut a, mut b) = ([0i32; 5], [0i32; 5]);
                let mut fresh = Workspace::new(m, 5);
                let na = do_rule(m, ruleno as i32, x, &mut a, &weight, &mut shared, None);
                let nb = do_rule(m, ruleno as i32, x, &mut b, &weight, &mut fresh, None);
                assert_eq!(a[..na], b[..nb], "rule {ruleno} x {x}");
            }
        }
    }
}
