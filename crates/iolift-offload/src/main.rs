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
use std::time::Instant;

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
        eprintln!(
            "usage: iolift-offload info|nvrtc|check|bench|pool [options] (see docs/offload.md)"
        );
        return ExitCode::from(2);
    };
    let a = Args {
        v: argv[1..].to_vec(),
    };
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
    Device::open(&spec, a.num("--pes", 0).map_err(|e| e.to_string())?)
        .map_err(|e: OffloadError| e.to_string())
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
    let (ptx, log) = n
        .compile(CRUSH_CU, "crush.cu", &arch)
        .map_err(|e| e.to_string())?;
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

/// Device vs CPU mapper on every rule of every map: x = 0..1023 (the
/// crushtool range) for sizes 1, 3 and 6, plus `--random N` random inputs
/// per map, split evenly over its (rule, size) pairs.
fn check(a: &Args) -> Result<(), String> {
    let dev = open(a)?;
    let cpu = Device::cpu(0).map_err(|e| e.to_string())?;
    let nrand = a.num("--random", 1_000_000)?;
    let mut bad = 0usize;
    let mut total = 0usize;
    let mut fallbacks = 0usize;
    for (name, map) in maps(a, "1000,10000")? {
        let weights = vec![0x10000u32; map.max_devices.max(0) as usize];
        let h = MapHandle::new(map, Some(0)).map_err(|e| e.to_string())?;
        let rules: Vec<i32> = (0..h.map.max_rules())
            .filter(|&r| h.map.rule(r).is_some())
            .collect();
        let sizes = [1usize, 3, 6];
        let per = nrand / (rules.len() * sizes.len()).max(1);
        let mut map_n = 0usize;
        let mut map_t = 0f64;
        for &rule in &rules {
            for size in sizes {
                let seed = (rule as u64) << 8 | size as u64;
                for xs in [(0..1024).collect::<Vec<i32>>(), random_inputs(per, seed)] {
                    let t = Instant::now();
                    let g = dev
                        .map(&h, rule, Inputs::Xs(&xs), size, &weights)
                        .map_err(|e| e.to_string())?;
                    map_t += t.elapsed().as_secs_f64();
                    map_n += xs.len();
                    fallbacks += g.fallbacks;
                    let c = cpu
                        .map(&h, rule, Inputs::Xs(&xs), size, &weights)
                        .map_err(|e| e.to_string())?;
                    if let Some(i) = first_mismatch(&g, &c) {
                        bad += 1;
                        println!(
                            "MISMATCH {name} rule {rule} size {size} x={}: device {:?} cpu {:?}",
                            xs[i],
                            g.row(i),
                            c.row(i)
                        );
                    }
                }
            }
        }
        total += map_n;
        println!(
            "{name}: {} rules x sizes {sizes:?}, {map_n} inputs: {} ({:.3e} mappings/s on {})",
            rules.len(),
            if bad == 0 {
                "identical so far"
            } else {
                "MISMATCHES"
            },
            map_n as f64 / map_t,
            dev.name()
        );
    }
    println!("{total} inputs compared, {fallbacks} mapped by the host fallback");
    if bad > 0 {
        return Err(format!("{bad} comparisons differ"));
    }
    println!("all comparisons identical");
    Ok(())
}

fn bench(a: &Args) -> Result<(), String> {
    let dev = Arc::new(open(a)?);
    let quick = a.flag("--quick");
    let o = BenchOpts {
        osds: a.num("--osds", 1000)?,
        max_batch: a.num("--max-batch", if quick { 10_000 } else { 1_000_000 })?,
        quick,
    };
    report(dev, &o, &mut std::io::stdout()).map_err(|e| e.to_string())
}

fn pool(a: &Args) -> Result<(), String> {
    let dev = open(a)?;
    let osds = a.num("--osds", 10_000)?;
    let pg_num = a.num("--pg-num", 1 << 20)? as u32;
    let size = a.num("--size", 3)?;
    let rule = if a.flag("--ec") {
        RULE_EC
    } else {
        RULE_REPLICATED
    };
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
