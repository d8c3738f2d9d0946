//! AccelFS write-back that does not wait for the disk: a cache making room
//! starts its dirty blocks (consecutive ones in one request) and goes on;
//! later reads see the written bytes, a sync puts everything on the disk,
//! and a file system dropped with a write-back out (as a killed process
//! leaves it) mounts with no fsck error and every synced byte intact.

mod common;

use common::{fresh, inline_engine, BS};
use iolift_direct::fs::{fsck, Fs};

fn block(i: usize) -> Vec<u8> {
    (0..BS).map(|j| (i * 31 + j * 7 + 1) as u8).collect()
}

fn read_all(fs: &mut Fs, f: &mut iolift_direct::fs::File, blocks: usize) {
    let mut got = vec![0u8; BS];
    for i in 0..blocks {
        let n = fs.read(f, (i * BS) as u64, &mut got).unwrap();
        assert_eq!(n, BS, "block {i}: short read");
        assert!(got == block(i), "block {i}: wrong bytes");
    }
}

#[test]
fn evicted_blocks_go_out_in_large_requests_and_read_back() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = fresh(&img);
    fs.set_cache_blocks(16);
    fs.create("/f").unwrap();
    let mut f = fs.open("/f").unwrap();
    let blocks = 600; // past the direct pointers and one indirect block's worth
    let before = fs.engine().stats().ops;
    for i in 0..blocks {
        fs.write(&mut f, (i * BS) as u64, &block(i)).unwrap();
    }
    let writes = fs.engine().stats().ops - before;
    // Each eviction writes the file's 16 dirty blocks, consecutive on the
    // disk: a few requests per 16 blocks, not one per block.
    assert!(
        writes < (blocks / 4) as u64,
        "{writes} requests to write back {blocks} blocks"
    );
    // Evicted blocks come back from the disk (after their write landed).
    read_all(&mut fs, &mut f, blocks);
    fs.sync_hard(&mut f).unwrap();
    fs.close(f).unwrap();
    let r = fsck::fsck(&fs);
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
    let eng = fs.unmount().unwrap();
    let mut fs = Fs::mount(eng).unwrap();
    let mut f = fs.open("/f").unwrap();
    assert_eq!(f.size(), (blocks * BS) as u64);
    read_all(&mut fs, &mut f, blocks);
    let r = fsck::fsck(&fs);
    assert!(
        r.errors.is_empty() && r.leaked_blocks.is_empty(),
        "fsck: {r:?}"
    );
}

#[test]
fn dropped_with_write_back_out_keeps_synced_bytes_and_fsck_clean() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = fresh(&img);
    fs.set_cache_blocks(8);
    fs.create("/f").unwrap();
    let mut f = fs.open("/f").unwrap();
    let synced = 100;
    for i in 0..synced {
        fs.write(&mut f, (i * BS) as u64, &block(i)).unwrap();
    }
    fs.sync_hard(&mut f).unwrap();
    // More blocks: evictions start write-backs; the last one is still
    // out (its pointers unwritten) when the file system goes away.
    for i in synced..synced + 300 {
        fs.write(&mut f, (i * BS) as u64, &block(i)).unwrap();
    }
    drop(f);
    drop(fs); // no unmount, no sync: what a killed process leaves
    let mut fs = Fs::mount(inline_engine(&img, None)).unwrap();
    let r = fsck::fsck(&fs);
    assert!(r.errors.is_empty(), "fsck after the drop: {:#?}", r.errors);
    let mut f = fs.open("/f").unwrap();
    assert_eq!(f.size(), (synced * BS) as u64, "the size of the last sync");
    read_all(&mut fs, &mut f, synced);
}
