//! AccelFS: a model-based test (random operations against an in-memory
//! model, compared after every step and after remounts, fsck clean
//! throughout; on an image file and on a loop device), the per-file cache
//! bound, and fuzzed images (superblock, inodes, directory blocks) that
//! must give errors, never a panic or a hang.

use iolift_direct::fs::{fsck, layout, Fs, Mkfs};
use iolift_direct::{Config, Direct, Engine, Open, Target};
use iolift_testkit::Rng;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

fn engine(path: &Path, size: Option<u64>) -> Engine {
    let t = Target::open(
        path,
        &Open {
            direct: Direct::Auto,
            create_size: size,
            ..Open::default()
        },
    )
    .unwrap();
    Engine::new(t, Config::default()).unwrap()
}

fn fresh(path: &Path, size: u64, bs: u32) -> Fs {
    fresh_on(engine(path, Some(size)), bs)
}

fn fresh_on(eng: Engine, bs: u32) -> Fs {
    iolift_direct::fs::mkfs(
        &eng,
        &Mkfs {
            block_size: bs,
            inodes: 128,
        },
    )
    .unwrap();
    Fs::mount(eng).unwrap()
}

fn remount(fs: Fs) -> Fs {
    Fs::mount(fs.unmount().unwrap()).unwrap()
}

fn assert_clean(fs: &Fs, ctx: &str) {
    let r = fsck::fsck(fs);
    assert!(r.errors.is_empty(), "{ctx}: fsck errors: {:#?}", r.errors);
    assert!(
        r.leaked_blocks.is_empty() && r.orphans.is_empty(),
        "{ctx}: leaks {r:?}"
    );
}

/// The model: path -> contents (files) or None (directories).
type Model = BTreeMap<String, Option<Vec<u8>>>;

fn compare(fs: &mut Fs, m: &Model, ctx: &str) {
    for (p, v) in m {
        let st = fs
            .stat(p)
            .unwrap_or_else(|e| panic!("{ctx}: stat {p}: {e}"));
        match v {
            None => assert_eq!(st.kind, layout::KIND_DIR, "{ctx}: {p}"),
            Some(data) => {
                assert_eq!(st.size, data.len() as u64, "{ctx}: size of {p}");
                let mut f = fs.open(p).unwrap();
                let mut got = vec![0u8; data.len() + 10];
                let n = fs.read(&mut f, 0, &mut got).unwrap();
                assert_eq!(n, data.len(), "{ctx}: read of {p}");
                assert!(got[..n] == data[..], "{ctx}: contents of {p}");
            }
        }
    }
    // Listings: exactly the model's children.
    let dirs: Vec<String> = std::iter::once(String::new())
        .chain(
            m.iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| k.clone()),
        )
        .collect();
    for d in dirs {
        let mut want: Vec<String> = m
            .keys()
            .filter(|k| match k.rsplit_once('/') {
                Some((parent, _)) => parent == d,
                None => d.is_empty(),
            })
            .map(|k| k.rsplit('/').next().unwrap().to_string())
            .collect();
        want.sort();
        let got: Vec<String> = fs.list(&d).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(got, want, "{ctx}: listing of /{d}");
    }
}

#[test]
fn random_operations_match_the_model() {
    for (seed, bs) in [(11u64, 8192u32), (12, 4096)] {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("fs.img");
        model_run(engine(&img, Some(24 << 20)), seed, bs, 400);
    }
}

#[test]
fn random_operations_on_a_loop_device() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let lo = iolift_testkit::Loop::new(&img);
    let t = Target::open(
        lo.path(),
        &Open {
            direct: Direct::On,
            ..Open::default()
        },
    )
    .unwrap();
    assert!(t.is_block() && t.is_direct());
    model_run(Engine::new(t, Config::default()).unwrap(), 13, 8192, 200);
}

#[test]
fn random_operations_on_the_inline_engine() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let t = Target::open(
        &img,
        &Open {
            direct: Direct::Auto,
            create_size: Some(16 << 20),
            ..Open::default()
        },
    )
    .unwrap();
    let cfg = Config {
        inline: true,
        ..Config::default()
    };
    model_run(Engine::new(t, cfg).unwrap(), 14, 4096, 300);
}

/// Random operations against the model on a fresh file system; see the
/// module docs.
fn model_run(eng: Engine, seed: u64, bs: u32, steps: usize) {
    let mut fs = fresh_on(eng, bs);
    fs.set_cache_blocks(4);
    let mut m = Model::new();
    let mut rng = Rng::new(seed);
    let mut open: Option<(String, iolift_direct::fs::File)> = None;
    let names = ["a", "b", "c", "dir1", "dir2", "x"];
    for step in 0..steps {
        let ctx = format!("seed {seed} bs {bs} step {step}");
        let dirs: Vec<String> = m
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        let parent = if dirs.is_empty() || rng.chance(1, 2) {
            String::new()
        } else {
            rng.choose(&dirs).unwrap().clone()
        };
        let name = *rng.choose(&names).unwrap();
        let path = if parent.is_empty() {
            name.to_string()
        } else {
            format!("{parent}/{name}")
        };
        let files: Vec<String> = m
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        match rng.below(10) {
            0 => {
                let r = fs.create(&path);
                assert_eq!(
                    r.is_ok(),
                    !m.contains_key(&path),
                    "{ctx}: create {path}: {r:?}"
                );
                m.entry(path).or_insert(Some(vec![]));
            }
            1 => {
                let r = fs.mkdir(&path);
                assert_eq!(
                    r.is_ok(),
                    !m.contains_key(&path),
                    "{ctx}: mkdir {path}: {r:?}"
                );
                m.entry(path).or_insert(None);
            }
            2..=5 if !files.is_empty() => {
                // Write through an open file (kept open across steps).
                let p = rng.choose(&files).unwrap().clone();
                if open.as_ref().map(|o| &o.0) != Some(&p) {
                    if let Some((_, f)) = open.take() {
                        fs.close(f).unwrap();
                    }
                    open = Some((p.clone(), fs.open(&p).unwrap()));
                }
                let f = &mut open.as_mut().unwrap().1;
                let cur = m[&p].as_ref().unwrap().len() as u64;
                let off = rng.below(cur + 3 * bs as u64);
                let max = if rng.chance(1, 4) {
                    20 * bs as u64
                } else {
                    3000
                };
                let len = 1 + rng.below(max) as usize;
                let data = rng.bytes(len);
                fs.write(f, off, &data).unwrap();
                let v = m.get_mut(&p).unwrap().as_mut().unwrap();
                if v.len() < off as usize + len {
                    v.resize(off as usize + len, 0);
                }
                v[off as usize..off as usize + len].copy_from_slice(&data);
                let (cached, _) = f.cached();
                assert!(cached <= 4, "{ctx}: {cached} blocks cached, bound 4");
                // Read back a random range through the same file.
                let ro = rng.below(v.len() as u64 + 10);
                let mut got = vec![0u8; 1 + rng.index(2 * bs as usize)];
                let n = fs.read(f, ro, &mut got).unwrap();
                let want = &v[(ro as usize).min(v.len())..(ro as usize + got.len()).min(v.len())];
                assert_eq!(&got[..n], want, "{ctx}: read at {ro} of {p}");
                match rng.below(3) {
                    0 => fs.sync_soft(f).unwrap(),
                    1 => fs.sync_hard(f).unwrap(),
                    _ => {}
                }
            }
            6 if !m.is_empty() => {
                let keys: Vec<String> = m.keys().cloned().collect();
                let p = rng.choose(&keys).unwrap().clone();
                if open.as_ref().map(|o| &o.0) == Some(&p) {
                    fs.close(open.take().unwrap().1).unwrap();
                }
                let has_children = m.keys().any(|k| k.starts_with(&format!("{p}/")));
                let r = fs.remove(&p);
                assert_eq!(r.is_ok(), !has_children, "{ctx}: remove {p}: {r:?}");
                if r.is_ok() {
                    m.remove(&p);
                }
            }
            7 => {
                if let Some((_, f)) = open.take() {
                    fs.close(f).unwrap();
                }
                fs = remount(fs);
                fs.set_cache_blocks(4);
            }
            _ => {}
        }
        // After every step: the model, and fsck once no file is open.
        if open.is_none() {
            compare(&mut fs, &m, &ctx);
            assert_clean(&fs, &ctx);
        }
    }
    if let Some((_, f)) = open.take() {
        fs.close(f).unwrap();
    }
    let mut fs = remount(fs);
    compare(&mut fs, &m, &format!("seed {seed}: final remount"));
    assert_clean(&fs, "final");
}

#[test]
fn unsynced_writes_are_not_on_disk_and_synced_ones_are() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = fresh(&img, 8 << 20, 8192);
    fs.create("f").unwrap();
    let mut f = fs.open("f").unwrap();
    fs.write(&mut f, 0, &[5u8; 1000]).unwrap();
    assert_eq!(f.cached(), (1, 1));
    assert_eq!(fs.stat("f").unwrap().size, 0, "size on disk before sync");
    fs.sync_hard(&mut f).unwrap();
    assert_eq!(f.cached(), (1, 0));
    assert_eq!(fs.stat("f").unwrap().size, 1000);
    // A partial overwrite keeps the rest of the block (read-modify-write)
    // after the cache dropped it.
    drop(f);
    let mut fs = remount(fs);
    let mut f = fs.open("f").unwrap();
    fs.write(&mut f, 10, &[6u8; 10]).unwrap();
    fs.close(f).unwrap();
    let mut fs = remount(fs);
    let mut f = fs.open("f").unwrap();
    let mut b = vec![0u8; 1000];
    assert_eq!(fs.read(&mut f, 0, &mut b).unwrap(), 1000);
    assert!(
        b[..10].iter().all(|&x| x == 5)
            && b[10..20].iter().all(|&x| x == 6)
            && b[20..].iter().all(|&x| x == 5)
    );
}

#[test]
fn a_large_file_uses_double_indirect_blocks() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = fresh(&img, 32 << 20, 4096);
    fs.create("big").unwrap();
    let mut f = fs.open("big").unwrap();
    // 4 KiB blocks: 12 direct + 512 indirect; this offset is past both.
    let off = (12 + 512 + 700) * 4096u64 + 123;
    fs.write(&mut f, off, b"far away").unwrap();
    fs.write(&mut f, 5 * 4096, b"near").unwrap();
    fs.close(f).unwrap();
    let mut fs = remount(fs);
    let mut f = fs.open("big").unwrap();
    let mut b = [0u8; 8];
    assert_eq!(fs.read(&mut f, off, &mut b).unwrap(), 8);
    assert_eq!(&b, b"far away");
    let mut z = [9u8; 100];
    fs.read(&mut f, 100 * 4096, &mut z).unwrap();
    assert!(z.iter().all(|&x| x == 0), "a hole reads as zeroes");
    assert_clean(&fs, "big file");
    let used = fsck::fsck(&fs).used_blocks;
    fs.remove("big").unwrap();
    let after = fsck::fsck(&fs);
    assert!(after.errors.is_empty());
    // Two data blocks (one direct, one under the double-indirect block),
    // the double-indirect block and one middle block.
    assert_eq!(used - after.used_blocks, 4, "blocks freed by remove");
}

/// A populated image to fuzz; returns the directory blocks' numbers.
fn populated(img: &Path) -> Vec<u64> {
    let mut fs = fresh(img, 4 << 20, 4096);
    fs.mkdir("d").unwrap();
    for i in 0..20 {
        let p = if i % 2 == 0 {
            format!("f{i}")
        } else {
            format!("d/g{i}")
        };
        fs.create(&p).unwrap();
        let mut f = fs.open(&p).unwrap();
        fs.write(&mut f, 0, &vec![i as u8; 3000 * (i + 1)]).unwrap();
        fs.close(f).unwrap();
    }
    let sb = fs.superblock().clone();
    let mut dirs = Vec::new();
    // Directory blocks: the first block of root and of d.
    for p in ["", "d"] {
        let ino = fs.lookup(p).unwrap();
        let at = sb.itable_start as u64 * 4096 + ino as u64 * 128 + 16;
        let raw = std::fs::read(img).unwrap();
        dirs.push(u64::from_le_bytes(
            raw[at as usize..at as usize + 8].try_into().unwrap(),
        ));
    }
    fs.unmount().unwrap();
    dirs
}

/// Mount, fsck, list and read everything: errors are fine, panics and
/// hangs are not.
fn exercise(img: &Path) -> Result<(), String> {
    let eng = engine(img, None);
    let mut fs = Fs::mount(eng).map_err(|e| e.to_string())?;
    let r = fsck::fsck(&fs);
    let mut todo = vec![String::new()];
    let mut seen = 0;
    while let Some(d) = todo.pop() {
        seen += 1;
        if seen > 1000 {
            return Err("directory walk did not end".into());
        }
        let Ok(list) = fs.list(&d) else { continue };
        for e in list {
            let p = if d.is_empty() {
                e.name.clone()
            } else {
                format!("{d}/{}", e.name)
            };
            if e.kind == layout::KIND_DIR {
                todo.push(p);
            } else if let Ok(mut f) = fs.open(&p) {
                let mut b = vec![0u8; 70000];
                let _ = fs.read(&mut f, 0, &mut b);
            }
        }
    }
    if r.errors.is_empty() {
        Ok(())
    } else {
        Err(r.errors.join("; "))
    }
}

#[test]
fn fuzzed_images_give_errors_not_panics() {
    let d = tempfile::tempdir().unwrap();
    let clean = d.path().join("clean.img");
    let dirs = populated(&clean);
    exercise(&clean).expect("the unfuzzed image is clean");
    let orig = std::fs::read(&clean).unwrap();
    let sb = layout::Super::decode(&orig, orig.len() as u64).unwrap();
    let bs = sb.block_size as usize;
    let itable = sb.itable_start as usize * bs..(sb.itable_start as usize * bs + 32 * 128);
    let mut rng = Rng::new(99);
    let img = d.path().join("fuzz.img");
    let (mut errors, mut fine) = (0, 0);
    for round in 0..300 {
        let mut raw = orig.clone();
        let (what, range) = match round % 4 {
            0 => ("superblock", 0..layout::SB_LEN),
            1 | 2 => ("inodes", itable.clone()),
            _ => {
                let b = dirs[rng.index(dirs.len())] as usize;
                ("directory", b * bs..b * bs + 20 * 64)
            }
        };
        for _ in 0..1 + rng.index(6) {
            let i = range.start + rng.index(range.len());
            raw[i] = if rng.chance(1, 2) {
                rng.next_u32() as u8
            } else {
                raw[i] ^ (1 << rng.below(8))
            };
        }
        // Half the time, fix the checksums so that the checks behind them
        // are reached too.
        if rng.chance(1, 2) {
            let c = layout::crc32c(&raw[..52]);
            raw[52..56].copy_from_slice(&c.to_le_bytes());
            for ino in 0..32 {
                let at = itable.start + ino * 128;
                let node = &mut raw[at..at + 128];
                if node.iter().any(|&x| x != 0) {
                    node[4..8].fill(0);
                    let c = layout::crc32c(node);
                    node[4..8].copy_from_slice(&c.to_le_bytes());
                }
            }
        }
        std::fs::write(&img, &raw).unwrap();
        let t = Instant::now();
        match exercise(&img) {
            Ok(()) => fine += 1,
            Err(e) => {
                assert!(!e.is_empty(), "round {round} ({what}): empty error");
                errors += 1;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "round {round} ({what}): took {:?}",
            t.elapsed()
        );
    }
    println!("fuzz: {errors} images refused or inconsistent, {fine} still consistent");
    assert!(errors > 100, "too few fuzzed images were noticed: {errors}");
}

#[test]
fn bytes_an_unsynced_write_left_past_the_size_read_as_zeroes() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    let mut fs = fresh(&img, 8 << 20, 4096);
    fs.set_cache_blocks(1);
    fs.create("f").unwrap();
    let mut f = fs.open("f").unwrap();
    fs.write(&mut f, 0, &[1u8; 5000]).unwrap();
    fs.sync_soft(&mut f).unwrap();
    // Past the synced size: written back by eviction (cache of one
    // block), but the inode's size is never written (as if killed).
    fs.write(&mut f, 5000, &[2u8; 30000]).unwrap();
    assert_eq!(f.cached(), (1, 1));
    drop(f);
    let mut fs = remount(fs);
    assert_eq!(fs.stat("f").unwrap().size, 5000);
    let mut f = fs.open("f").unwrap();
    fs.write(&mut f, 40000, b"end").unwrap();
    let mut b = vec![9u8; 40003];
    assert_eq!(fs.read(&mut f, 0, &mut b).unwrap(), 40003);
    assert!(b[..5000].iter().all(|&x| x == 1), "synced bytes");
    assert!(
        b[5000..40000].iter().all(|&x| x == 0),
        "the unsynced write shows through"
    );
    assert_eq!(&b[40000..], b"end");
    fs.close(f).unwrap();
    let mut fs = remount(fs);
    let mut f = fs.open("f").unwrap();
    let mut c = vec![9u8; 40003];
    fs.read(&mut f, 0, &mut c).unwrap();
    assert!(b == c, "after remount");
    assert!(fsck::fsck(&fs).errors.is_empty());
}
