//! Online compaction: clusters move toward the start of the file while
//! data paths with tiny caches read and write, and the file shrinks.
//! Every 512-byte block carries its guest cluster and a version, so a
//! read through a stale mapping shows another cluster's stamp and a lost
//! write an old version; qemu-img checks the image and reads it after.

mod common;
use common::*;
use iolift_qcow2::{ControlPlane, DataPath};
use iolift_testkit::rng::Rng;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;

const CS: usize = 4096;
const CLUSTERS: u64 = 256;

fn stamp(c: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; CS];
    for b in v.chunks_mut(512) {
        b[..8].copy_from_slice(&(c + 1).to_le_bytes());
        b[8..16].copy_from_slice(&version.to_le_bytes());
        b[16..].fill(c as u8 ^ version as u8);
    }
    v
}

/// The version a cluster's bytes carry (0: zeroes); an error when they
/// belong to another cluster or are torn.
fn version_of(b: &[u8], c: u64) -> Result<u64, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(0);
    }
    let v = u64::from_le_bytes(b[8..16].try_into().unwrap());
    if b != &stamp(c, v)[..b.len()] {
        return Err(format!("cluster {c}: bytes are not version {v} of it"));
    }
    Ok(v)
}

/// For a read that may overlap another thread's write or discard of the
/// same cluster (block devices promise nothing about such a read: it may
/// see parts of the old and the new contents): every 512-byte block is
/// zeroes or a block some version of cluster `c` wrote, whole or torn
/// between versions, and never another cluster's. A read through a stale
/// mapping (a moved or freed cluster) shows another cluster's number.
fn belongs_to(b: &[u8], c: u64) -> Result<(), String> {
    for (i, blk) in b.chunks(512).enumerate() {
        let id = u64::from_le_bytes(blk[..8].try_into().unwrap());
        if id != 0 && id != c + 1 {
            return Err(format!(
                "cluster {c}: block {i} carries cluster {}'s stamp",
                id.wrapping_sub(1)
            ));
        }
    }
    Ok(())
}

fn file_len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn compaction_moves_clusters_and_shrinks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for opts in ["cluster_size=4096", "compat=0.10,cluster_size=4096"] {
        let img = create(dir.path(), "c.qcow2", "1M", opts);
        let cp = open(&img, 2, 4, false);
        let dp = DataPath::new(cp.clone(), 0);
        let mut rng = Rng::new(3);
        // allocate in a scattered order, then discard most of the clusters
        let mut order: Vec<u64> = (0..CLUSTERS).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for &c in &order {
            dp.write(c * CS as u64, &stamp(c, 1), false).unwrap();
        }
        for c in 0..CLUSTERS {
            if c % 4 != 0 {
                cp.discard(c * CS as u64, CS as u64).unwrap();
            }
        }
        cp.flush().unwrap();
        let before = file_len(&img);
        let st = cp.compact().unwrap();
        assert!(st.data_moved > 0, "{opts}: nothing moved: {st:?}");
        assert!(st.len_after < st.len_before, "{opts}: {st:?}");
        assert!(file_len(&img) < before * 2 / 3, "{opts}: {st:?}");
        for c in 0..CLUSTERS {
            let mut b = vec![0u8; CS];
            dp.read(c * CS as u64, &mut b).unwrap();
            let want = if c % 4 == 0 { 1 } else { 0 };
            assert_eq!(version_of(&b, c), Ok(want), "{opts}: cluster {c}");
        }
        // a second pass finds nothing more to gain
        let again = cp.compact().unwrap();
        assert_eq!(again.len_after, st.len_after, "{again:?}");
        cp.close().unwrap();
        drop(dp);
        drop(cp);
        assert_clean(&img);
        let raw = qemu_raw(&img);
        for c in 0..CLUSTERS {
            let b = &raw[(c as usize) * CS..(c as usize + 1) * CS];
            let want = if c % 4 == 0 { 1 } else { 0 };
            assert_eq!(version_of(b, c), Ok(want), "qemu-img reads cluster {c}");
        }
        std::fs::remove_file(&img).unwrap();
    }
}

fn concurrent(cp: Arc<ControlPlane>, seconds: u64) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let compactions = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    // writers own clusters c % 4 == w; they write, read back, sometimes
    // discard their own cluster (so the file has holes to compact)
    for w in 0..4u64 {
        let (cp, stop) = (cp.clone(), stop.clone());
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let dp = DataPath::new(cp.clone(), w as usize);
            // read back through another cache too: a write through a
            // stale mapping would read back right through the same one
            let other = DataPath::new(cp.clone(), 6 + (w as usize % 2));
            let mut rng = Rng::new(w + 10);
            let mut version = vec![0u64; CLUSTERS as usize];
            let mut n = 1;
            while !stop.load(Relaxed) {
                // mostly a few hot clusters, so cached mappings are hit
                // while compaction moves them
                let hot = rng.below(4) != 0;
                let c = rng.below(if hot { 4 } else { CLUSTERS / 4 }) * 4 + w;
                let off = c * CS as u64;
                if rng.below(4) == 0 {
                    cp.discard(off, CS as u64).map_err(|e| e.to_string())?;
                    version[c as usize] = 0;
                } else {
                    dp.write(off, &stamp(c, n), false)
                        .map_err(|e| e.to_string())?;
                    version[c as usize] = n;
                    n += 1;
                }
                for path in [&dp, &other] {
                    let mut b = vec![0u8; CS];
                    path.read(off, &mut b).map_err(|e| e.to_string())?;
                    let v = version_of(&b, c).map_err(|e| format!("writer {w}: {e}"))?;
                    if v != version[c as usize] {
                        return Err(format!(
                            "cluster {c}: wrote version {}, read {v}",
                            version[c as usize]
                        ));
                    }
                }
            }
            Ok(())
        }));
    }
    for r in 0..2u64 {
        let (cp, stop) = (cp.clone(), stop.clone());
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let dp = DataPath::new(cp, 4 + r as usize);
            let mut rng = Rng::new(100 + r);
            let mut b = vec![0u8; CS];
            while !stop.load(Relaxed) {
                let c = rng.below(CLUSTERS);
                dp.read(c * CS as u64, &mut b).map_err(|e| e.to_string())?;
                // its owner may be writing or discarding it right now
                belongs_to(&b, c).map_err(|e| format!("reader: {e}"))?;
            }
            Ok(())
        }));
    }
    {
        let (cp, stop, n) = (cp.clone(), stop.clone(), compactions.clone());
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let mut i = 0;
            while !stop.load(Relaxed) {
                cp.compact().map_err(|e| format!("compact: {e}"))?;
                n.fetch_add(1, Relaxed);
                if i % 5 == 2 {
                    cp.snapshot_create(&format!("s{i}"))
                        .map_err(|e| e.to_string())?;
                }
                if i % 5 == 4 {
                    cp.snapshot_delete(&format!("s{}", i - 2))
                        .map_err(|e| e.to_string())?;
                }
                cp.flush().map_err(|e| e.to_string())?;
                i += 1;
            }
            Ok(())
        }));
    }
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap().unwrap();
    }
    compactions.load(Relaxed)
}

#[test]
fn compaction_while_data_paths_read_and_write() {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "w.qcow2", "1M", "cluster_size=4096");
    let cp = open(&img, 2, 8, false);
    let n = concurrent(cp.clone(), 4);
    assert!(n > 0, "no compaction ran");
    let moved = cp.stats.moved.load(Relaxed);
    let hits: u64 = cp.caches().iter().map(|c| c.stats.hits.load(Relaxed)).sum();
    let inval: u64 = cp
        .caches()
        .iter()
        .map(|c| c.stats.invalidations.load(Relaxed))
        .sum();
    eprintln!("{n} compactions moved {moved} clusters; {hits} cache hits, {inval} invalidations");
    assert!(
        hits > 0 && inval > 0,
        "no hit or no invalidation: the test did not test"
    );
    assert!(moved > 0, "compaction moved nothing in {n} runs");
    let active = iolift_raw(&cp);
    cp.close().unwrap();
    drop(cp);
    assert_clean(&img);
    assert_eq!(first_diff(&qemu_raw(&img), &active), None);
}
