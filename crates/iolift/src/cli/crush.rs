//! `iolift crush ...`: crushtool-compatible testing, decompiling and object
//! placement on top of the `iolift-crush` library.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use iolift_crush::tester::{run_test, test_weights, TestOptions};
use iolift_crush::CrushMap;
use iolift_osdmap::placement::{map_object, Pool};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct CrushArgs {
    #[command(subcommand)]
    pub cmd: CrushCmd,
}

#[derive(Subcommand, Debug)]
pub enum CrushCmd {
    /// Map a range of inputs like `crushtool -i MAP --test` (same output).
    Test(TestArgs),
    /// Print the map as text, like `crushtool -d`.
    Decompile(DecompileArgs),
    /// Summary of a map: devices, buckets per algorithm, rules, tunables.
    Info(InfoArgs),
    /// Object name -> PG -> OSDs.
    MapObject(MapObjectArgs),
    /// Offload benchmark: mappings/s, single-task round trip p50/p99 and
    /// tasks/s for batches of 1..--max-batch on a device.
    Bench(BenchArgs),
    /// Device == CPU mapper on every rule of each map, sizes 1, 3 and 6:
    /// x = 0..1023 and --random N random x per map; fails on any difference.
    Check(CheckArgs),
    /// Map every PG of a pool (id 1, hashpspool) on the synthetic straw2 map
    /// and time it (median of 3).
    MapPool(MapPoolArgs),
}

#[derive(Args, Debug)]
pub struct TestArgs {
    /// Binary crush map.
    #[arg(short = 'i', long = "infn")]
    pub input: String,
    #[arg(long = "min-x", allow_negative_numbers = true)]
    pub min_x: Option<i32>,
    #[arg(long = "max-x", allow_negative_numbers = true)]
    pub max_x: Option<i32>,
    /// Shorthand for --min-x X --max-x X.
    #[arg(long = "x", allow_negative_numbers = true)]
    pub x: Option<i32>,
    #[arg(long = "rule", allow_negative_numbers = true)]
    pub rule: Option<i32>,
    #[arg(long = "min-rule", allow_negative_numbers = true)]
    pub min_rule: Option<i32>,
    #[arg(long = "max-rule", allow_negative_numbers = true)]
    pub max_rule: Option<i32>,
    #[arg(long = "ruleset", allow_negative_numbers = true)]
    pub ruleset: Option<i32>,
    #[arg(long = "num-rep", allow_negative_numbers = true)]
    pub num_rep: Option<i32>,
    #[arg(long = "min-rep", allow_negative_numbers = true)]
    pub min_rep: Option<i32>,
    #[arg(long = "max-rep", allow_negative_numbers = true)]
    pub max_rep: Option<i32>,
    #[arg(long = "pool-id", allow_negative_numbers = true)]
    pub pool_id: Option<i32>,
    /// Device reweight: --weight DEV W (W in 0..1), repeatable.
    #[arg(long = "weight", num_args = 2, value_names = ["DEV", "W"], action = clap::ArgAction::Append, allow_negative_numbers = true)]
    pub weight: Vec<String>,
    #[arg(long = "show-mappings")]
    pub show_mappings: bool,
    #[arg(long = "show-bad-mappings")]
    pub show_bad_mappings: bool,
    #[arg(long = "show-statistics")]
    pub show_statistics: bool,
    #[arg(long = "show-utilization")]
    pub show_utilization: bool,
    #[arg(long = "show-utilization-all")]
    pub show_utilization_all: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where to write the report (crushtool writes it to stderr; default stdout).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Where to map: cpu, or gpu[:N] (the offload engine): every mapping of the
    /// test is computed on the device and checked against the CPU mapper
    /// before the (then identical) report is written.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// cpu, cpu:N (N workers), gpu, gpu:N (GPU ordinal).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Processing elements: CPU workers / CUDA streams (0 = default).
    #[arg(long, default_value_t = 0)]
    pub pes: usize,
    /// OSDs of the synthetic straw2 map (10 per host, 10 hosts per rack).
    #[arg(long, default_value_t = 1000)]
    pub osds: usize,
    /// Largest batch of the tasks/s sweep (1, 10, ... up to this).
    #[arg(long = "max-batch", default_value_t = 1_000_000)]
    pub max_batch: usize,
    /// Short runs (smoke test).
    #[arg(long)]
    pub quick: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// cpu, cpu:N, gpu, gpu:N.
    #[arg(long, default_value = "gpu")]
    pub device: String,
    /// Processing elements: CPU workers / CUDA streams (0 = default).
    #[arg(long, default_value_t = 0)]
    pub pes: usize,
    /// Random inputs per map (split over its rules and sizes).
    #[arg(long, default_value_t = 1_000_000)]
    pub random: usize,
    /// Binary crush map (repeatable).
    #[arg(long = "map")]
    pub maps: Vec<String>,
    /// Also the synthetic straw2 maps of --osds (always, without --map).
    #[arg(long)]
    pub synthetic: bool,
    /// OSD counts of the synthetic maps, comma-separated.
    #[arg(long, default_value = "1000,10000")]
    pub osds: String,
}

#[derive(Args, Debug)]
pub struct MapPoolArgs {
    /// cpu, cpu:N, gpu, gpu:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Processing elements: CPU workers / CUDA streams (0 = default).
    #[arg(long, default_value_t = 0)]
    pub pes: usize,
    /// OSDs of the synthetic straw2 map (10 per host, 10 hosts per rack).
    #[arg(long, default_value_t = 10_000)]
    pub osds: usize,
    #[arg(long = "pg-num", default_value_t = 1 << 20)]
    pub pg_num: u32,
    /// Replicas, or shards with --ec.
    #[arg(long, default_value_t = 3)]
    pub size: usize,
    /// The EC rule (chooseleaf indep) instead of the replicated one.
    #[arg(long)]
    pub ec: bool,
}

#[derive(Args, Debug)]
pub struct DecompileArgs {
    #[arg(short = 'i', long = "infn")]
    pub input: String,
    #[arg(short = 'o', long = "outfn")]
    pub output: Option<String>,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[arg(short = 'i', long = "infn")]
    pub input: String,
}

#[derive(Args, Debug)]
pub struct MapObjectArgs {
    #[arg(short = 'i', long = "infn")]
    pub input: String,
    #[arg(long = "pool-id")]
    pub pool_id: i64,
    #[arg(long = "pg-num")]
    pub pg_num: u32,
    #[arg(long = "pgp-num")]
    pub pgp_num: Option<u32>,
    #[arg(long)]
    pub hashpspool: bool,
    #[arg(long, default_value_t = 0)]
    pub rule: i32,
    #[arg(long = "num-rep", default_value_t = 3)]
    pub num_rep: i32,
    #[arg(long)]
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
}

fn load(path: &str) -> Result<CrushMap> {
    let buf = std::fs::read(path).with_context(|| format!("reading crush map {path}"))?;
    iolift_crush::decode(&buf).with_context(|| format!("decoding crush map {path}"))
}

/// For decompile and info: also maps Ceph accepts but the mapper refuses
/// (huge retry counts, bucket cycles, ...), as crushtool -d shows them.
fn load_for_text(path: &str) -> Result<CrushMap> {
    let buf = std::fs::read(path).with_context(|| format!("reading crush map {path}"))?;
    iolift_crush::decode::decode_for_text(&buf)
        .with_context(|| format!("decoding crush map {path}"))
}

pub fn run(a: CrushArgs) -> Result<ExitCode> {
    match a.cmd {
        CrushCmd::Test(t) => test(t),
        CrushCmd::Bench(b) => {
            let dev = iolift_offload::device::open(&b.device, b.pes)?;
            let o = iolift_offload::kernels::crush::bench::BenchOpts {
                osds: b.osds,
                max_batch: b.max_batch,
                quick: b.quick,
            };
            iolift_offload::kernels::crush::bench::report(dev, &o, &mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        CrushCmd::Check(c) => {
            let dev = iolift_offload::device::open(&c.device, c.pes)?;
            let mut maps = Vec::new();
            for f in &c.maps {
                maps.push((f.clone(), load(f)?));
            }
            if maps.is_empty() || c.synthetic {
                for o in c.osds.split(',').filter(|s| !s.is_empty()) {
                    let n: usize = o.parse().with_context(|| format!("--osds: {o}"))?;
                    maps.push((
                        format!("synthetic-straw2-{n}"),
                        iolift_offload::kernels::crush::synth::straw2_map(n, 10, 10),
                    ));
                }
            }
            iolift_offload::kernels::crush::check::check_maps(
                &*dev,
                maps,
                c.random,
                &mut std::io::stdout(),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        CrushCmd::MapPool(p) => {
            let dev = iolift_offload::device::open(&p.device, p.pes)?;
            let o = iolift_offload::kernels::crush::bench::PoolOpts {
                osds: p.osds,
                pg_num: p.pg_num,
                size: p.size,
                ec: p.ec,
            };
            iolift_offload::kernels::crush::bench::whole_pool(&*dev, &o, &mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        CrushCmd::Decompile(d) => {
            let map = load_for_text(&d.input)?;
            let (text, stopped) = iolift_crush::decompile::decompile_partial(&map);
            if let Some(why) = stopped {
                // crushtool -d prints what it could and says why on stderr.
                eprintln!("{why}");
            }
            match d.output {
                Some(p) => std::fs::write(&p, text).with_context(|| format!("writing {p}"))?,
                None => std::io::stdout().write_all(text.as_bytes())?,
            }
            Ok(ExitCode::SUCCESS)
        }
        CrushCmd::Info(i) => {
            let map = load_for_text(&i.input)?;
            print!("{}", iolift_crush::decompile::info(&map));
            Ok(ExitCode::SUCCESS)
        }
        CrushCmd::MapObject(m) => {
            let map = load(&m.input)?;
            if !(1..=255).contains(&m.num_rep) {
                bail!("--num-rep {} out of range 1..255", m.num_rep);
            }
            let pool = Pool {
                id: m.pool_id,
                pg_num: m.pg_num,
                pgp_num: m.pgp_num.unwrap_or(m.pg_num),
                hashpspool: m.hashpspool,
            };
            let weight = test_weights(&map, &[]);
            let p = map_object(
                &map,
                &pool,
                m.namespace.as_deref(),
                &m.name,
                m.rule,
                m.num_rep as usize,
                &weight,
            )?;
            println!(
                "object '{}' -> hash {:#010x} -> pg {}.{:x} -> pps {} -> {:?}",
                m.name, p.raw_hash, m.pool_id, p.ps, p.pps, p.osds
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn test(t: TestArgs) -> Result<ExitCode> {
    let map = load(&t.input)?;
    let mut o = TestOptions::default();
    if let Some(x) = t.x {
        o.min_x = x;
        o.max_x = x;
    }
    if let Some(v) = t.min_x {
        o.min_x = v;
    }
    if let Some(v) = t.max_x {
        o.max_x = v;
    }
    if let Some(r) = t.rule {
        if map.rule(r).is_none() {
            bail!(
                "rule {r} does not exist in the crush map (max_rules {})",
                map.max_rules()
            );
        }
        o.min_rule = r;
        o.max_rule = r;
    }
    if let Some(v) = t.min_rule {
        o.min_rule = v;
    }
    if let Some(v) = t.max_rule {
        o.max_rule = v;
    }
    if let Some(v) = t.ruleset {
        o.ruleset = v;
    }
    if let Some(n) = t.num_rep {
        o.min_rep = n;
        o.max_rep = n;
    }
    if let Some(v) = t.min_rep {
        o.min_rep = v;
    }
    if let Some(v) = t.max_rep {
        o.max_rep = v;
    }
    if o.max_rep > 1024 {
        bail!("--num-rep {} out of range (at most 1024)", o.max_rep);
    }
    if let Some(p) = t.pool_id {
        o.pool_id = p;
    }
    for pair in t.weight.chunks(2) {
        let dev: i32 = pair[0]
            .parse()
            .with_context(|| format!("bad --weight device '{}'", pair[0]))?;
        let w: f32 = pair[1]
            .parse()
            .with_context(|| format!("bad --weight value '{}'", pair[1]))?;
        o.weights.push((dev, w));
    }
    o.show_mappings = t.show_mappings;
    o.show_bad_mappings = t.show_bad_mappings;
    o.show_statistics = t.show_statistics;
    o.show_utilization = t.show_utilization;
    o.show_utilization_all = t.show_utilization_all;

    if t.device != "cpu" {
        let dev = iolift_offload::device::open(&t.device, 0)?;
        iolift_offload::kernels::crush::check::verify_test_range(&*dev, &map, &o)?;
    }
    let pool = {
        let mut b = rayon::ThreadPoolBuilder::new();
        if let Some(n) = t.threads {
            b = b.num_threads(n);
        }
        b.build().context("building thread pool")?
    };
    // Total mappings, for the progress bar.
    let (lx, hx) = if o.min_x < 0 || o.max_x < 0 {
        (0i64, 1023i64)
    } else {
        (o.min_x as i64, o.max_x as i64)
    };
    let total = (hx - lx + 1).max(0) as u64;
    // A progress bar on stderr for long runs when stdout is a terminal.
    let bar = if std::io::stdout().is_terminal() && total >= 1_000_000 {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "[{bar:30}] {percent:>3}% {human_pos}/{human_len} mappings, eta {eta}",
            )
            .expect("progress template")
            .progress_chars("#>-"),
        );
        Some(b)
    } else {
        None
    };
    // run_test reports mappings done per (rule, numrep) pass; the bar shows
    // progress through the current pass.
    let mut progress = |done: u64| {
        if let Some(b) = &bar {
            b.set_position(done.saturating_sub(1) % total.max(1) + 1);
        }
    };
    let res = pool.install(|| match &t.output {
        Some(p) => {
            let f = std::fs::File::create(p).with_context(|| format!("creating {p}"))?;
            let mut w = std::io::BufWriter::new(f);
            run_test(&map, &o, &mut w, &mut std::io::stderr(), &mut progress)?;
            w.flush()?;
            anyhow::Ok(())
        }
        None => {
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::new(stdout.lock());
            run_test(&map, &o, &mut w, &mut std::io::stderr(), &mut progress)?;
            w.flush()?;
            anyhow::Ok(())
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    res?;
    Ok(ExitCode::SUCCESS)
}
