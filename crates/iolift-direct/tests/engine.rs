//! The io_uring engine against an in-memory model: random reads and writes
//! on an image file (buffered and O_DIRECT, with and without registered
//! buffers, SQPOLL, IOPOLL where the device takes it) and on a loop device;
//! short reads at the end; errors as -errno; batching.

use iolift_direct::{Buf, Config, Direct, Done, Engine, Op, Open, Target};
use iolift_testkit::Rng;
use std::path::Path;
use std::sync::mpsc;

fn open(path: &Path, direct: Direct, size: Option<u64>) -> Target {
    let o = Open {
        direct,
        create_size: size,
        ..Open::default()
    };
    Target::open(path, &o).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Random batches of non-overlapping reads and writes, each batch in flight
/// at once; every read is compared with the model, and at the end the
/// whole device is read back and compared.
fn model_run(eng: &Engine, seed: u64, rounds: usize) {
    let size = eng.target().size();
    let align = eng.target().align().max(1) as u64;
    let mut model = vec![0u8; size as usize];
    // Start from the device's contents.
    let all = eng.read(0, size as usize).wait();
    assert_eq!(all.res as u64, size, "initial read");
    model.copy_from_slice(&all.buf.unwrap()[..size as usize]);
    let mut rng = Rng::new(seed);
    println!("seed {seed}, size {size}, align {align}");
    for round in 0..rounds {
        let n = 1 + rng.index(16);
        let mut taken: Vec<(u64, u64)> = Vec::new();
        let (tx, rx) = mpsc::channel::<(usize, Done)>();
        let mut ops = Vec::new();
        let mut expect: Vec<(bool, u64, Vec<u8>)> = Vec::new();
        for i in 0..n {
            let units = size / align;
            let max_len = (64 * 1024 / align).max(1);
            let len = (1 + rng.below(max_len)).min(units) * align;
            let off = rng.below(units - len / align + 1) * align;
            if taken.iter().any(|&(o, l)| off < o + l && o < off + len) {
                continue;
            }
            taken.push((off, len));
            let write = rng.chance(1, 2);
            let tx = tx.clone();
            let cb = Box::new(move |d: Done| tx.send((i, d)).unwrap());
            if write {
                let mut b = eng.alloc(len as usize);
                rng.fill(&mut b);
                let data = b.to_vec();
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
                expect.push((true, off, data));
                ops.push((
                    Op::Write {
                        offset: off,
                        buf: b,
                    },
                    cb as _,
                ));
            } else {
                let b = eng.alloc(len as usize);
                expect.push((
                    false,
                    off,
                    model[off as usize..(off + len) as usize].to_vec(),
                ));
                ops.push((
                    Op::Read {
                        offset: off,
                        buf: b,
                    },
                    cb as _,
                ));
            }
        }
        let k = ops.len();
        eng.submit_batch(ops);
        drop(tx);
        let mut got: Vec<(usize, Done)> = rx.iter().collect();
        assert_eq!(got.len(), k, "round {round}: completions");
        got.sort_by_key(|g| g.0);
        // Indices skipped for overlap leave gaps: match by order.
        for ((_, d), (write, off, data)) in got.iter().zip(&expect) {
            assert_eq!(
                d.res as usize,
                data.len(),
                "seed {seed} round {round}: {} at {off} len {}",
                if *write { "write" } else { "read" },
                data.len()
            );
            if !write {
                let b = d.buf.as_ref().unwrap();
                assert!(
                    b[..data.len()] == data[..],
                    "seed {seed} round {round}: read at {off} len {} differs from the model",
                    data.len()
                );
            }
        }
        if rng.chance(1, 8) {
            assert_eq!(eng.flush().wait().res, 0, "flush");
        }
    }
    let all = eng.read(0, size as usize).wait();
    assert_eq!(all.res as u64, size);
    assert!(
        all.buf.unwrap()[..] == model[..],
        "seed {seed}: final image differs"
    );
}

fn image(dir: &Path, size: u64) -> std::path::PathBuf {
    let p = dir.join("disk.img");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    p
}

#[test]
fn random_io_buffered_matches_model() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), (4 << 20) + 777);
    let eng = Engine::new(open(&p, Direct::Off, None), Config::default()).unwrap();
    assert!(!eng.target().is_direct());
    model_run(&eng, 1, 200);
}

#[test]
fn random_io_direct_fixed_buffers_matches_model() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 4 << 20);
    let t = open(&p, Direct::On, None);
    assert!(t.is_direct(), "O_DIRECT on the test's temp dir");
    let cfg = Config {
        fixed_bufs: 8,
        fixed_buf_size: 64 << 10,
        ..Config::default()
    };
    let eng = Engine::new(t, cfg).unwrap();
    model_run(&eng, 2, 200);
    assert_eq!(
        eng.pool().unwrap().available(),
        8,
        "every fixed buffer back"
    );
}

#[test]
fn random_io_sqpoll_matches_model() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 2 << 20);
    let cfg = Config {
        sqpoll: Some(50),
        fixed_bufs: 4,
        ..Config::default()
    };
    let eng = Engine::new(open(&p, Direct::Auto, None), cfg).unwrap();
    model_run(&eng, 3, 100);
}

#[test]
fn iopoll_works_or_says_why_not() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 1 << 20);
    let cfg = Config {
        iopoll: true,
        ..Config::default()
    };
    // Without O_DIRECT: refused by the engine itself.
    let e = Engine::new(open(&p, Direct::Off, None), cfg.clone())
        .err()
        .expect("IOPOLL without O_DIRECT accepted");
    assert!(e.to_string().contains("IOPOLL needs O_DIRECT"), "{e}");
    match Engine::new(open(&p, Direct::On, None), cfg) {
        Ok(eng) => {
            println!("IOPOLL works on this file system's device");
            model_run(&eng, 4, 50);
        }
        Err(e) => {
            println!("IOPOLL refused: {e}");
            assert!(e.to_string().contains("IOPOLL is not supported"), "{e}");
        }
    }
}

#[test]
fn short_reads_at_the_end() {
    let d = tempfile::tempdir().unwrap();
    let size = (1 << 20) + 1000;
    let p = image(d.path(), size);
    for direct in [Direct::Off, Direct::On] {
        let eng = Engine::new(open(&p, direct, None), Config::default()).unwrap();
        // Straddling the end: only the bytes before it.
        let r = eng.read(1 << 20, 4096).wait();
        assert_eq!(r.res, 1000, "{direct:?}: read across the end");
        // At and past the end: 0.
        let r = eng.read(size.div_ceil(4096) * 4096, 4096).wait();
        assert_eq!(r.res, 0, "{direct:?}: read past the end");
        if direct == Direct::Off {
            let r = eng.read(size - 10, 100).wait();
            assert_eq!(r.res, 10, "buffered read of the last 10 bytes");
            assert_eq!(eng.read(size, 1).wait().res, 0);
        }
    }
}

#[test]
fn errors_come_back_as_negative_errno() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 1 << 20);
    // A write-only target cannot be read, a read-only one not written.
    let wo = Target::open(
        &p,
        &Open {
            read: false,
            write: true,
            direct: Direct::Off,
            create_size: None,
        },
    )
    .unwrap();
    let eng = Engine::new(wo, Config::default()).unwrap();
    assert_eq!(
        eng.read(0, 512).wait().res,
        -libc::EBADF,
        "read of a write-only fd"
    );
    let buf = Buf::Vec(vec![7u8; 512]);
    assert_eq!(eng.write(0, buf).wait().res, 512);
    drop(eng);
    let ro = Target::open(
        &p,
        &Open {
            write: false,
            direct: Direct::Off,
            ..Open::default()
        },
    )
    .unwrap();
    let eng = Engine::new(ro, Config::default()).unwrap();
    let w = eng.write(0, Buf::Vec(vec![1; 512])).wait();
    assert_eq!(w.res, -libc::EBADF, "write to a read-only fd");
    assert_eq!(&eng.read(0, 4).wait().buf.unwrap()[..4], &[7, 7, 7, 7]);
    assert_eq!(eng.read(0, 4).wait().result().unwrap(), 4);
    drop(eng);
    // O_DIRECT: an unaligned offset, length or buffer is EINVAL.
    let eng = Engine::new(open(&p, Direct::On, None), Config::default()).unwrap();
    assert_eq!(
        eng.read(100, 4096).wait().res,
        -libc::EINVAL,
        "unaligned offset"
    );
    assert_eq!(
        eng.read(0, 100).wait().res,
        -libc::EINVAL,
        "unaligned length"
    );
    let mut v = vec![0u8; 8192 + 1];
    let unaligned = !(v.as_mut_ptr() as usize).is_multiple_of(4096);
    if unaligned {
        let r = eng
            .run(Op::Read {
                offset: 0,
                buf: Buf::Vec(v),
            })
            .wait();
        assert_eq!(r.res, -libc::EINVAL, "unaligned memory");
    }
    // Past the file system's largest file: EFBIG; past i64: EINVAL.
    let far = eng.write(1 << 60, eng.alloc(4096)).wait();
    assert_eq!(far.res, -libc::EFBIG, "write past the largest file size");
    let r = eng.read(u64::MAX - 4095, 4096).wait();
    assert_eq!(r.res, -libc::EINVAL, "offset past i64");
    let e = r.result().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
}

#[test]
fn one_submission_for_a_queued_batch() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 1 << 20);
    let eng = Engine::new(open(&p, Direct::Auto, None), Config::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let ops: Vec<(Op, iolift_direct::Callback)> = (0..32u64)
        .map(|i| {
            let tx = tx.clone();
            let cb: iolift_direct::Callback = Box::new(move |d: Done| tx.send(d.res).unwrap());
            (
                Op::Read {
                    offset: i * 4096,
                    buf: eng.alloc(4096),
                },
                cb,
            )
        })
        .collect();
    eng.submit_batch(ops);
    drop(tx);
    let res: Vec<i32> = rx.iter().collect();
    assert_eq!(res, vec![4096; 32]);
    let s = eng.stats();
    assert!(s.max_batch >= 32, "{s:?}");
    assert!(s.ops >= 32, "{s:?}");
    assert!(s.enters < 32, "one enter per request: {s:?}");
}

#[test]
fn drop_completes_queued_requests() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 1 << 20);
    let eng = Engine::new(open(&p, Direct::Off, None), Config::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    for i in 0..100u64 {
        let tx = tx.clone();
        eng.submit(
            Op::Write {
                offset: i * 100,
                buf: Buf::Vec(vec![i as u8; 100]),
            },
            Box::new(move |d| tx.send(d.res).unwrap()),
        );
    }
    drop(eng);
    drop(tx);
    let res: Vec<i32> = rx.iter().collect();
    assert_eq!(res, vec![100; 100]);
    let data = std::fs::read(&p).unwrap();
    for i in 0..100usize {
        assert!(data[i * 100..i * 100 + 100].iter().all(|&b| b == i as u8));
    }
}

#[test]
fn open_checks() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("missing.img");
    let e = Target::open(&p, &Open::default()).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let t = open(&p, Direct::Auto, Some(3 << 20));
    assert_eq!(t.size(), 3 << 20);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 3 << 20);
    assert!(t.fallback().is_none() == t.is_direct());
}

#[test]
fn random_io_on_a_loop_device() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 4 << 20);
    let lo = iolift_testkit::Loop::new(&p);
    let t = open(lo.path(), Direct::On, None);
    assert!(t.is_block() && t.is_direct());
    assert_eq!(t.size(), 4 << 20);
    assert!(t.align() >= 512, "logical block size {}", t.align());
    let cfg = Config {
        fixed_bufs: 4,
        ..Config::default()
    };
    let eng = Engine::new(t, cfg).unwrap();
    model_run(&eng, 5, 100);
    assert_eq!(eng.flush().wait().res, 0);
    // Past the end of a block device: 0 bytes.
    assert_eq!(eng.read(4 << 20, 4096).wait().res, 0);
}

#[test]
fn shared_bytes_are_written_and_refuse_reads() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 1 << 16);
    let eng = Engine::new(open(&p, Direct::Off, None), Config::default()).unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let w = eng.write(300, Buf::Shared(Box::new(data.clone()))).wait();
    assert_eq!(w.res, 1000);
    let r = eng.read(300, 1000).wait();
    assert_eq!(&r.buf.unwrap()[..1000], &data[..]);
    let bad = eng
        .run(Op::Read {
            offset: 0,
            buf: Buf::Shared(Box::new(vec![0u8; 10])),
        })
        .wait();
    assert_eq!(bad.res, -libc::EINVAL, "read into shared bytes");
}

#[test]
fn random_io_inline_matches_model() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 4 << 20);
    let t = open(&p, Direct::On, None);
    assert!(t.is_direct(), "O_DIRECT on the test's temp dir");
    let cfg = Config {
        inline: true,
        fixed_bufs: 8,
        fixed_buf_size: 64 << 10,
        ..Config::default()
    };
    let eng = Engine::new(t, cfg).unwrap();
    model_run(&eng, 6, 200);
    assert_eq!(
        eng.pool().unwrap().available(),
        8,
        "every fixed buffer back"
    );
}

/// Inline mode: callbacks run on the submitting thread before `submit`
/// returns; a batch larger than the submission queue still completes, in
/// one `io_uring_enter` per queue-full.
#[test]
fn inline_completes_on_the_callers_thread() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 1 << 20);
    let cfg = Config {
        inline: true,
        entries: 8,
        ..Config::default()
    };
    let eng = Engine::new(open(&p, Direct::Auto, None), cfg).unwrap();
    let me = std::thread::current().id();
    let (tx, rx) = mpsc::channel();
    let ops: Vec<(Op, iolift_direct::Callback)> = (0..32u64)
        .map(|i| {
            let tx = tx.clone();
            let mut b = eng.alloc(4096);
            b.fill(i as u8 + 1);
            let cb: iolift_direct::Callback =
                Box::new(move |d: Done| tx.send((std::thread::current().id(), d.res)).unwrap());
            (
                Op::Write {
                    offset: i * 4096,
                    buf: b,
                },
                cb,
            )
        })
        .collect();
    eng.submit_batch(ops);
    drop(tx);
    // Every completion is already there: nothing waits for a thread.
    let got: Vec<_> = rx.try_iter().collect();
    assert_eq!(got.len(), 32, "completions before submit_batch returned");
    assert!(got.iter().all(|&(t, r)| t == me && r == 4096), "{got:?}");
    let s = eng.stats();
    assert_eq!(s.ops, 32, "{s:?}");
    assert_eq!(s.max_batch, 8, "the queue holds 8: {s:?}");
    assert!(
        (4..=8).contains(&s.enters),
        "one enter per queue-full: {s:?}"
    );
    let before = eng.stats().enters;
    let r = eng.read(5 * 4096, 4096).wait();
    assert_eq!(r.res, 4096);
    assert!(r.buf.unwrap()[..4096].iter().all(|&b| b == 6));
    assert_eq!(eng.stats().enters, before + 1, "one enter for one read");
    assert_eq!(eng.flush().wait().res, 0);
    let s = eng.stats();
    assert_eq!(
        (s.writes, s.written_bytes, s.reads, s.read_bytes, s.flushes),
        (32, 32 * 4096, 1, 4096, 1),
        "requests and bytes counted as submitted: {s:?}"
    );
}

/// Inline mode spinning on the completion ring before it sleeps: the same
/// model holds, with and without SQPOLL; with SQPOLL (its thread awake for
/// a second after each submission) most requests cost no system call.
#[test]
fn inline_spinning_matches_model() {
    let d = tempfile::tempdir().unwrap();
    let p = image(d.path(), 4 << 20);
    for (seed, sqpoll, spin_us) in [(7, None, 200), (8, Some(1000), 20_000)] {
        let t = open(&p, Direct::On, None);
        assert!(t.is_direct(), "O_DIRECT on the test's temp dir");
        let cfg = Config {
            inline: true,
            sqpoll,
            spin_us,
            fixed_bufs: 8,
            fixed_buf_size: 64 << 10,
            ..Config::default()
        };
        let eng = Engine::new(t, cfg).unwrap();
        model_run(&eng, seed, 100);
        assert_eq!(
            eng.pool().unwrap().available(),
            8,
            "every fixed buffer back"
        );
        let s = eng.stats();
        println!("sqpoll {sqpoll:?} spin {spin_us} us: {s:?}");
        if sqpoll.is_some() {
            assert!(
                s.enters * 2 < s.ops,
                "SQPOLL with a spinning reaper: most requests without io_uring_enter: {s:?}"
            );
        }
    }
}
