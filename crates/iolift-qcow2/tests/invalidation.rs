//! The invalidation protocol under concurrency: data paths with tiny
//! caches read and write while the control plane discards, zeroes and
//! flushes (so host clusters are freed and reused for other guest
//! clusters). Every 512-byte block carries the guest cluster it belongs
//! to and a version; a read that used a stale mapping would see another
//! cluster's stamp. Writers own their clusters, so a lost write shows as
//! an old version on their read-back.

mod common;
use common::*;
use iolift_qcow2::{ControlPlane, DataPath};
use iolift_testkit::rng::Rng;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;

const CLUSTERS: u64 = 48;

fn stamp(cs: usize, c: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; cs];
    for b in v.chunks_mut(512) {
        b[..8].copy_from_slice(&(c + 1).to_le_bytes());
        b[8..16].copy_from_slice(&version.to_le_bytes());
    }
    v
}

/// Checks a block read from cluster `c`: zeroes, or stamped with `c`.
fn check_block(b: &[u8], c: u64) -> Result<u64, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(0);
    }
    let owner = u64::from_le_bytes(b[..8].try_into().unwrap());
    if owner != c + 1 {
        return Err(format!(
            "cluster {c} read a block of cluster {}",
            owner.wrapping_sub(1)
        ));
    }
    Ok(u64::from_le_bytes(b[8..16].try_into().unwrap()))
}

fn run(cp: Arc<ControlPlane>, seconds: u64) {
    let cs = cp.cluster_size() as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    // writers 0..3 own clusters c with c % 4 == w and never lose a write
    for w in 0..4u64 {
        let (cp, stop) = (cp.clone(), stop.clone());
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let dp = DataPath::new(cp, w as usize);
            let mut rng = Rng::new(w);
            let mut version = 1;
            while !stop.load(Relaxed) {
                let c = rng.below(CLUSTERS / 4) * 4 + w;
                let churn = c >= CLUSTERS / 2; // the discard thread's half
                dp.write(c * cs as u64, &stamp(cs, c, version), false)
                    .map_err(|e| e.to_string())?;
                let mut b = vec![0u8; cs];
                dp.read(c * cs as u64, &mut b).map_err(|e| e.to_string())?;
                for blk in b.chunks(512) {
                    let v = check_block(blk, c)?;
                    if v != version && !(churn && v == 0) {
                        return Err(format!("cluster {c}: wrote version {version}, read {v}"));
                    }
                }
                version += 1;
            }
            Ok(())
        }));
    }
    // readers on other data paths read anything
    for r in 0..3u64 {
        let (cp, stop) = (cp.clone(), stop.clone());
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let dp = DataPath::new(cp, 4 + r as usize);
            let mut rng = Rng::new(100 + r);
            let mut b = vec![0u8; 4096];
            while !stop.load(Relaxed) {
                let c = rng.below(CLUSTERS);
                let at = rng.below(cs as u64 / 4096) * 4096;
                dp.read(c * cs as u64 + at, &mut b)
                    .map_err(|e| e.to_string())?;
                for blk in b.chunks(512) {
                    check_block(blk, c)?;
                }
            }
            Ok(())
        }));
    }
    // the control plane discards, zeroes and flushes the upper half
    {
        let (cp, stop) = (cp.clone(), stop.clone());
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let mut rng = Rng::new(7);
            while !stop.load(Relaxed) {
                let c = CLUSTERS / 2 + rng.below(CLUSTERS / 2);
                let r = match rng.below(3) {
                    0 => cp.discard(c * cs as u64, cs as u64),
                    1 => cp.write_zeroes(c * cs as u64, cs as u64, false),
                    _ => cp.flush(),
                };
                r.map_err(|e| e.to_string())?;
            }
            Ok(())
        }));
    }
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap().unwrap();
    }
}

#[test]
fn no_stale_read_with_tiny_caches() {
    let dir = tempfile::tempdir().unwrap();
    for (name, opts) in [
        ("v3.qcow2", "cluster_size=4096"),
        ("v2.qcow2", "compat=0.10,cluster_size=4096"),
    ] {
        let img = create(dir.path(), name, "1M", opts);
        let cp = open(&img, 2, 8, false);
        run(cp.clone(), 3);
        let inval: u64 = cp
            .caches()
            .iter()
            .map(|c| c.stats.invalidations.load(Relaxed))
            .sum();
        let hits: u64 = cp.caches().iter().map(|c| c.stats.hits.load(Relaxed)).sum();
        assert!(
            inval > 0,
            "{name}: no invalidation happened, the test did not test"
        );
        assert!(hits > 0, "{name}: no cache hit happened");
        cp.close().unwrap();
        drop(cp);
        assert_clean(&img);
    }
}

#[test]
fn resize_keeps_reads_right() {
    let dir = tempfile::tempdir().unwrap();
    let img = create(dir.path(), "r.qcow2", "1M", "cluster_size=4096");
    let cp = open(&img, 64, 2, false);
    let dp = DataPath::new(cp.clone(), 0);
    for c in 0..CLUSTERS {
        dp.write(c * 4096, &stamp(4096, c, 1), false).unwrap();
    }
    let mut b = vec![0u8; 4096];
    for c in 0..CLUSTERS {
        dp.read(c * 4096, &mut b).unwrap();
        assert_eq!(check_block(&b, c), Ok(1));
    }
    assert_eq!(cp.caches()[0].len(), CLUSTERS as usize);
    cp.resize_cache(0, 1);
    assert_eq!(cp.caches()[0].len(), 1);
    for c in 0..CLUSTERS {
        cp.discard(c * 4096, 4096).unwrap();
        let mut b = vec![1u8; 4096];
        dp.read(c * 4096, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == 0),
            "cluster {c} not zero after discard"
        );
    }
}
