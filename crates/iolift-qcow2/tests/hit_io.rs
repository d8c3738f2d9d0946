//! The host ranges a data path hands to an asynchronous engine:
//! `DataPath::try_hit` (the cache alone) and `DataPath::translate_hit`
//! (a miss translated by the control plane first). The host offsets must
//! be where `qemu-img map` says the guest bytes live, a translation must
//! leave the mapping cached and pinned, requests a hit cannot serve must
//! be refused without pinning anything, and the control plane must not
//! change a mapping while a pin from a translation is held.

mod common;
use common::*;
use iolift_qcow2::{DataPath, Served};
use iolift_testkit::process::{cmd, run_ok};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::time::Duration;

/// Host offset of guest byte `off` as `qemu-img map --output=json` says
/// (None: not data in this image).
fn qemu_host(img: &Path, off: u64) -> Option<u64> {
    let o = run_ok(
        cmd("qemu-img")
            .args(["map", "--output=json", "-f", "qcow2"])
            .arg(img),
    );
    let text = o.stdout;
    // One object per line: { "start": S, "length": L, ..., "data": D, "offset": O}
    for line in text.lines() {
        let field = |name: &str| -> Option<u64> {
            let at = line.find(&format!("\"{name}\": "))? + name.len() + 4;
            let rest = &line[at..];
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            rest[..end].trim().parse().ok()
        };
        let (Some(start), Some(len)) = (field("start"), field("length")) else {
            continue;
        };
        if (start..start + len).contains(&off) {
            if !line.contains("\"data\": true") {
                return None;
            }
            return field("offset").map(|o| o + (off - start));
        }
    }
    None
}

#[test]
fn translated_hits_point_where_qemu_maps_the_data_and_stay_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "h.qcow2", "4M", "cluster_size=65536");
    // 0..1M data, 1M..2M zero clusters, the rest unallocated
    qemu_io(&img, &["write -P 0x5c 0 1M", "write -z 1M 1M"]);
    let cp = open(&img, 4, 1, false);
    let dp = DataPath::new(cp.clone(), 0);
    let c = &cp.caches()[0];
    let guest = 5 * 65536 + 8192;
    let want = qemu_host(&img, guest).expect("qemu maps the written range as data");

    // cold: the cache alone cannot place it, and counts nothing
    assert!(dp.try_hit(guest, 4096, false).is_none());
    assert_eq!(c.stats.misses.load(Relaxed), 0);
    let (h, how) = dp
        .translate_hit(guest, 4096, false)
        .unwrap()
        .expect("a data cluster, aligned, inside one cluster");
    assert_eq!(how, Served::Miss);
    assert_eq!(h.host, want, "host offset of guest byte {guest}");
    assert_eq!(c.stats.misses.load(Relaxed), 1);
    assert_eq!(cp.stats.translations.load(Relaxed), 1);
    let mut b = vec![0u8; 4096];
    std::fs::File::open(&img)
        .unwrap()
        .read_exact_at(&mut b, h.host)
        .unwrap();
    assert!(b.iter().all(|&x| x == 0x5c), "the bytes at the host offset");

    // the control plane waits for the pin before it changes the mapping
    let (tx, rx) = mpsc::channel();
    let cp2 = cp.clone();
    let t = std::thread::spawn(move || {
        cp2.discard(5 * 65536, 65536).unwrap();
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the discard changed a mapping with I/O pinned on it"
    );
    drop(h);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the discard finished once the pin was released");
    t.join().unwrap();
    assert!(
        dp.translate_hit(guest, 4096, false).unwrap().is_none(),
        "a discarded cluster is not data any more"
    );

    // another data cluster: translated once, then a plain hit
    let g2 = 7 * 65536;
    let (h2, how) = dp.translate_hit(g2, 8192, true).unwrap().unwrap();
    assert_eq!(how, Served::Miss);
    assert_eq!(Some(h2.host), qemu_host(&img, g2));
    drop(h2);
    let h3 = dp
        .try_hit(g2, 8192, true)
        .expect("cached by the translation");
    assert_eq!(Some(h3.host), qemu_host(&img, g2));
    drop(h3);

    // not for a hit: unaligned, across clusters, zero, unallocated
    let before = cp.stats.translations.load(Relaxed);
    assert!(dp
        .translate_hit(guest + 512, 4096, false)
        .unwrap()
        .is_none());
    assert!(dp
        .translate_hit(6 * 65536 - 4096, 8192, false)
        .unwrap()
        .is_none());
    assert_eq!(
        cp.stats.translations.load(Relaxed),
        before,
        "requests a hit cannot serve are refused before any translation"
    );
    assert!(dp.translate_hit(1 << 20, 4096, false).unwrap().is_none());
    assert!(dp.translate_hit(3 << 20, 4096, false).unwrap().is_none());
    // the synchronous path reads them from the cache now, as zeroes
    let mut z = vec![1u8; 4096];
    assert_eq!(dp.read_served(1 << 20, &mut z).unwrap(), Served::Hit);
    assert!(z.iter().all(|&x| x == 0));
    cp.close().unwrap();
    assert_clean(&img);

    // a read-only open never hands out a host range for a write
    let ro = open(&img, 4, 1, true);
    let dp = DataPath::new(ro.clone(), 0);
    assert!(dp.translate_hit(0, 4096, true).unwrap().is_none());
    assert!(dp.translate_hit(0, 4096, false).unwrap().is_some());
}
