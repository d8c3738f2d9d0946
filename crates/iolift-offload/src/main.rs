//! `iolift-offload`: offload engine checks and benchmarks.
//!
//! ```text
//! iolift-offload info   [--device cpu|gpu]
//! iolift-offload nvrtc  [--arch compute_90]
//! iolift-offload check  --device gpu [--random N] [--map FILE]... [--osds N,N]
//! iolift-offload bench  [--device cpu|gpu] [--osds N] [--pes N] [--max-batch N] [--quick]
//! iolift-offload pool   [--device cpu|gpu] [--osds N] [--pg-num N] [--size N] [--ec]
//! ```

use iolift_offload::kernels::crush::bench::{report, whole_pool, BenchOpts, PoolOpts};
use iolift_offload::kernels::crush::check::check_maps;
use iolift_offload::kernels::crush::synth::straw2_map;
use iolift_offload::nvrtc::Nvrtc;
use iolift_offload::{device, Device};
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

fn open(a: &Args) -> Result<Arc<dyn Device>, String> {
    let spec = a.opt("--device").unwrap_or_else(|| "cpu".into());
    device::open(&spec, a.num("--pes", 0)?).map_err(|e| e.to_string())
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
    for k in iolift_offload::kernels::ALL {
        let t = Instant::now();
        let (ptx, log) = n
            .compile(k.source, k.file, &arch)
            .map_err(|e| e.to_string())?;
        println!(
            "nvrtc {:?} at {}: {} -> {} bytes of PTX for {arch} in {:.2?}",
            n.version().unwrap_or((0, 0)),
            n.path.display(),
            k.file,
            ptx.len(),
            t.elapsed()
        );
        if !log.trim().is_empty() {
            println!("log:\n{log}");
        }
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

fn check(a: &Args) -> Result<(), String> {
    let dev = open(a)?;
    let nrand = a.num("--random", 1_000_000)?;
    check_maps(&*dev, maps(a, "1000,10000")?, nrand, &mut std::io::stdout())
        .map_err(|e| e.to_string())
}

fn bench(a: &Args) -> Result<(), String> {
    let dev = open(a)?;
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
    let o = PoolOpts {
        osds: a.num("--osds", 10_000)?,
        pg_num: a.num("--pg-num", 1 << 20)? as u32,
        size: a.num("--size", 3)?,
        ec: a.flag("--ec"),
    };
    whole_pool(&*dev, &o, &mut std::io::stdout()).map_err(|e| e.to_string())
}
