//! Unit tests of the `ec` backend on memory and file children (the NBD
//! clients' tests are in tests/ec_device.rs).

use super::*;
use crate::block::{BlockDevExt, Flags};
use bytes::Bytes;
use std::path::Path;

pub(super) fn spec(children: &str, opts: &str) -> String {
    format!("ec:{children},{opts}")
}

pub(super) fn files(dir: &Path, n: usize, size: &str) -> String {
    format!("file:{}/s{{0..{}}}.img+size={size}", dir.display(), n - 1)
}

/// splitmix64, for reproducible data and offsets.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

pub(super) fn rnd(seed: u64, n: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

pub(super) fn open_ec(s: &str) -> (DevRef, Arc<Inner>) {
    let bs = crate::backend::BackendSpec::parse(s).unwrap();
    bs.opts.check(OPTIONS).unwrap();
    let cfg = parse(&bs).unwrap();
    let inner = open::start(cfg).unwrap();
    let dev: DevRef = Arc::new(EcDev {
        inner: inner.clone(),
        rebuild_started: AtomicBool::new(true),
        idle_started: AtomicBool::new(false),
    });
    (dev, inner)
}

#[tokio::test]
async fn writes_of_every_shape_read_back() {
    // the default (bitmap, write-back buffer), a buffer small enough to
    // evict, and the journal without a buffer
    for opts in [
        "chunk=16K,slots=4",
        "chunk=16K,slots=4,wb=96K",
        "chunk=16K,slots=4,wb=0,consistency=journal",
    ] {
        writes_read_back(opts).await;
    }
}

async fn writes_read_back(opts: &str) {
    let s = spec(
        "memory:8M;memory:8M;memory:8M;memory:8M;memory:8M;memory:8M",
        opts,
    );
    let (d, inner) = open_ec(&s);
    let size = d.info().size;
    assert_eq!(size, inner.geo.stripes * 4 * 16384);
    let mut model = vec![0u8; size as usize];
    let mut r = Rng(5);
    for i in 0..200 {
        let mut len = 1 + (r.next_u64() % 150_000) as usize;
        let mut off = r.next_u64() % (size - len as u64);
        if i % 2 == 0 {
            // 4 KiB aligned: the write-back buffer takes these
            len = (len / 4096).max(1) * 4096;
            off = off / 4096 * 4096;
        }
        let data = rnd(i, len);
        model[off as usize..off as usize + len].copy_from_slice(&data);
        d.write(off, Bytes::from(data), Flags::NONE).await.unwrap();
        if i % 10 == 9 {
            // reads see buffered writes
            let a = off.saturating_sub(5000).min(size - 70_000);
            let got = d.read(a, 70_000).await.unwrap();
            let a = a as usize;
            assert_eq!(&got[..], &model[a..a + 70_000], "{opts}: write {i}");
        }
    }
    d.flush().await.unwrap();
    for _ in 0..100 {
        let len = 1 + (r.next_u64() % 200_000) as usize;
        let off = r.next_u64() % (size - len as u64);
        let got = d.read(off, len as u32).await.unwrap();
        assert_eq!(
            &got[..],
            &model[off as usize..off as usize + len],
            "{opts}: {off}+{len}"
        );
    }
    let c = rebuild::check(&inner, &|_| {}).await;
    assert_eq!(
        (c.unreadable, c.inconsistent, c.crc_errors),
        (0, 0, 0),
        "{c}"
    );
}

#[tokio::test]
async fn lost_children_corruption_and_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(&files(dir.path(), 6, "8M"), "chunk=16K,slots=4,rebuild=off");
    let data = rnd(1, 4 << 20);
    {
        let (d, _) = open_ec(&s);
        d.write(0, Bytes::from(data.clone()), Flags::NONE)
            .await
            .unwrap();
        d.close().await.unwrap();
    }
    // two children lost (m = 2): the data is still there
    std::fs::remove_file(dir.path().join("s1.img")).unwrap();
    std::fs::remove_file(dir.path().join("s4.img")).unwrap();
    let (d, inner) = open_ec(&s);
    assert_eq!(inner.degraded(), 2);
    assert_eq!(&d.read(0, 4 << 20).await.unwrap()[..], &data[..]);
    assert!(inner.metrics.decodes.load(Ordering::Relaxed) > 0);
    // degraded writes, then a rebuild restores full redundancy
    let more = rnd(2, 100_000);
    d.write(12345, Bytes::from(more.clone()), Flags::NONE)
        .await
        .unwrap();
    let mut model = data.clone();
    model[12345..12345 + more.len()].copy_from_slice(&more);
    let r = rebuild::rebuild(&inner, &rebuild::targets(&inner), &|_| {})
        .await
        .unwrap();
    assert_eq!(r.children, vec![1, 4]);
    assert_eq!(inner.degraded(), 0);
    d.close().await.unwrap();
    drop((d, inner));
    // lose two others: only the rebuilt ones and two more are left
    std::fs::remove_file(dir.path().join("s0.img")).unwrap();
    std::fs::remove_file(dir.path().join("s5.img")).unwrap();
    let (d, inner) = open_ec(&s);
    assert_eq!(&d.read(0, 4 << 20).await.unwrap()[..], &model[..]);
    let r = rebuild::rebuild(&inner, &rebuild::targets(&inner), &|_| {})
        .await
        .unwrap();
    assert_eq!(r.children, vec![0, 5]);
    let c = rebuild::check(&inner, &|_| {}).await;
    assert_eq!((c.unreadable, c.inconsistent), (0, 0), "{c}");
    let geo = inner.geo;
    d.close().await.unwrap();
    drop((d, inner));
    // corrupt a block of data chunk 2 of stripe 3 on disk
    let at = geo.chunk_off(3) + 8192;
    let p = dir.path().join("s2.img");
    let mut img = std::fs::read(&p).unwrap();
    let before = img[at as usize..at as usize + 4096].to_vec();
    img[at as usize + 100] ^= 0x5a;
    std::fs::write(&p, &img).unwrap();
    let (d, inner) = open_ec(&s);
    let logical = 3 * geo.stripe_bytes() + 2 * geo.chunk + 8192;
    let got = d.read(logical, 4096).await.unwrap();
    assert_eq!(&got[..], &model[logical as usize..logical as usize + 4096]);
    assert_eq!(inner.metrics.repairs.load(Ordering::Relaxed), 1);
    d.close().await.unwrap();
    let img = std::fs::read(&p).unwrap();
    assert_eq!(
        &img[at as usize..at as usize + 4096],
        &before[..],
        "repaired in place"
    );
}

#[tokio::test]
async fn journal_replays_committed_updates_and_drops_torn_ones() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &files(dir.path(), 6, "4M"),
        "chunk=16K,slots=4,rebuild=off,consistency=journal",
    );
    let (a, b) = (rnd(3, 64 << 10), rnd(4, 64 << 10));
    let geo;
    {
        let (d, inner) = open_ec(&s);
        geo = inner.geo;
        d.write(0, Bytes::from(a.clone()), Flags::NONE)
            .await
            .unwrap();
        d.write(0, Bytes::from(b.clone()), Flags::NONE)
            .await
            .unwrap();
        d.close().await.unwrap();
    }
    // stripe 0's in-place chunks put back to `a`, as if the crash came
    // between the journal and the in-place writes: replay gives `b`
    let old_chunk = |c: usize| -> Vec<u8> {
        if c < 4 {
            a[c * 16384..(c + 1) * 16384].to_vec()
        } else {
            let codec =
                Codec::new(&Profile::parse("plugin=isa technique=reed_sol_van k=4 m=2").unwrap())
                    .unwrap();
            let srcs: Vec<&[u8]> = a.chunks(16384).collect();
            let mut p = vec![vec![0u8; 16384]; 2];
            let mut o: Vec<&mut [u8]> = p.iter_mut().map(|v| v.as_mut_slice()).collect();
            codec.encode(&srcs, &mut o).unwrap();
            p[c - 4].clone()
        }
    };
    let put = |c: usize, at: u64, bytes: &[u8]| {
        let p = dir.path().join(format!("s{c}.img"));
        let mut img = std::fs::read(&p).unwrap();
        img[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
        std::fs::write(&p, &img).unwrap();
    };
    let put_old = |c: usize| {
        put(c, geo.chunk_off(0), &old_chunk(c));
        let mut m = Vec::new();
        for v in layout::crcs(&old_chunk(c)) {
            m.extend_from_slice(&v.to_le_bytes());
        }
        put(c, geo.meta_off(0, 0), &m);
    };
    for c in 0..6 {
        put_old(c);
    }
    {
        let (d, inner) = open_ec(&s);
        assert_eq!(inner.metrics.replayed.load(Ordering::Relaxed), 1);
        assert_eq!(&d.read(0, 64 << 10).await.unwrap()[..], &b[..]);
        d.close().await.unwrap();
    }
    // a torn update: one child's journal entry gone and the chunks old
    // again: replay drops it, and the stripe reads as `a` everywhere
    for c in 0..6 {
        put_old(c);
    }
    put(5, geo.slot_off(0), &[0u8; 4096]);
    let (d, inner) = open_ec(&s);
    assert_eq!(inner.metrics.replayed.load(Ordering::Relaxed), 0);
    assert_eq!(&d.read(0, 64 << 10).await.unwrap()[..], &a[..]);
    let c = rebuild::check(&inner, &|_| {}).await;
    assert_eq!(
        (c.unreadable, c.inconsistent, c.crc_errors),
        (0, 0, 0),
        "{c}"
    );
}

#[tokio::test]
async fn failing_child_is_dropped_and_too_many_losses_fail() {
    let dir = tempfile::tempdir().unwrap();
    let kids = format!(
        "file:{0}/s0.img+size=4M;file:{0}/s{{1..5}}.img+size=4M",
        dir.path().display()
    );
    let s = spec(&kids, "chunk=16K,slots=4,rebuild=off");
    let data = rnd(9, 1 << 20);
    drop(open_ec(&s));
    // child 0 cannot be opened (its file is gone and has no size):
    // the device starts without it
    std::fs::remove_file(dir.path().join("s0.img")).unwrap();
    let s = s.replace("s0.img+size=4M", "s0.img");
    let (d, inner) = open_ec(&s);
    assert_eq!(inner.degraded(), 1);
    d.write(4096, Bytes::from(data.clone()), Flags::FUA)
        .await
        .unwrap();
    assert_eq!(&d.read(4096, 1 << 20).await.unwrap()[..], &data[..]);
    d.close().await.unwrap();
    drop((d, inner));
    for f in ["s1.img", "s2.img", "s3.img"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    let bs = crate::backend::BackendSpec::parse(&s).unwrap();
    let e = format!("{:#}", open::start(parse(&bs).unwrap()).err().unwrap());
    assert!(e.contains("at most m=2"), "{e}");
}

#[test]
fn bad_specs_name_the_part() {
    for (s, want) in [
        ("ec:memory:1M;memory:1M,k=2,m=1", "k+m = 3"),
        ("ec:memory:1M{0..2},k=1,m=2", "k"),
        (
            "ec:memory:1M;memory:1M;memory:1M,k=2,m=1,chunk=1000",
            "option chunk",
        ),
        (
            "ec:memory:1M;memory:1M;memory:1M,k=2,m=1,technique=bogus",
            "technique",
        ),
        ("ec:memory:1M;memory:1M;nope:1M,k=2,m=1", "child 2"),
        (
            "ec:memory:1M;memory:1M;memory:1M,k=2,m=1,slots=0",
            "option slots",
        ),
        ("ec:memory:1M;;memory:1M,k=2,m=1", "empty child"),
        (
            "ec:memory:1M;memory:1M;memory:1M,k=2,m=1,wb_bg=65",
            "option wb_bg",
        ),
        (
            "ec:memory:1M;memory:1M;memory:1M,k=2,m=1,run=0",
            "option run",
        ),
    ] {
        let e = match crate::backend::check_spec(s) {
            Ok(()) => panic!("{s} accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains(want), "{s}: {e}");
    }
    crate::backend::check_spec("ec:memory:64M;memory:64M;memory:64M,k=2,m=1").unwrap();
}
