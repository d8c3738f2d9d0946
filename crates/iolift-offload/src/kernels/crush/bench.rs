//! CRUSH offload measurements for `iolift crush bench`, `iolift offload
//! pool` and scripts/gpu-check.sh: mappings/s, task round trip, tasks/s by
//! batch size, whole-pool mapping time.

use super::synth::{straw2_map, RULE_EC, RULE_REPLICATED};
use super::{map, map_pool, CrushKernel, Inputs, MapHandle, Mapping};
use crate::device::Device;
use crate::error::{OffloadError, Result};
use crate::pool::{IoPool, PoolConfig};
use iolift_osdmap::placement::Pool;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[v.len() / 2]
}

/// Median mappings/s of `reps` runs of `n` inputs (0..n) on the whole device.
pub fn mappings_per_sec(
    dev: &dyn Device,
    h: &MapHandle,
    rule: i32,
    n: usize,
    result_max: usize,
    weights: &[u32],
    reps: usize,
) -> Result<f64> {
    let xs: Vec<i32> = (0..n as i32).collect();
    map(
        dev,
        h,
        rule,
        Inputs::Xs(&xs[..n.min(1024)]),
        result_max,
        weights,
    )?; // warm up, upload
    let mut rates = Vec::new();
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        map(dev, h, rule, Inputs::Xs(&xs), result_max, weights)?;
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    Ok(median(&mut rates))
}

/// Whole-pool time (median seconds) for `pg_num` PGs.
pub fn whole_pool_secs(
    dev: &dyn Device,
    h: &MapHandle,
    pool: &Pool,
    rule: i32,
    size: usize,
    weights: &[u32],
    reps: usize,
) -> Result<f64> {
    map_pool(dev, h, pool, rule, size, weights)?;
    let mut v = Vec::new();
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        map_pool(dev, h, pool, rule, size, weights)?;
        v.push(t.elapsed().as_secs_f64());
    }
    Ok(median(&mut v))
}

/// Single-task round trip through the pool: (p50, p99) in microseconds.
pub fn round_trip_us(pool: &IoPool<CrushKernel>, iters: usize) -> Result<(f64, f64)> {
    for i in 0..100 {
        pool.submit(i).wait()?;
    }
    let mut v = Vec::with_capacity(iters);
    for i in 0..iters {
        let t = Instant::now();
        pool.submit(i as i32).wait()?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Ok((p(0.5), p(0.99)))
}

/// Tasks/s of `run` (submits the inputs 0..batch and awaits them), run
/// again until `min_time` has passed.
fn tasks_rate(
    batch: usize,
    min_time: Duration,
    mut run: impl FnMut(&[i32]) -> Result<()>,
) -> Result<f64> {
    let xs: Vec<i32> = (0..batch as i32).collect();
    let t = Instant::now();
    let mut done = 0usize;
    while done == 0 || t.elapsed() < min_time {
        run(&xs)?;
        done += batch;
    }
    Ok(done as f64 / t.elapsed().as_secs_f64())
}

/// Tasks/s when `batch` tasks are submitted at once and all awaited.
pub fn tasks_per_sec(pool: &IoPool<CrushKernel>, batch: usize, min_time: Duration) -> Result<f64> {
    tasks_rate(batch, min_time, |xs| {
        for c in pool.submit_batch(xs) {
            c.wait()?;
        }
        Ok(())
    })
}

/// Tasks/s when `batch` tasks are submitted as one group (`submit_group`:
/// one completion, results in one buffer) and awaited.
pub fn tasks_per_sec_grouped(
    pool: &IoPool<CrushKernel>,
    batch: usize,
    min_time: Duration,
) -> Result<f64> {
    tasks_rate(batch, min_time, |xs| {
        let m = pool.submit_group(xs.to_vec()).wait()?;
        if m.len() != xs.len() {
            return Err(OffloadError::Invalid(format!(
                "group of {} came back with {} rows",
                xs.len(),
                m.len()
            )));
        }
        Ok(())
    })
}

/// A pool for round-trip / tasks/s measurements.
pub fn bench_pool(
    dev: Arc<dyn Device>,
    h: Arc<MapHandle>,
    rule: i32,
    result_max: usize,
    weights: Vec<u32>,
    max_batch: usize,
    max_wait: Duration,
) -> Result<IoPool<CrushKernel>> {
    IoPool::new(
        dev,
        CrushKernel::new(h, rule, result_max, weights)?,
        PoolConfig {
            max_batch,
            max_wait,
            pes: 0,
        },
    )
}

/// Compare two mappings; the first differing input index, if any.
pub fn first_mismatch(a: &Mapping, b: &Mapping) -> Option<usize> {
    (0..a.len().max(b.len())).find(|&i| i >= a.len() || i >= b.len() || a.row(i) != b.row(i))
}

/// SplitMix-style deterministic random inputs (full 32-bit range).
pub fn random_inputs(n: usize, seed: u64) -> Vec<i32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as i32
        })
        .collect()
}

/// What `report` measures.
#[derive(Debug, Clone, Copy)]
pub struct BenchOpts {
    /// OSDs of the synthetic straw2 map (10 per host, 10 hosts per rack).
    pub osds: usize,
    /// Largest batch for the tasks/s sweep (1, 10, ... up to this).
    pub max_batch: usize,
    /// Short runs (CI smoke).
    pub quick: bool,
}

/// The `crush bench` report: mappings/s on the whole device, single-task
/// round trip through the I/O pool (p50/p99), tasks/s by batch size.
pub fn report(dev: Arc<dyn Device>, o: &BenchOpts, out: &mut dyn std::io::Write) -> Result<()> {
    let io = |e: std::io::Error| OffloadError::Invalid(format!("write: {e}"));
    let map = straw2_map(o.osds, 10, 10);
    let weights = vec![0x10000u32; o.osds];
    let h = MapHandle::new(map, None)?;
    writeln!(
        out,
        "device: {} ({} processing elements)",
        dev.name(),
        dev.processing_elements()
    )
    .map_err(io)?;
    if dev.is_gpu() {
        writeln!(out, "crush thread kernel: {}", super::thread_kernel_name()).map_err(io)?;
    }
    writeln!(
        out,
        "map: synthetic straw2, {} OSDs, 10 per host, 10 hosts per rack; rule 0 = 3-replica chooseleaf firstn host",
        o.osds
    )
    .map_err(io)?;
    let n = if o.quick {
        20_000
    } else if dev.is_gpu() {
        10_000_000
    } else {
        1_000_000
    };
    let r = mappings_per_sec(&*dev, &h, RULE_REPLICATED, n, 3, &weights, 3)?;
    writeln!(
        out,
        "mappings/s (batch of {n}, whole device, median of 3): {r:.3e}"
    )
    .map_err(io)?;
    let pool = bench_pool(
        dev.clone(),
        h.clone(),
        RULE_REPLICATED,
        3,
        weights,
        o.max_batch,
        Duration::from_micros(0),
    )?;
    let (p50, p99) = round_trip_us(&pool, if o.quick { 500 } else { 5000 })?;
    writeln!(
        out,
        "single-task round trip (submit -> completion, max_wait 0): p50 {p50:.1} us, p99 {p99:.1} us"
    )
    .map_err(io)?;
    let mt = Duration::from_millis(if o.quick { 50 } else { 500 });
    let mut b = 1usize;
    while b <= o.max_batch {
        let tps = tasks_per_sec(&pool, b, mt)?;
        let gps = tasks_per_sec_grouped(&pool, b, mt)?;
        writeln!(
            out,
            "tasks/s, batches of {b}: {tps:.3e}; grouped (one completion per batch): {gps:.3e}"
        )
        .map_err(io)?;
        b *= 10;
    }
    let st = pool.stats();
    use std::sync::atomic::Ordering::Relaxed;
    writeln!(
        out,
        "pool: {} tasks in {} launches (largest {})",
        st.tasks.load(Relaxed),
        st.launches.load(Relaxed),
        st.largest_launch.load(Relaxed)
    )
    .map_err(io)?;
    pool.shutdown();
    Ok(())
}

/// What `whole_pool` maps.
#[derive(Debug, Clone, Copy)]
pub struct PoolOpts {
    /// OSDs of the synthetic straw2 map (10 per host, 10 hosts per rack).
    pub osds: usize,
    pub pg_num: u32,
    /// Replicas (firstn) or shards (indep).
    pub size: usize,
    /// The EC rule (chooseleaf indep) instead of the replicated one.
    pub ec: bool,
}

/// The `iolift offload pool` report: every PG of a pool (id 1, hashpspool)
/// on the synthetic map, median of 3 runs.
pub fn whole_pool(dev: &dyn Device, o: &PoolOpts, out: &mut dyn std::io::Write) -> Result<()> {
    let rule = if o.ec { RULE_EC } else { RULE_REPLICATED };
    let h = MapHandle::new(straw2_map(o.osds, 10, 10), Some(1))?;
    let weights = vec![0x10000u32; o.osds];
    let p = Pool {
        id: 1,
        pg_num: o.pg_num,
        pgp_num: o.pg_num,
        hashpspool: true,
    };
    let s = whole_pool_secs(dev, &h, &p, rule, o.size, &weights, 3)?;
    writeln!(
        out,
        "whole pool on {}: {} PGs x {} ({}) on {} OSDs: {:.1} ms (median of 3), {:.3e} PGs/s",
        dev.name(),
        o.pg_num,
        o.size,
        if o.ec {
            "EC indep"
        } else {
            "replicated firstn"
        },
        o.osds,
        s * 1e3,
        o.pg_num as f64 / s
    )
    .map_err(|e| OffloadError::Invalid(format!("write: {e}")))
}
