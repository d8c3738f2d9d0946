//! Runs of whole stripes (run.rs): one write per child for file children,
//! one per chunk for memory children, the same bytes either way; the
//! write-back buffer's background writers and the journal read back.

use super::tests::{files, open_ec, rnd, spec};
use crate::block::{BlockDevExt, Flags};
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// Writes stripes 0..4 then 4..8 of a chunk=16K, k=4 device (64 KiB
/// stripes) as two 256 KiB writes; returns the child writes of the second
/// (the region's bitmap bit is on disk by then, so it is chunks only).
async fn two_runs(s: &str) -> u64 {
    let (d, inner) = open_ec(s);
    let data = rnd(41, 512 << 10);
    d.write(0, Bytes::copy_from_slice(&data[..256 << 10]), Flags::NONE)
        .await
        .unwrap();
    let before = inner.metrics.child_writes.load(Ordering::Relaxed);
    d.write(
        256 << 10,
        Bytes::copy_from_slice(&data[256 << 10..]),
        Flags::NONE,
    )
    .await
    .unwrap();
    let writes = inner.metrics.child_writes.load(Ordering::Relaxed) - before;
    assert_eq!(
        inner.metrics.stripe_writes.load(Ordering::Relaxed),
        8,
        "{s}"
    );
    assert_eq!(&d.read(0, 512 << 10).await.unwrap()[..], &data[..], "{s}");
    d.flush().await.unwrap();
    let c = super::rebuild::check(&inner, &|_| {}).await;
    assert_eq!((c.inconsistent, c.crc_errors), (0, 0), "{s}: {c}");
    d.close().await.unwrap();
    writes
}

#[tokio::test]
async fn a_run_of_whole_stripes_is_one_write_per_file_child() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(&files(dir.path(), 6, "4M"), "chunk=16K,slots=8,rebuild=off");
    assert_eq!(two_runs(&s).await, 6);
    let mem = "memory:4M;memory:4M;memory:4M;memory:4M;memory:4M;memory:4M";
    assert_eq!(two_runs(&spec(mem, "chunk=16K,slots=8")).await, 4 * 6);
    // the journal: stripe by stripe, header and payload then in place,
    // then the crcs: 3 writes per child per stripe
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &files(dir.path(), 6, "4M"),
        "chunk=16K,slots=8,rebuild=off,consistency=journal",
    );
    assert_eq!(two_runs(&s).await, 4 * 6 * 3);
}

/// Half-stripe writes at a deep queue: the background writers write the
/// completed stripes (in runs where they pile up); everything reads back,
/// before and after a flush and a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_stripes_are_written_in_runs_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(&files(dir.path(), 6, "4M"), "chunk=16K,slots=8,wb_bg=1");
    let data = rnd(42, 2 << 20);
    {
        let (d, inner) = open_ec(&s);
        let half = 32 << 10;
        let futs: Vec<_> = (0..data.len() / half)
            .map(|i| {
                let d = d.clone();
                let b = Bytes::copy_from_slice(&data[i * half..(i + 1) * half]);
                tokio::spawn(async move { d.write((i * half) as u64, b, Flags::NONE).await })
            })
            .collect();
        for f in futs {
            f.await.unwrap().unwrap();
        }
        assert_eq!(&d.read(0, 1 << 20).await.unwrap()[..], &data[..1 << 20]);
        d.flush().await.unwrap();
        let stripes = (data.len() / (64 << 10)) as u64;
        assert!(inner.metrics.stripe_writes.load(Ordering::Relaxed) >= stripes);
        let c = super::rebuild::check(&inner, &|_| {}).await;
        assert_eq!((c.inconsistent, c.crc_errors), (0, 0), "{c}");
        d.close().await.unwrap();
    }
    let (d, _inner) = open_ec(&s);
    assert_eq!(&d.read(0, 2 << 20).await.unwrap()[..], &data[..]);
    d.close().await.unwrap();
}

/// Memory children at chunk=64K (one page): a run's chunks become the
/// children's pages, and the pages they replace come back into the
/// pool, except one a reader still holds (it keeps its old bytes).
#[tokio::test]
async fn memory_children_adopt_chunks_and_their_old_pages_are_reused() {
    let mem = "memory:4M;memory:4M;memory:4M;memory:4M;memory:4M;memory:4M";
    let (d, inner) = open_ec(&spec(mem, "chunk=64K,slots=8"));
    assert!(inner.children.iter().all(|c| c.adopt));
    let page = 64 << 10;
    let run = 4 * 4 * page; // 4 stripes of 4 data chunks
    let mut last = Vec::new();
    let mut free = Vec::new();
    for (i, seed) in [51u64, 52, 53].into_iter().enumerate() {
        // a reader holding data chunk 0 of stripe 0 (on child 0)
        let held = d.read(0, page as u32).await.unwrap();
        let data = rnd(seed, run);
        d.write(0, Bytes::copy_from_slice(&data), Flags::NONE)
            .await
            .unwrap();
        assert_eq!(&d.read(0, run as u32).await.unwrap()[..], &data[..]);
        if i == 0 {
            // the first write replaced holes: nothing to take back
            assert_eq!(inner.pool.held(), 0);
        } else {
            assert_eq!(&held[..], &last[..page], "the reader's bytes");
            // 6 children x 4 stripes, less the page the reader held
            assert_eq!(inner.pool.held(), (6 * 4 - 1) * page);
        }
        if i == 2 {
            // the children's pages now are the pool's free buffers of
            // the write before (23 of them; one was new): adopted, not
            // copied
            let mut reused = 0;
            for c in &inner.children {
                for s in 0..4 {
                    let dev = c.dev.as_ref().unwrap();
                    let b = dev.read(inner.geo.chunk_off(s), page as u32).await;
                    reused += free.contains(&(b.unwrap().as_ptr() as usize)) as usize;
                }
            }
            assert_eq!(reused, 6 * 4 - 1);
        }
        free = inner.pool.addrs();
        last = data;
    }
    d.flush().await.unwrap();
    let c = super::rebuild::check(&inner, &|_| {}).await;
    assert_eq!((c.inconsistent, c.crc_errors), (0, 0), "{c}");
    // chunk=32K: half pages, which the children copy
    let (_d, inner) = open_ec(&spec(mem, "chunk=32K,slots=8"));
    assert!(inner.children.iter().all(|c| !c.adopt));
}

/// `covers` (one piece over the range, or pieces laid side by side)
/// against a block-by-block count of what the pieces of that chunk hold.
#[test]
fn covers_agrees_with_counting_blocks() {
    use super::wb::{covers, Piece};
    let piece =
        |c: usize, lo: u64, n: u64| -> Piece { (c, lo, Bytes::from(vec![0u8; n as usize])) };
    let sets: Vec<Vec<Piece>> = vec![
        vec![piece(0, 0, 16)],
        vec![piece(1, 0, 16)],
        vec![piece(0, 4, 12)],
        vec![piece(0, 0, 8), piece(0, 8, 8)],
        vec![piece(0, 8, 8), piece(1, 0, 8), piece(0, 0, 4)],
        vec![piece(0, 8, 8), piece(0, 0, 4), piece(0, 3, 6)],
        vec![piece(2, 0, 16), piece(0, 2, 14)],
        vec![],
    ];
    for p in &sets {
        for lo in 0..16 {
            for hi in lo..=16 {
                let want = (lo..hi).all(|x| {
                    p.iter()
                        .any(|q| q.0 == 0 && q.1 <= x && x < q.1 + q.2.len() as u64)
                });
                assert_eq!(
                    covers(p, 0, lo, hi),
                    want,
                    "{lo}..{hi} of {:?}",
                    p.iter().map(|q| (q.0, q.1, q.2.len())).collect::<Vec<_>>()
                );
            }
        }
    }
}
