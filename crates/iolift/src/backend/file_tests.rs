//! Unit tests of the file backend (`file.rs`): the inline paths and
//! O_DIRECT alignment.

use super::*;
use crate::block::{BlockDevExt, Completion, Flags};
use std::thread::ThreadId;

/// Submits through `submit_cb`; the completion and the thread that
/// called back.
async fn call(dev: &DevRef, req: Request) -> (Completion, ThreadId) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    dev.submit_cb(
        req,
        Box::new(move |c| drop(tx.send((c, std::thread::current().id())))),
    );
    rx.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_writes_runs_every_request_on_the_callers_thread() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.img");
    let dev = crate::backend::open(&format!("file:{},size=1M,inline_writes", p.display())).unwrap();
    assert!(dev.native_callbacks());
    let me = std::thread::current().id();
    let data = Bytes::from((0..65536u32).map(|i| (i % 253) as u8).collect::<Vec<u8>>());
    // back to back, so never alone: inline_writes still runs each here,
    // and the callback has run when submit_cb returns
    for i in 0..8u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        let w = Request::Write {
            offset: i * 65536,
            data: data.clone(),
            flags: Flags::default(),
        };
        dev.submit_cb(
            w,
            Box::new(move |c| drop(tx.send((c, std::thread::current().id())))),
        );
        let (r, t) = rx
            .try_recv()
            .expect("called back before submit_cb returned");
        assert!(matches!(r, Ok(Reply::Done(65536))), "{r:?}");
        assert_eq!(t, me);
    }
    let got = std::fs::read(&p).unwrap();
    for i in 0..8 {
        assert_eq!(&got[i * 65536..(i + 1) * 65536], &data[..]);
    }
    // a bad range is an error through the callback, not a panic
    let (tx, rx) = std::sync::mpsc::channel();
    let w = Request::Write {
        offset: 1 << 20,
        data: data.clone(),
        flags: Flags::default(),
    };
    dev.submit_cb(w, Box::new(move |c| drop(tx.send(c))));
    assert!(rx.try_recv().unwrap().is_err());
    let e = crate::backend::check_spec(&format!("file:{},engine=uring,inline_writes", p.display()))
        .unwrap_err();
    assert!(format!("{e:#}").contains("needs engine=threads"), "{e:#}");
}

/// O_DIRECT writes from aligned and unaligned memory, at aligned and
/// unaligned offsets, and reads of both kinds, against a model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_io_of_every_alignment_matches_a_model() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("d.img");
    let size = 1usize << 20;
    let dev = crate::backend::open(&format!("file:{},size=1M,direct", p.display())).unwrap();
    let mut model = vec![0u8; size];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // an aligned allocation to take slices of at chosen addresses
    let mut backing = BytesMut::zeroed(3 * 65536 + 2 * ALIGN);
    let base = backing.as_ptr() as usize;
    let first = (ALIGN - base % ALIGN) % ALIGN;
    for (i, v) in backing.iter_mut().enumerate() {
        *v = (i % 241) as u8 ^ 0x5a;
    }
    let backing = backing.freeze();
    for (off, len, mis) in [
        (0usize, 65536usize, 0usize), // aligned file range and memory: no bounce
        (65536, 65536, 16),           // aligned range, unaligned memory
        (4096 * 7, 8192, 0),
        (1000, 5000, 3), // unaligned: read-modify-write of the edges
        (size - 4096, 4096, 0),
        (size - 100, 100, 1),
    ] {
        let at = first + mis + (next() % 4) as usize * ALIGN;
        let data = backing.slice(at..at + len);
        assert_eq!((data.as_ptr() as usize).is_multiple_of(ALIGN), mis == 0);
        dev.write(off as u64, data.clone(), Flags::NONE)
            .await
            .unwrap();
        model[off..off + len].copy_from_slice(&data);
        for (ro, rl) in [
            (off, len),
            (off / ALIGN * ALIGN, ALIGN.min(size - off / ALIGN * ALIGN)),
            (0, size),
        ] {
            let got = dev.read(ro as u64, rl as u32).await.unwrap();
            assert_eq!(
                &got[..],
                &model[ro..ro + rl],
                "read {ro}+{rl} after write {off}+{len}"
            );
        }
    }
    assert_eq!(std::fs::read(&p).unwrap(), model);
}

#[test]
fn inline_us_is_checked() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("a.img");
    let f = f.display();
    for (s, want) in [
        (
            format!("file:{f},size=1M,engine=uring,inline_us=5"),
            "needs engine=threads",
        ),
        (format!("file:{f},size=1M,inline_us=2000000"), "inline_us"),
        (format!("file:{f},size=1M,inline_us=x"), "inline_us"),
    ] {
        let e = format!("{:#}", crate::backend::check_spec(&s).unwrap_err());
        assert!(e.contains(want), "{s}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_request_runs_on_the_callers_thread() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.img");
    // a long gap (100 ms), so that a test thread descheduled between
    // two requests cannot make the second one look alone
    let spec = format!("file:{},size=1M,direct,inline_us=100000", p.display());
    let dev = crate::backend::open(&spec).unwrap();
    let idle = Duration::from_millis(150);
    assert!(dev.native_callbacks(), "inline needs native callbacks");
    let me = std::thread::current().id();
    let data = Bytes::from((0..8192u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    tokio::time::sleep(idle).await;
    let w = Request::Write {
        offset: 8192,
        data: data.clone(),
        flags: Flags::default(),
    };
    let (r, t) = call(&dev, w).await;
    assert!(matches!(r, Ok(Reply::Done(8192))), "{r:?}");
    assert_eq!(t, me, "an idle device runs a lone request inline");
    // right after the answer: not alone, so on the pool, and the
    // device stays off the inline path for DEPTH_HOLD
    let rd = || Request::Read {
        offset: 8192,
        len: 8192,
    };
    for _ in 0..2 {
        let (r, t) = call(&dev, rd()).await;
        assert!(matches!(&r, Ok(Reply::Data(b)) if *b == data), "{r:?}");
        assert_ne!(t, me, "a request right after an answer is not alone");
    }
    tokio::time::sleep(idle).await;
    let (r, t) = call(&dev, rd()).await;
    assert!(matches!(&r, Ok(Reply::Data(b)) if *b == data), "{r:?}");
    assert_eq!(t, me, "idle again: inline again");
    // many at once, mixed: every one answered with the right bytes
    let futs: Vec<_> = (0..16).map(|_| dev.submit(rd())).collect();
    for f in futs {
        assert!(matches!(f.await, Ok(Reply::Data(b)) if b == data));
    }
    // inline_us=0: never inline, and then no native callbacks
    let off = crate::backend::open(&format!("file:{},inline_us=0", p.display())).unwrap();
    assert!(!off.native_callbacks());
    tokio::time::sleep(Duration::from_millis(2)).await;
    let (r, _) = call(&off, rd()).await;
    assert!(matches!(&r, Ok(Reply::Data(b)) if *b == data), "{r:?}");
}
