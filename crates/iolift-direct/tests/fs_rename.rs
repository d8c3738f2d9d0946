//! AccelFS rename and truncate (what the key-value store's environment
//! needs): renames in place, over a file in the same directory block and
//! in another block, refusals; truncation frees every block; fsck clean
//! with no leak after each step and after a remount.

use iolift_direct::fs::{fsck, Fs, Mkfs};
use iolift_direct::{Config, Direct, Engine, Open, Target};
use iolift_testkit::random_bytes;
use std::io::ErrorKind;

fn fresh(dir: &tempfile::TempDir) -> Fs {
    let t = Target::open(
        &dir.path().join("fs.img"),
        &Open {
            direct: Direct::Auto,
            create_size: Some(16 << 20),
            ..Open::default()
        },
    )
    .unwrap();
    let eng = Engine::new(t, Config::default()).unwrap();
    iolift_direct::fs::mkfs(
        &eng,
        &Mkfs {
            block_size: 4096,
            inodes: 256,
        },
    )
    .unwrap();
    Fs::mount(eng).unwrap()
}

fn put(fs: &mut Fs, path: &str, data: &[u8]) {
    if fs.stat(path).is_err() {
        fs.create(path).unwrap();
    }
    let mut f = fs.open(path).unwrap();
    fs.write(&mut f, 0, data).unwrap();
    fs.close(f).unwrap();
}

fn get(fs: &mut Fs, path: &str) -> Vec<u8> {
    let mut f = fs.open(path).unwrap();
    let mut v = vec![0; f.size() as usize];
    assert_eq!(fs.read(&mut f, 0, &mut v).unwrap(), v.len());
    v
}

fn clean(fs: &Fs, ctx: &str) {
    let r = fsck::fsck(fs);
    assert!(r.errors.is_empty(), "{ctx}: {:#?}", r.errors);
    assert!(
        r.leaked_blocks.is_empty() && r.orphans.is_empty() && r.twice_named.is_empty(),
        "{ctx}: {r:?}"
    );
}

#[test]
fn rename_in_place_and_over_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut fs = fresh(&dir);
    fs.mkdir("/d").unwrap();
    let a = random_bytes(50_000, 1);
    let b = random_bytes(70_000, 2);
    put(&mut fs, "/d/a", &a);
    put(&mut fs, "/d/b", &b);
    let used = fsck::fsck(&fs).used_blocks;
    // In place: no target.
    fs.rename("/d/a", "/d/a2").unwrap();
    assert_eq!(get(&mut fs, "/d/a2"), a);
    assert_eq!(fs.stat("/d/a").unwrap_err().kind(), ErrorKind::NotFound);
    clean(&fs, "in place");
    // Over a file in the same directory block: b's blocks are freed.
    fs.rename("/d/a2", "/d/b").unwrap();
    assert_eq!(get(&mut fs, "/d/b"), a);
    let names: Vec<String> = fs.list("/d").unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["b"]);
    let r = fsck::fsck(&fs);
    assert!(
        r.used_blocks < used,
        "the replaced file's blocks are free: {r:?}"
    );
    clean(&fs, "over a file");
    // Over a file in another directory block (64 entries per 4 KiB block).
    for i in 0..70 {
        put(&mut fs, &format!("/d/f{i}"), &[i as u8; 100]);
    }
    let far = random_bytes(9000, 3);
    put(&mut fs, "/d/far", &far);
    fs.rename("/d/far", "/d/b").unwrap();
    assert_eq!(get(&mut fs, "/d/b"), far);
    assert!(fs.stat("/d/far").is_err());
    clean(&fs, "across blocks");
    // Refusals.
    fs.mkdir("/e").unwrap();
    let e = fs.rename("/d/b", "/e/b").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let e = fs.rename("/d/f1", "/d/../x").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    fs.mkdir("/d/sub").unwrap();
    assert!(fs.rename("/d/f1", "/d/sub").is_err());
    assert!(fs.rename("/d/sub", "/d/f1").is_err());
    assert_eq!(
        fs.rename("/d/nosuch", "/d/y").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    fs.rename("/d/sub", "/d/sub2").unwrap();
    // Remount: the same.
    let mut fs = Fs::mount(fs.unmount().unwrap()).unwrap();
    assert_eq!(get(&mut fs, "/d/b"), far);
    assert_eq!(get(&mut fs, "/d/f7"), vec![7u8; 100]);
    assert!(fs.stat("/d/sub2").is_ok());
    clean(&fs, "after remount");
}

#[test]
fn truncate_frees_blocks_synced_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut fs = fresh(&dir);
    fs.create("/t").unwrap();
    let base = fsck::fsck(&fs).used_blocks;
    let mut f = fs.open("/t").unwrap();
    // Past the direct pointers and into the indirect block.
    fs.write(&mut f, 0, &random_bytes(200_000, 4)).unwrap();
    fs.sync_hard(&mut f).unwrap();
    // More, written back by eviction but not synced.
    fs.write(&mut f, 200_000, &random_bytes(300_000, 5))
        .unwrap();
    fs.truncate(&mut f).unwrap();
    assert_eq!(f.size(), 0);
    let mut buf = [1u8; 10];
    assert_eq!(fs.read(&mut f, 0, &mut buf).unwrap(), 0);
    fs.close(f).unwrap();
    assert_eq!(fs.stat("/t").unwrap().size, 0);
    let r = fsck::fsck(&fs);
    assert_eq!(r.used_blocks, base, "every block freed: {r:?}");
    clean(&fs, "truncated");
    // Written again: new contents only.
    let again = random_bytes(30_000, 6);
    put(&mut fs, "/t", &again);
    let mut fs = Fs::mount(fs.unmount().unwrap()).unwrap();
    assert_eq!(get(&mut fs, "/t"), again);
    clean(&fs, "rewritten");
}
