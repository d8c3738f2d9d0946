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
