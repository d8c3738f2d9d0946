//! AccelFS on damaged images, field by field: every field of every inode in
//! use (checksum made right, so the checks behind it are reached), every
//! field of every directory entry, the pointers of the indirect and
//! double-indirect blocks, and the bitmap bits of the blocks in use, each
//! set to values that point where they must not (metadata, past the end,
//! another file's block, a free or out-of-range inode). On each image the
//! whole API runs: mount, fsck, walk and read, then create, write, sync,
//! rename, remove, unmount and mount again. Any result is fine except a
//! panic or a hang; and the images the checks are there for must be
//! noticed (mount or fsck says so).

mod common;

use iolift_direct::fs::{fsck, layout, Fs, Mkfs};
use iolift_direct::{Direct, Engine};
use std::path::Path;
use std::time::{Duration, Instant};

const BS: usize = 4096;

/// A buffered engine on `img` (the test rewrites the image between mounts
/// with plain writes; the page cache keeps that cheap).
fn engine(img: &Path, create: Option<u64>) -> Engine {
    common::inline_engine_with(img, create, Direct::Off)
}

/// Files of the populated image, with what was written to them.
const FILES: &[(&str, u64, usize)] = &[
    ("a", 0, 3000),
    ("d/b", 0, 9000),
    ("d/e/c", 4096 * 3, 100),
    // Past the 12 direct blocks: an indirect block.
    ("ind", 4096 * 14, 5000),
    // Past the indirect block's 512: the double-indirect one.
    ("dind", 4096 * (12 + 512 + 3), 4096),
];

/// Makes and fills a 2 MiB file system on `img`.
fn populate(img: &Path) {
    let eng = engine(img, Some(2 << 20));
    iolift_direct::fs::mkfs(
        &eng,
        &Mkfs {
            block_size: BS as u32,
            inodes: 32,
        },
    )
    .unwrap();
    let mut fs = Fs::mount(eng).unwrap();
    fs.mkdir("d").unwrap();
    fs.mkdir("d/e").unwrap();
    for (i, &(p, off, len)) in FILES.iter().enumerate() {
        fs.create(p).unwrap();
        let mut f = fs.open(p).unwrap();
        fs.write(&mut f, 0, b"head").unwrap();
        fs.write(&mut f, off, &vec![i as u8 + 1; len]).unwrap();
        fs.close(f).unwrap();
    }
    let r = fsck::fsck(&fs);
    assert!(r.is_consistent() && r.leaked_blocks.is_empty(), "{r:?}");
    fs.unmount().unwrap();
}

/// Runs everything the file system offers on the image; returns whether
/// the damage was noticed (mount refused it, or fsck reported errors).
fn exercise(img: &Path) -> bool {
    let mut fs = match Fs::mount(engine(img, None)) {
        Ok(fs) => fs,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return true;
        }
    };
    let noticed = !fsck::fsck(&fs).is_consistent();
    // Walk the tree, reading the head and the tail of every file.
    let mut todo = vec![String::new()];
    let mut files = Vec::new();
    let mut walked = 0;
    while let Some(d) = todo.pop() {
        walked += 1;
        if walked > 100 {
            break;
        }
        let Ok(list) = fs.list(&d) else { continue };
        for e in list {
            let p = format!("{d}/{}", e.name);
            let _ = fs.stat(&p);
            if e.kind == layout::KIND_DIR {
                todo.push(p);
            } else if let Ok(mut f) = fs.open(&p) {
                let mut b = vec![0u8; 3 * BS];
                let _ = fs.read(&mut f, 0, &mut b);
                let tail = f.size().saturating_sub(BS as u64);
                let _ = fs.read(&mut f, tail, &mut b);
                let _ = fs.read(&mut f, u64::MAX - 10, &mut b);
                let _ = fs.close(f);
                files.push(p);
            }
        }
    }
    // Change it: new files and directories, writes that allocate direct,
    // indirect and double-indirect blocks, syncs, renames, removals.
    let _ = fs.mkdir("new");
    let _ = fs.create("new/x");
    files.push("new/x".into());
    for p in &files {
        if let Ok(mut f) = fs.open(p) {
            let size = f.size();
            for off in [0, 4096 * 13, 4096 * (12 + 512 + 1), size] {
                let _ = fs.write(&mut f, off, &[0x5a; 5000]);
            }
            let _ = fs.sync_soft(&mut f);
            let _ = fs.truncate(&mut f);
            let _ = fs.write(&mut f, 100, b"again");
            // A hard sync (a device flush) for the first file only: the
            // flush costs a disk write of the image each time.
            if p == &files[0] {
                let _ = fs.sync_hard(&mut f);
            }
            let _ = fs.close(f);
        }
    }
    for p in &files {
        let _ = fs.rename(p, &format!("{p}.r"));
    }
    let _ = fs.rename("d", "new/d");
    for p in &files {
        let _ = fs.remove(&format!("{p}.r"));
    }
    let _ = fs.remove("new/d/e");
    let r = fsck::fsck(&fs);
    if r.is_consistent() {
        let _ = fsck::repair(&mut fs, &r);
    }
    if let Ok(eng) = fs.unmount() {
        if let Ok(fs) = Fs::mount(eng) {
            let _ = fsck::fsck(&fs);
        }
    }
    noticed
}

struct Image {
    orig: Vec<u8>,
    sb: layout::Super,
}

impl Image {
    fn inode_at(&self, ino: u32) -> usize {
        self.sb.itable_start as usize * BS + ino as usize * layout::INODE_SIZE
    }

    fn inode(&self, ino: u32) -> layout::Inode {
        let at = self.inode_at(ino);
        layout::Inode::decode(&self.orig[at..at + layout::INODE_SIZE], ino, &self.sb).unwrap()
    }

    fn used_inodes(&self) -> Vec<u32> {
        (1..self.sb.inodes)
            .filter(|&i| self.inode(i).kind != layout::KIND_FREE)
            .collect()
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Block numbers that are wrong in interesting ways for this image.
fn bad_pointers(img: &Image, other: u64) -> Vec<u64> {
    let sb = &img.sb;
    vec![
        0,
        1,
        sb.itable_start as u64,
        sb.data_start as u64 - 1,
        sb.data_start as u64,
        sb.blocks - 1,
        sb.blocks,
        u32::MAX as u64,
        u64::MAX,
        other,
    ]
}

#[test]
fn damaged_fields_give_errors_never_a_panic_or_a_hang() {
    let d = tempfile::tempdir().unwrap();
    let clean = d.path().join("clean.img");
    populate(&clean);
    let orig = std::fs::read(&clean).unwrap();
    let sb = layout::Super::decode(&orig, orig.len() as u64).unwrap();
    let img = Image { orig, sb };
    let root_block = img.inode(layout::ROOT).direct[0];
    let used = img.used_inodes();
    assert_eq!(used.len(), 3 + FILES.len(), "root, d, d/e and the files");

    // Each case: a name, whether mount or fsck must notice it (a pointer
    // outside the data area, a kind or length no encoder writes, a block
    // in use marked free...), and the image's bytes after the damage.
    let mut cases: Vec<(String, bool, Vec<u8>)> = Vec::new();
    let outside = |v: u64| v != 0 && !img.sb.is_data(v);
    let with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = img.orig.clone();
        edit(&mut b);
        b
    };
    let fix_inode = |b: &mut Vec<u8>, ino: u32| {
        let at = img.inode_at(ino);
        let n = &mut b[at..at + layout::INODE_SIZE];
        n[4..8].fill(0);
        let c = layout::crc32c(n);
        n[4..8].copy_from_slice(&c.to_le_bytes());
    };
    for &ino in &used {
        let at = img.inode_at(ino);
        for v in [0u16, 1, 2, 3, 0xffff] {
            for (field, off) in [("kind", 0), ("nlink", 2)] {
                cases.push((
                    format!("inode {ino} {field} = {v}"),
                    field == "kind" && v > 2,
                    with(&|b| {
                        b[at + off..at + off + 2].copy_from_slice(&v.to_le_bytes());
                        fix_inode(b, ino);
                    }),
                ));
            }
        }
        let max = img.sb.max_file_size();
        for v in [0, 1, 63, 64, 4095, 4097, 1 << 20, max, max + 1, u64::MAX] {
            let dir = img.inode(ino).kind == layout::KIND_DIR;
            cases.push((
                format!("inode {ino} size = {v}"),
                v > max || (dir && v % 64 != 0),
                with(&|b| {
                    b[at + 8..at + 16].copy_from_slice(&v.to_le_bytes());
                    fix_inode(b, ino);
                }),
            ));
        }
        // The first and last direct pointers, the indirect and the
        // double-indirect one.
        for slot in [
            0,
            1,
            layout::NDIRECT - 1,
            layout::NDIRECT,
            layout::NDIRECT + 1,
        ] {
            let off = at + 16 + slot * 8;
            for v in bad_pointers(&img, root_block) {
                cases.push((
                    format!("inode {ino} pointer {slot} = {v}"),
                    outside(v),
                    with(&|b| {
                        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
                        fix_inode(b, ino);
                    }),
                ));
            }
        }
    }
    // Directory entries: every slot in use of every directory's first block.
    for &ino in &used {
        let n = img.inode(ino);
        if n.kind != layout::KIND_DIR {
            continue;
        }
        let blk = n.direct[0] as usize * BS;
        for slot in 0..(n.size as usize / layout::DIRENT_SIZE).max(1) {
            let at = blk + slot * layout::DIRENT_SIZE;
            let other = *used.last().unwrap();
            for v in [
                0,
                1,
                2,
                ino,
                other,
                img.sb.inodes - 1,
                img.sb.inodes,
                u32::MAX,
            ] {
                cases.push((
                    format!("directory {ino} slot {slot} inode = {v}"),
                    v >= img.sb.inodes,
                    with(&|b| b[at..at + 4].copy_from_slice(&v.to_le_bytes())),
                ));
            }
            // (field, offset, value, must be noticed)
            for (field, off, vals) in [
                (
                    "name length",
                    4,
                    &[
                        (0u8, true),
                        (1, false),
                        (55, false),
                        (56, false),
                        (57, true),
                        (255, true),
                    ][..],
                ),
                (
                    "kind",
                    5,
                    &[(0, true), (1, false), (2, false), (3, true), (255, true)],
                ),
                ("padding", 6, &[(1, false), (255, false)]),
                (
                    "name",
                    8,
                    &[(0, true), (b'/', true), (b'.', false), (0xff, true)],
                ),
                ("name end", 8 + 55, &[(b'x', false), (0xc3, false)]),
            ] {
                for &(v, must) in vals {
                    cases.push((
                        format!("directory {ino} slot {slot} {field} = {v}"),
                        must,
                        with(&|b| b[at + off] = v),
                    ));
                }
            }
            cases.push((
                format!("directory {ino} slot {slot} name = .."),
                true,
                with(&|b| {
                    b[at + 4] = 2;
                    b[at + 8..at + 10].copy_from_slice(b"..");
                }),
            ));
        }
    }
    // Indirect blocks: the first entries and the one in use.
    for &ino in &used {
        let n = img.inode(ino);
        let mut ind = vec![];
        if n.indirect != 0 {
            ind.push(("indirect", n.indirect, 2usize));
        }
        if n.dindirect != 0 {
            ind.push(("double-indirect", n.dindirect, 0));
            let mid = u64_at(&img.orig, n.dindirect as usize * BS);
            ind.push(("middle", mid, 3));
        }
        for (what, blk, in_use) in ind {
            for entry in [0, 1, in_use, 511] {
                let at = blk as usize * BS + entry * 8;
                for v in bad_pointers(&img, n.dindirect.max(root_block))
                    .into_iter()
                    .chain([blk])
                {
                    cases.push((
                        format!("inode {ino} {what} block entry {entry} = {v}"),
                        outside(v),
                        with(&|b| b[at..at + 8].copy_from_slice(&v.to_le_bytes())),
                    ));
                }
            }
        }
    }
    // The bitmap: each block in use marked free (a block two files may
    // then share), all of them at once, and every block marked used.
    let bitmap = img.sb.bitmap_start as usize * BS;
    let used_blocks: Vec<usize> = (0..img.sb.blocks as usize)
        .filter(|b| img.orig[bitmap + b / 8] & (1 << (b % 8)) != 0)
        .collect();
    for &blk in &used_blocks {
        cases.push((
            format!("bitmap: block {blk} free"),
            true,
            with(&|b| b[bitmap + blk / 8] &= !(1 << (blk % 8))),
        ));
    }
    cases.push((
        "bitmap: all free".into(),
        true,
        with(&|b| b[bitmap..bitmap + BS].fill(0)),
    ));
    cases.push((
        "bitmap: all used".into(),
        false,
        with(&|b| b[bitmap..bitmap + BS].fill(0xff)),
    ));

    let path = d.path().join("damaged.img");
    let (mut noticed, mut total, mut musts) = (0, 0, 0);
    let mut missed = Vec::new();
    let mut slowest = Duration::ZERO;
    for (name, must, bytes) in &cases {
        std::fs::write(&path, bytes).unwrap();
        let t = Instant::now();
        let seen = exercise(&path);
        let took = t.elapsed();
        total += 1;
        noticed += seen as usize;
        musts += *must as usize;
        if *must && !seen {
            missed.push(name.clone());
        }
        slowest = slowest.max(took);
        assert!(took < Duration::from_secs(20), "{name}: took {took:?}");
    }
    println!("{total} damaged images: {noticed} noticed ({musts} had to be); slowest {slowest:?}");
    assert!(missed.is_empty(), "damage not noticed: {missed:?}");
    // The undamaged image runs the same way and is not "noticed".
    std::fs::write(&path, &img.orig).unwrap();
    assert!(!exercise(&path), "the undamaged image is clean");
    // Most damage is caught at mount or by fsck (some is harmless: a
    // padding byte, a name still valid, a size within the last block).
    assert!(noticed * 2 > total, "only {noticed} of {total} noticed");
}
