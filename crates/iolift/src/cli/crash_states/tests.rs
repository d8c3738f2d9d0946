//! Unit tests of `crash-states`: logs written through the log-writes stage,
//! then the model, the specs and the replay checked against them.

use super::model::State;
use super::spec::encode_subset;
use super::*;
use crate::backend::memory::MemoryDev;
use crate::block::{BlockDev, BlockDevExt, DevRef, Flags, Request};
use crate::stage::log_writes::{LogWritesConfig, LogWritesDev};
use bytes::Bytes;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Writes a log through the stage: `ops` are (offset, byte, fua) writes
/// or `None` for a flush.
fn make_log(dir: &Path, ops: &[Option<(u64, u8, bool)>]) -> PathBuf {
    let p = dir.join("t.log");
    let mem: DevRef = Arc::new(MemoryDev::new(64 << 10));
    let dev = LogWritesDev::new(
        LogWritesConfig {
            path: p.clone(),
            sync: false,
            ack_flush_early: false,
        },
        mem,
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        for op in ops {
            match op {
                Some((off, b, fua)) => {
                    let flags = if *fua { Flags::FUA } else { Flags::NONE };
                    dev.write(*off, Bytes::from(vec![*b; 8192]), flags)
                        .await
                        .unwrap();
                }
                None => {
                    dev.submit(Request::Flush).await.unwrap();
                }
            }
        }
    });
    p
}

fn model(p: &Path, tear: Option<u64>) -> Model {
    Model::new(Log::open(p, false).unwrap(), tear).unwrap()
}

/// A zeroed 64 KiB image with state `s` applied.
fn state_image(dir: &Path, m: &Model, s: &State) -> File {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.join("i.img"))
        .unwrap();
    f.set_len(64 << 10).unwrap();
    m.apply(&f, 0, s, &mut Vec::new()).unwrap();
    f
}

/// The byte at each 8 KiB slot of the state's image.
fn image(m: &Model, s: &State) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let f = state_image(dir.path(), m, s);
    let mut b = vec![0u8; 64 << 10];
    f.read_exact_at(&mut b, 0).unwrap();
    b.chunks(8192).map(|c| c[0]).collect()
}

#[test]
fn durable_and_pending_follow_flushes_and_fua() {
    let dir = tempfile::tempdir().unwrap();
    // 0: w slot0=1, 1: flush, 2: w slot1=2, 3: FUA slot2=3, 4: w slot0=4
    let p = make_log(
        dir.path(),
        &[
            Some((0, 1, false)),
            None,
            Some((8192, 2, false)),
            Some((16384, 3, true)),
            Some((0, 4, false)),
        ],
    );
    let m = model(&p, None);
    assert_eq!(m.pending(0), [0]);
    assert_eq!(m.pending(4), [2, 4]);
    assert_eq!(m.first_pending(4), 2);
    assert_eq!(m.epoch, [0, 0, 1, 1, 1]);
    let none = State {
        point: 4,
        kept: vec![],
    };
    assert_eq!(image(&m, &none), [1, 0, 3, 0, 0, 0, 0, 0]);
    let all = State {
        point: 4,
        kept: m.units(4),
    };
    assert_eq!(image(&m, &all), [4, 2, 3, 0, 0, 0, 0, 0]);
    let s = decode_state(&m, "4:4").unwrap();
    assert_eq!(image(&m, &s), [4, 0, 3, 0, 0, 0, 0, 0]);
    assert_eq!(encode_subset(&m.pending(4), &s.kept), "4");
    assert_eq!(encode_subset(&m.pending(4), &all.kept), "all");
    assert_eq!(decode_state(&m, "4:2-4").unwrap(), all);
    for bad in ["9:all", "4:1", "4:7", "x", "4:2.1", "2:3"] {
        assert!(decode_state(&m, bad).is_err(), "{bad}");
    }
}

#[test]
fn tear_splits_pending_writes_into_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let p = make_log(dir.path(), &[Some((4096, 9, false))]);
    let m = model(&p, Some(4096));
    assert_eq!(m.pieces(0), [(4096, 4096), (8192, 4096)]);
    let s = decode_state(&m, "0:0.1").unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let f = state_image(dir2.path(), &m, &s);
    let mut b = vec![0u8; 3 * 4096];
    f.read_exact_at(&mut b, 0).unwrap();
    assert!(b[..8192].iter().all(|&x| x == 0), "piece 0 lost");
    assert!(b[8192..].iter().all(|&x| x == 9), "piece 1 kept");
    assert_eq!(encode_subset(&m.pending(0), &s.kept), "0.1");
}

#[test]
fn plan_covers_every_epoch_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut ops = Vec::new();
    for e in 0..10u64 {
        for w in 0..4u64 {
            ops.push(Some(((w * 8192) % (64 << 10), (e * 4 + w) as u8, false)));
        }
        ops.push(None);
    }
    let p = make_log(dir.path(), &ops);
    let m = model(&p, None);
    let mut a = CrashStatesArgs {
        log_file: p.clone(),
        base: p.clone(),
        check: None,
        replay: None,
        out: None,
        jobs: None,
        max_states: 1000,
        samples: 8,
        seed: 1,
        tear: None,
        from: None,
        cut_torn_tail: false,
        timeout: "1s".into(),
        workdir: None,
    };
    let s = plan(&m, &a);
    let epochs: HashSet<usize> = s.iter().map(|s| m.epoch[s.point]).collect();
    assert_eq!(epochs.len(), 10);
    assert!(s.len() > 20 && s.len() <= 100, "{}", s.len());
    assert!(s.windows(2).all(|w| w[0].point <= w[1].point));
    // Every epoch's flush point (all kept) is there.
    for e in 0..10 {
        let last = e * 5 + 3;
        assert!(s.iter().any(|x| x.point == last && x.kept.len() == 4));
    }
    assert_eq!(plan(&m, &a), s, "seeded");
    a.seed = 2;
    assert_ne!(plan(&m, &a), s);
    a.max_states = 5;
    assert_eq!(plan(&m, &a).len(), 5);
    a.max_states = 35;
    let s = plan(&m, &a);
    assert_eq!(s.len(), 35, "the budget is used up");
    let per: Vec<usize> = (0..10)
        .map(|e| s.iter().filter(|x| m.epoch[x.point] == e).count())
        .collect();
    assert!(per.iter().all(|&n| n == 3 || n == 4), "{per:?}");
    a.max_states = 1000;
    a.from = Some(m.rec(30).end);
    let s = plan(&m, &a);
    assert!(s.iter().all(|x| x.point >= 30), "--from");
}

#[test]
fn command_line_parses() {
    use clap::Parser;
    let cli = crate::cli::Cli::try_parse_from([
        "iolift",
        "--log",
        "debug",
        "crash-states",
        "r.log",
        "--base",
        "b.img",
        "--check",
        "true {}",
        "--jobs",
        "3",
        "--tear",
        "4k",
    ])
    .unwrap();
    let crate::cli::Cmd::CrashStates(a) = cli.cmd else {
        panic!("wrong command");
    };
    assert_eq!(cli.log, "debug");
    assert_eq!(a.log_file, Path::new("r.log"));
    assert_eq!((a.jobs, a.tear.as_deref()), (Some(3), Some("4k")));
    for bad in [
        &["iolift", "crash-states", "r.log", "--base", "b"][..],
        &[
            "iolift",
            "crash-states",
            "r.log",
            "--base",
            "b",
            "--replay",
            "1:all",
        ],
        &[
            "iolift",
            "crash-states",
            "r",
            "--base",
            "b",
            "--check",
            "x",
            "--replay",
            "1:all",
            "--out",
            "o",
        ],
    ] {
        assert!(crate::cli::Cli::try_parse_from(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn sparse_copy_keeps_data_and_holes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let f = File::create(&a).unwrap();
    f.set_len(4 << 20).unwrap();
    f.write_all_at(&[5u8; 4096], 1 << 20).unwrap();
    std::fs::write(&b, vec![1u8; 8 << 20]).unwrap();
    sparse_copy(&a, &b).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}
