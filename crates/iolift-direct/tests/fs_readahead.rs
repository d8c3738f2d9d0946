//! AccelFS read-ahead and cache budget: a sequential reader's misses bring
//! in several blocks with one request (fewer engine requests than blocks),
//! random and sequential reads return the file's bytes, blocks an unsynced
//! write left on disk past the size at open are never read ahead as the
//! file's, and all open files' caches together stay within the budget.

use iolift_direct::fs::{Fs, Mkfs, CACHE_SHARE_MIN};
use iolift_direct::{Config, Direct, Engine, Open, Target};
use iolift_testkit::Rng;
use std::path::Path;

fn mount(img: &Path, make: bool) -> Fs {
    let t = Target::open(
        img,
        &Open {
            direct: Direct::Auto,
            create_size: Some(32 << 20),
            ..Open::default()
        },
    )
    .unwrap();
    let eng = Engine::new(
        t,
        Config {
            inline: true,
            ..Config::default()
        },
    )
    .unwrap();
    if make {
        iolift_direct::fs::mkfs(&eng, &Mkfs::default()).unwrap();
    }
    Fs::mount(eng).unwrap()
}

#[test]
fn sequential_reads_read_ahead_and_return_the_files_bytes() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut data = vec![0u8; (3 << 20) + 1234];
    Rng::new(7).fill(&mut data);
    let mut fs = mount(&img, true);
    fs.create("/f").unwrap();
    let mut f = fs.open("/f").unwrap();
    fs.write(&mut f, 0, &data).unwrap();
    fs.close(f).unwrap();
    let eng = fs.unmount().unwrap();
    drop(eng);

    let mut fs = mount(&img, false);
    fs.set_cache_blocks(16);
    let mut f = fs.open("/f").unwrap();
    let mut got = vec![0u8; data.len()];
    let mut off = 0;
    while off < data.len() {
        let n = fs
            .read(
                &mut f,
                off as u64,
                &mut got[off..(off + 4096).min(data.len())],
            )
            .unwrap();
        assert!(n > 0, "read at {off} returned 0 before the end");
        off += n;
    }
    assert!(got == data, "sequential read differs from what was written");
    fs.close(f).unwrap();
    let eng = fs.unmount().unwrap();
    let blocks = data.len().div_ceil(8192) as u64;
    let ops = eng.stats().ops;
    assert!(
        ops < blocks / 4,
        "{ops} engine requests for {blocks} blocks read in order (read-ahead of 8)"
    );
    drop(eng);

    // Random reads of the same file, through a small cache: the bytes.
    let mut fs = mount(&img, false);
    fs.set_cache_blocks(4);
    let mut f = fs.open("/f").unwrap();
    let mut rng = Rng::new(8);
    for _ in 0..300 {
        let off = rng.below(data.len() as u64) as usize;
        let len = 1 + rng.index(20000);
        let mut b = vec![0u8; len];
        let n = fs.read(&mut f, off as u64, &mut b).unwrap();
        assert_eq!(n, len.min(data.len() - off));
        assert!(
            b[..n] == data[off..off + n],
            "random read at {off} len {len}"
        );
    }
    fs.close(f).unwrap();
    fs.unmount().unwrap();
}

#[test]
fn read_ahead_never_returns_bytes_past_the_size_at_open() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let bs = 8192;
    let mut fs = mount(&img, true);
    fs.set_cache_blocks(8);
    fs.create("/f").unwrap();
    // 16 blocks: past the 12 direct pointers, so an indirect block exists.
    let mut f = fs.open("/f").unwrap();
    fs.write(&mut f, 0, &vec![1u8; bs * 16]).unwrap();
    fs.close(f).unwrap();
    // 12 more: the cache of 8 writes back 8 of them, their pointers go
    // into the indirect block on disk, but the size on disk stays at 16
    // blocks, as after a process killed before its sync.
    let mut f = fs.open("/f").unwrap();
    fs.write(&mut f, (bs * 16) as u64, &vec![2u8; bs * 12])
        .unwrap();
    drop(f);
    fs.unmount().unwrap();

    let mut fs = mount(&img, false);
    fs.set_cache_blocks(8);
    let mut f = fs.open("/f").unwrap();
    assert_eq!(f.size(), (bs * 16) as u64, "the size on disk");
    // Grow the file without writing those blocks: what the disk holds
    // there (left by the unsynced write) must read as zeroes.
    fs.write(&mut f, (bs * 32 - 1) as u64, &[3]).unwrap();
    let mut all = vec![9u8; bs * 32];
    let mut off = 0;
    while off < all.len() {
        off += fs
            .read(&mut f, off as u64, &mut all[off..off + 2048])
            .unwrap();
    }
    assert!(all[..bs * 16].iter().all(|&b| b == 1), "the synced blocks");
    assert!(
        all[bs * 16..bs * 32 - 1].iter().all(|&b| b == 0),
        "blocks past the size at open read as zeroes"
    );
    assert_eq!(all[bs * 32 - 1], 3);
    fs.close(f).unwrap();
    let mut f = fs.open("/f").unwrap();
    let mut again = vec![9u8; bs * 32];
    assert_eq!(fs.read(&mut f, 0, &mut again).unwrap(), bs * 32);
    assert!(again == all, "after the sync: the same bytes");
    fs.close(f).unwrap();
    fs.unmount().unwrap();
}

#[test]
fn all_caches_together_stay_within_the_budget() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = mount(&img, true);
    fs.set_cache_blocks(64);
    fs.set_cache_budget(40);
    let mut rng = Rng::new(9);
    let mut files = Vec::new();
    let mut datas = Vec::new();
    for i in 0..6 {
        let mut data = vec![0u8; 40 * 8192 + i * 1000];
        rng.fill(&mut data);
        let name = format!("/f{i}");
        fs.create(&name).unwrap();
        let mut f = fs.open(&name).unwrap();
        fs.write(&mut f, 0, &data).unwrap();
        assert!(
            fs.cached_blocks() <= 40 + CACHE_SHARE_MIN * (files.len() + 1),
            "{}",
            fs.cached_blocks()
        );
        files.push(f);
        datas.push(data);
    }
    // Reads over all of them, interleaved: the bytes, and the bound.
    for _ in 0..400 {
        let i = rng.index(files.len());
        let off = rng.below(datas[i].len() as u64) as usize;
        let mut b = vec![0u8; 1 + rng.index(30000)];
        let n = fs.read(&mut files[i], off as u64, &mut b).unwrap();
        assert!(b[..n] == datas[i][off..off + n], "file {i} at {off}");
        assert!(
            fs.cached_blocks() <= 40 + CACHE_SHARE_MIN * files.len(),
            "{}",
            fs.cached_blocks()
        );
    }
    for f in files {
        fs.close(f).unwrap();
    }
    assert_eq!(fs.cached_blocks(), 0, "closed files hold no blocks");
    fs.unmount().unwrap();
}
