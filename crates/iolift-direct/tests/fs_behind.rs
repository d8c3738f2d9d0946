//! AccelFS write-behind: a file written from start to end has its whole
//! blocks on the disk before its sync (which then writes only the tail),
//! reads back the same after a remount with fsck clean; dropped before
//! its sync (as a killed process leaves it), it keeps the size and bytes
//! of its last sync and fsck finds no error.

mod common;

use common::{inline_engine, BS};
use iolift_direct::fs::{fsck, File, Fs};
use std::path::Path;

/// Appends of this size, not aligned to blocks (as a table builder's).
const PIECE: usize = 1000;

/// A fresh file system whose cache holds 1024 blocks.
fn fresh(img: &Path) -> Fs {
    let mut fs = common::fresh(img);
    fs.set_cache_blocks(1024);
    fs
}

fn content(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ (i >> 9)) as u8 ^ seed)
        .collect()
}

/// Appends `data` in pieces of [`PIECE`] bytes.
fn append(fs: &mut Fs, f: &mut File, data: &[u8]) {
    for piece in data.chunks(PIECE) {
        let end = f.size();
        fs.write(f, end, piece).unwrap();
    }
}

fn check(fs: &mut Fs, path: &str, want: &[u8]) {
    let mut f = fs.open(path).unwrap();
    assert_eq!(f.size(), want.len() as u64, "{path}: size");
    let mut got = vec![0u8; want.len()];
    assert_eq!(fs.read(&mut f, 0, &mut got).unwrap(), want.len());
    assert!(got == want, "{path}: bytes differ");
    fs.close(f).unwrap();
}

#[test]
fn whole_blocks_go_out_before_the_sync_which_writes_only_the_tail() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = fresh(&img);
    let blocks = 300;
    let run = 32;
    let data = content(blocks * BS + 123, 5);
    let mut bytes_before_sync = Vec::new();
    for (path, behind) in [("/plain", 0), ("/behind", run)] {
        fs.create(path).unwrap();
        let mut f = fs.open(path).unwrap();
        fs.set_write_behind(&mut f, behind);
        let w0 = fs.engine().stats().written_bytes;
        append(&mut fs, &mut f, &data);
        let w1 = fs.engine().stats().written_bytes;
        fs.sync_hard(&mut f).unwrap();
        let w2 = fs.engine().stats().written_bytes;
        bytes_before_sync.push((w1 - w0, w2 - w1));
        fs.close(f).unwrap();
    }
    let (plain, behind) = (bytes_before_sync[0], bytes_before_sync[1]);
    // Without write-behind a cache that holds the whole file writes
    // nothing before the sync.
    assert_eq!(plain.0, 0, "plain: {plain:?}");
    assert!(plain.1 >= data.len() as u64, "plain: {plain:?}");
    // With it, every run of whole blocks but the last is out before the
    // sync, which writes the rest: the tail, the pointers, the inode.
    let out = (blocks - 2 * run) * BS;
    assert!(
        behind.0 >= out as u64,
        "behind: {behind:?}, want >= {out} before the sync"
    );
    let tail = (2 * run + 8) * BS;
    assert!(
        behind.1 <= tail as u64,
        "behind: {behind:?}, want <= {tail} at the sync"
    );
    let r = fsck::fsck(&fs);
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
    let eng = fs.unmount().unwrap();
    let mut fs = Fs::mount(eng).unwrap();
    check(&mut fs, "/plain", &data);
    check(&mut fs, "/behind", &data);
    let r = fsck::fsck(&fs);
    assert!(
        r.errors.is_empty() && r.leaked_blocks.is_empty(),
        "fsck after remount: {r:?}"
    );
}

#[test]
fn dropped_before_its_sync_keeps_the_last_synced_size_and_bytes() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = fresh(&img);
    fs.create("/t").unwrap();
    let mut f = fs.open("/t").unwrap();
    fs.set_write_behind(&mut f, 16);
    let synced = content(50 * BS + 77, 9);
    append(&mut fs, &mut f, &synced);
    fs.sync_hard(&mut f).unwrap();
    // More, written behind but never synced; a run is still out when the
    // file system goes away.
    let more = content(200 * BS, 3);
    append(&mut fs, &mut f, &more);
    assert!(
        fs.engine().stats().written_bytes >= (synced.len() + 150 * BS) as u64,
        "the unsynced blocks went out behind the writer"
    );
    drop(f);
    drop(fs); // no sync, no unmount: what a killed process leaves
    let mut fs = Fs::mount(inline_engine(&img, None)).unwrap();
    let r = fsck::fsck(&fs);
    assert!(r.errors.is_empty(), "fsck after the drop: {:#?}", r.errors);
    check(&mut fs, "/t", &synced);
}
