//! Unit tests of the write-intent bitmap, its resync, the journal floor
//! and the write-back stripe buffer, on file children.

use super::layout::{Bitmap, Geometry};
use super::tests::{files, open_ec, rnd, spec};
use super::*;
use crate::block::{BlockDevExt, Flags};
use bytes::Bytes;
use std::path::Path;

fn put(dir: &Path, c: usize, at: u64, bytes: &[u8]) {
    let p = dir.join(format!("s{c}.img"));
    let mut img = std::fs::read(&p).unwrap();
    img[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    std::fs::write(&p, &img).unwrap();
}

fn get(dir: &Path, c: usize, at: u64, len: usize) -> Vec<u8> {
    std::fs::read(dir.join(format!("s{c}.img"))).unwrap()[at as usize..at as usize + len].to_vec()
}

/// Writes a bitmap block with region 1 and `stripes` dirty on child `c`.
fn dirty(dir: &Path, c: usize, geo: &Geometry, uuid: u64, floor: u64, stripes: &[u64]) {
    let mut bits = vec![0u64; geo.stripes.div_ceil(64) as usize];
    for &s in stripes {
        bits[(s / 64) as usize] |= 1 << (s % 64);
    }
    let bm = Bitmap {
        uuid,
        floor,
        region: 1,
        bits,
    };
    put(dir, c, geo.bitmap_off(), &bm.encode());
}

/// A stripe torn by a crash (a data chunk new on disk, the parity old)
/// decodes wrongly unless its bitmap bit makes the open resync it.
#[tokio::test]
async fn resync_repairs_a_torn_stripe_only_where_the_bitmap_says() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &files(dir.path(), 6, "4M"),
        "chunk=16K,slots=4,rebuild=off,wb=0",
    );
    let a = rnd(11, 3 * (64 << 10));
    let (geo, uuid, floor);
    {
        let (d, inner) = open_ec(&s);
        d.write(0, Bytes::from(a.clone()), Flags::NONE)
            .await
            .unwrap();
        d.close().await.unwrap();
        geo = inner.geo;
        uuid = inner.sb.lock().await.uuid;
        floor = inner.intent.floor.load(Ordering::Relaxed);
    }
    // stripes 1 and 2: data chunk 2 replaced by new bytes on disk (the
    // crash came after that write, before the parity and crc writes)
    let new = rnd(12, 16384);
    for st in [1, 2] {
        put(dir.path(), 2, geo.chunk_off(st), &new);
    }
    // only stripe 1 is marked dirty (on one child: the union counts)
    dirty(dir.path(), 3, &geo, uuid, floor, &[1]);
    let (d, inner) = open_ec(&s);
    assert_eq!(inner.metrics.resynced.load(Ordering::Relaxed), 1);
    // stripe 1: the new data, consistent parity, data chunk 2 decodable
    // from the others
    let at = geo.stripe_bytes() + 2 * geo.chunk;
    assert_eq!(&d.read(at, 16384).await.unwrap()[..], &new[..]);
    let c = rebuild::check(&inner, &|_| {}).await;
    // stripe 2 was not marked: its crc catches the changed chunk, which
    // the check rewrites from the (old) parity
    assert_eq!(
        (c.unreadable, c.inconsistent, c.crc_errors),
        (0, 0, 1),
        "{c}"
    );
    let at2 = 2 * geo.stripe_bytes() + 2 * geo.chunk;
    assert_eq!(
        &d.read(at2, 16384).await.unwrap()[..],
        &a[at2 as usize..at2 as usize + 16384]
    );
    d.close().await.unwrap();
    drop((d, inner));
    // the open cleared the bitmap: a second open resyncs nothing
    let (d, inner) = open_ec(&s);
    assert_eq!(inner.metrics.resynced.load(Ordering::Relaxed), 0);
    let bm = Bitmap::decode(&get(dir.path(), 0, geo.bitmap_off(), 4096), uuid).unwrap();
    assert!(bm.bits.iter().all(|&w| w == 0), "{bm:?}");
    d.close().await.unwrap();
}

/// Bits set by writes stay on disk until a flush; the flush clears them.
#[tokio::test]
async fn writes_set_bits_and_a_flush_clears_them() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &files(dir.path(), 6, "4M"),
        "chunk=16K,slots=4,rebuild=off,wb=0,region=64K",
    );
    let (d, inner) = open_ec(&s);
    let uuid = inner.sb.lock().await.uuid;
    let geo = inner.geo;
    d.write(
        5 * geo.stripe_bytes(),
        Bytes::from(rnd(1, 4096)),
        Flags::NONE,
    )
    .await
    .unwrap();
    let bits = |c| Bitmap::decode(&get(dir.path(), c, geo.bitmap_off(), 4096), uuid).unwrap();
    for c in 0..6 {
        let bm = bits(c);
        assert_eq!(bm.region, 1);
        assert_eq!(bm.bits[0], 1 << 5, "child {c}");
    }
    d.flush().await.unwrap();
    assert_eq!(bits(4).bits[0], 0);
    d.close().await.unwrap();
}

/// Updates made through the journal while a child was failed are never
/// replayed over later in-place updates once the rebuild moved the
/// device back to the bitmap (the floor).
#[tokio::test]
async fn journal_entries_before_the_floor_are_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &files(dir.path(), 6, "4M"),
        "chunk=16K,slots=4,rebuild=off,wb=0",
    );
    drop(open_ec(&s));
    std::fs::remove_file(dir.path().join("s1.img")).unwrap();
    let (x, y) = (rnd(21, 64 << 10), rnd(22, 64 << 10));
    {
        let (d, inner) = open_ec(&s);
        assert!(inner.use_journal());
        d.write(0, Bytes::from(x.clone()), Flags::NONE)
            .await
            .unwrap();
        rebuild::rebuild(&inner, &rebuild::targets(&inner), &|_| {})
            .await
            .unwrap();
        assert!(!inner.use_journal());
        d.write(0, Bytes::from(y.clone()), Flags::NONE)
            .await
            .unwrap();
        d.close().await.unwrap();
    }
    let (d, inner) = open_ec(&s);
    assert_eq!(inner.metrics.replayed.load(Ordering::Relaxed), 0);
    assert_eq!(&d.read(0, 64 << 10).await.unwrap()[..], &y[..]);
    d.close().await.unwrap();
}

/// Two half-stripe writes become one full-stripe update; buffered bytes
/// are read back before the flush and are on disk after it.
#[tokio::test]
async fn half_stripe_writes_are_gathered_into_one_update() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(&files(dir.path(), 6, "4M"), "chunk=16K,slots=4,rebuild=off");
    let data = rnd(31, 64 << 10);
    {
        let (d, inner) = open_ec(&s);
        let h = 32 << 10;
        d.write(0, Bytes::copy_from_slice(&data[..h]), Flags::NONE)
            .await
            .unwrap();
        assert_eq!(inner.metrics.stripe_writes.load(Ordering::Relaxed), 0);
        assert_eq!(&d.read(0, 4096).await.unwrap()[..], &data[..4096]);
        assert_eq!(inner.metrics.stripe_writes.load(Ordering::Relaxed), 1);
        d.write(0, Bytes::copy_from_slice(&data[..h]), Flags::NONE)
            .await
            .unwrap();
        d.write(h as u64, Bytes::copy_from_slice(&data[h..]), Flags::NONE)
            .await
            .unwrap();
        // the completed stripe is written in the background; the flush
        // waits for it
        d.flush().await.unwrap();
        assert_eq!(inner.metrics.stripe_writes.load(Ordering::Relaxed), 2);
        d.write(65536, Bytes::from(rnd(32, 8192)), Flags::NONE)
            .await
            .unwrap();
        d.flush().await.unwrap();
        assert_eq!(inner.metrics.stripe_writes.load(Ordering::Relaxed), 3);
        d.close().await.unwrap();
    }
    let (d, _inner) = open_ec(&s);
    assert_eq!(&d.read(0, 64 << 10).await.unwrap()[..], &data[..]);
    d.close().await.unwrap();
}

/// The crc of child `c`'s block `blk` of stripe `st` as its table on disk
/// holds it.
fn disk_crc(dir: &Path, geo: &Geometry, c: usize, st: u64, blk: u64) -> u32 {
    let b = get(dir, c, geo.meta_off(st, blk), 4);
    u32::from_le_bytes(b.try_into().unwrap())
}

/// With the bitmap, stripe writes keep their crcs in memory until a
/// flush writes the table pages; a crash before that leaves the region
/// dirty, and the open's resync rewrites the stale crcs, so every chunk
/// reads back and checks clean.
#[tokio::test]
async fn crcs_are_written_at_the_flush_and_resynced_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(
        &files(dir.path(), 6, "4M"),
        "chunk=16K,slots=4,rebuild=off,wb=0,region=64K",
    );
    let (a, b) = (rnd(41, 2 * (64 << 10)), rnd(42, 64 << 10));
    let geo;
    {
        let (d, inner) = open_ec(&s);
        geo = inner.geo;
        d.write(3 * geo.stripe_bytes(), Bytes::from(a.clone()), Flags::NONE)
            .await
            .unwrap();
        let want = super::layout::block_crc(&a[..4096]);
        assert_eq!(inner.crc(0, 3, 0), want);
        // not on disk yet: the table still says "zero block"
        assert_eq!(disk_crc(dir.path(), &geo, 0, 3, 0), 0);
        assert!(inner.meta_dirty.marked() > 0);
        // a crash: no flush, no close
        drop((d, inner));
    }
    {
        let (d, inner) = open_ec(&s);
        // both written stripes had every chunk's crcs rewritten
        assert_eq!(inner.metrics.resynced.load(Ordering::Relaxed), 2);
        let c = rebuild::check(&inner, &|_| {}).await;
        assert_eq!(
            (c.unreadable, c.inconsistent, c.crc_errors),
            (0, 0, 0),
            "{c}"
        );
        assert_eq!(
            &d.read(3 * geo.stripe_bytes(), a.len() as u32)
                .await
                .unwrap()[..],
            &a[..]
        );
        // a flushed write has its crcs on every child's table
        d.write(7 * geo.stripe_bytes(), Bytes::from(b.clone()), Flags::NONE)
            .await
            .unwrap();
        d.flush().await.unwrap();
        assert_eq!(inner.meta_dirty.marked(), 0);
        for c in 0..6 {
            for blk in 0..4 {
                assert_eq!(
                    disk_crc(dir.path(), &geo, c, 7, blk),
                    inner.crc(c, 7, blk),
                    "child {c} block {blk}"
                );
            }
        }
        assert_eq!(
            disk_crc(dir.path(), &geo, 1, 7, 0),
            super::layout::block_crc(&b[16384..16384 + 4096])
        );
        d.close().await.unwrap();
    }
}
