//! `iolift-offload`: offload engine checks and benchmarks.
//!
//! ```text
//! iolift-offload info   [--device cpu|gpu]
//! iolift-offload nvrtc  [--arch compute_90]
//! iolift-offload check  --device gpu [--random N] [--map FILE]... [--osds N,N]
//! iolift-offload bench  [--device cpu|gpu] [--osds N] [--pes N] [--max-batch N] [--quick]
//! iolift-offload pool   [--device cpu|gpu] [--osds N] [--pg-num N] [--size N] [--ec]
//! ```

use iolift_crush::placement::Pool;
use iolift_offload::bench::*;
use iolift_offload::kernel::{Nvrtc, CRUSH_CU};
use iolift_offload::synth::{straw2_map, RULE_EC, RULE_REPLICATED};
use iolift_offload::{Device, Inputs, MapHandle, OffloadError};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    v: Vec<String>,
}

impl Args {
    fn opt(&self, name: &str) -> Option<String> {
        self.v
            .iter()
            .position(|a| a == name)
            .and_then(|i| self.v.get(i + 1).cloned())
    }
    fn all(&self, name: &str) -> Vec<String> {
        self.v
            .windows(2)
            .filter(|w| w[0] == name)
            .map(|w| w[1].clone())
            .collect()
    }
    fn flag(&self, name: &str) -> bool {
        self.v.iter().any(|a| a == name)
    }
    fn num(&self, name: &str, d: usize) -> Result<usize, String> {
        match self.opt(name) {
            None => Ok(d),
            Some(s) => s.parse().map_err(|_| format!("{name}: not a number: {s}")),
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = argv.first().cloned() else {
        eprintln!("usage: iolift-offload info|nvrtc|check|bench|pool [options] (see docs/offload.md)");
        return ExitCode::from(2);
    };
    let a = Args { v: argv[1..].to_vec() };
    let r = match cmd.as_str() {
        "info" => info(&a),
        "nvrtc" => nvrtc(&a),
        "check" => check(&a),
        "bench" => bench(&a),
        "pool" => pool(&a),
        _ => Err(format!("unknown command '{cmd}'")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iolift-offload {cmd}: {e}");
            ExitCode::from(1)
        }
    }
}

fn open(a: &Args) -> Result<Device, String> {
    let spec = a.opt("--device").unwrap_or_else(|| "cpu".into());
    Device::open(&spec, a.num("--pes", 0).map_err(|e| e.to_string())?).map_err(|e: OffloadError| e.to_string())
}

fn info(a: &Args) -> Result<(), String> {
    let d = open(a)?;
    println!("device: {}", d.name());
    println!("processing elements: {}", d.processing_elements());
    Ok(())
}

fn nvrtc(a: &Args) -> Result<(), String> {
    let arch = a.opt("--arch").unwrap_or_else(|| "compute_90".into());
    let n = Nvrtc::load().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let (ptx, log) = n.compile(CRUSH_CU, "crush.cu", &arch).map_err(|e| e.to_string())?;
    println!(
        "nvrtc {:?} at {}: crush.cu -> {} bytes of PTX for {arch} in {:.2?}",
        n.version().unwrap_or((0, 0)),
        n.path.display(),
        ptx.len(),
        t.elapsed()
    );
    if !log.trim().is_empty() {
        println!("log:\n{log}");
    }
    Ok(())
}

fn maps(a: &Args, default_osds: &str) -> Result<Vec<(String, iolift_crush::CrushMap)>, String> {
    let mut v = Vec::new();
    for f in a.all("--map") {
        let bytes = std::fs::read(&f).map_err(|e| format!("{f}: {e}"))?;
        v.push((
            f.clone(),
            iolift_crush::decode(&bytes).map_err(|e| format!("{f}: {e}"))?,
        ));
    }
    let osds = a.opt("--osds").unwrap_or_else(|| default_osds.into());
    if v.is_empty() || a.flag("--synthetic") {
        for o in osds.split(',').filter(|s| !s.is_empty()) {
            let n: usize = o.parse().map_err(|_| format!("--osds: {o}"))?;
            v.push((format!("synthetic-straw2-{n}"), straw2_map(n, 10, 10)));
        }
    }
    Ok(v)
}

/// Device vs CPU mapper on every rule of every map, sizes 1..=max, on
/// x = 0..1024 (the crushtool corpus range) and N random inputs.
fn check(a: &Args) -> Result<(), String> {
    let dev = open(a)?;
    let cpu = Device::cpu(0).map_err(|e| e.to_string())?;
    let nrand = a.num("--random", 1_000_000)?;
    let mut bad = 0usize;
    for (name, map) in maps(a, "1000,10000")? {
        let weights = vec![0x10000u32; map.max_devices.max(0) as usize];
        let h = MapHandle::new(map, Some(0)).map_err(|e| e.to_string())?;
        for rule in 0..h.map.max_rules() {
            if h.map.rule(rule).is_none() {
                continue;
            }
            for size in [1usize, 3, 5] {
                for (what, xs) in [
                    ("x=0..1023", (0..1024).collect::<Vec<i32>>()),
                    ("random", random_inputs(nrand, rule as u64 * 31 + size as u64)),
                ] {
                    let t = Instant::now();
                    let g = dev
                        .map(&h, rule, Inputs::Xs(&xs), size, &weights)
                        .map_err(|e| e.to_string())?;
                    let gt = t.elapsed();
                    let c = cpu
                        .map(&h, rule, Inputs::Xs(&xs), size, &weights)
                        .map_err(|e| e.to_string())?;
                    let ok = first_mismatch(&g, &c);
                    println!(
                        "{name} rule {rule} size {size} {what} n={}: {} ({:.3e} mappings/s on {}, {} host fallbacks)",
                        xs.len(),
                        if ok.is_none() { "IDENTICAL" } else { "MISMATCH" },
                        xs.len() as f64 / gt.as_secs_f64(),
                        if dev.is_gpu() { "gpu" } else { "cpu" },
                        g.fallbacks
                    );
                    if let Some(i) = ok {
                        bad += 1;
                        println!("  first mismatch x={}: device {:?} cpu {:?}", xs[i], g.row(i), c.row(i));
                    }
                }
            }
        }
    }
    if bad > 0 {
        return Err(format!("{bad} comparisons differ"));
    }
    println!("all comparisons identical");
    Ok(())
}

fn bench(a: &Args) -> Result<(), String> {
    let dev = Arc::new(open(a)?);
    let quick = a.flag("--quick");
    let osds = a.num("--osds", 1000)?;
    let max_batch = a.num("--max-batch", if quick { 10_000 } else { 1_000_000 })?;
    let map = straw2_map(osds, 10, 10);
    let weights = vec![0x10000u32; osds];
    let h = MapHandle::new(map, None).map_err(|e| e.to_string())?;
    println!(
        "device: {} ({} processing elements)",
        dev.name(),
        dev.processing_elements()
    );
    println!(
        "map: synthetic straw2, {osds} OSDs, 10 per host, 10 hosts per rack; rule 0 = 3-replica chooseleaf firstn host"
    );
    let n = if quick {
        20_000
    } else if dev.is_gpu() {
        10_000_000
    } else {
        200_000
    };
    let r = mappings_per_sec(&dev, &h, RULE_REPLICATED, n, 3, &weights, 3).map_err(|e| e.to_string())?;
    println!("mappings/s (batch of {n}, whole device, median of 3): {r:.3e}");
    let pool = bench_pool(
        dev.clone(),
        h.clone(),
        RULE_REPLICATED,
        3,
        weights.clone(),
        max_batch,
        Duration::from_micros(0),
    )
    .map_err(|e| e.to_string())?;
    let (p50, p99) = round_trip_us(&pool, if quick { 500 } else { 5000 }).map_err(|e| e.to_string())?;
    println!("single-task round trip (submit -> completion, max_wait 0): p50 {p50:.1} us, p99 {p99:.1} us");
    let mut b = 1usize;
    while b <= max_batch {
        let tps =
            tasks_per_sec(&pool, b, Duration::from_millis(if quick { 50 } else { 300 })).map_err(|e| e.to_string())?;
        println!("tasks/s, batches of {b}: {tps:.3e}");
        b *= 10;
    }
    let st = pool.stats();
    println!(
        "pool: {} tasks in {} launches (largest {})",
        st.tasks.load(std::sync::atomic::Ordering::Relaxed),
        st.launches.load(std::sync::atomic::Ordering::Relaxed),
        st.largest_launch.load(std::sync::atomic::Ordering::Relaxed)
    );
    pool.shutdown();
    Ok(())
}

fn pool(a: &Args) -> Result<(), String> {
    let dev = open(a)?;
    let osds = a.num("--osds", 10_000)?;
    let pg_num = a.num("--pg-num", 1 << 20)? as u32;
    let size = a.num("--size", 3)?;
    let rule = if a.flag("--ec") { RULE_EC } else { RULE_REPLICATED };
    let map = straw2_map(osds, 10, 10);
    let weights = vec![0x10000u32; osds];
    let h = MapHandle::new(map, Some(1)).map_err(|e| e.to_string())?;
    let p = Pool {
        id: 1,
        pg_num,
        pgp_num: pg_num,
        hashpspool: true,
    };
    let s = whole_pool_secs(&dev, &h, &p, rule, size, &weights, 3).map_err(|e| e.to_string())?;
    println!(
        "whole pool on {}: {pg_num} PGs x {size} ({}) on {osds} OSDs: {:.1} ms (median of 3), {:.3e} PGs/s",
        dev.name(),
        if rule == RULE_EC {
            "EC indep"
        } else {
            "replicated firstn"
        },
        s * 1e3,
        pg_num as f64 / s
    );
    Ok(())
}
