//! `iolift ec ...`: erasure coding with the subcommands, arguments and file
//! names of Ceph's `ceph-erasure-code-tool` (test-plugin-exists,
//! validate-profile, calc-chunk-size, encode, decode), plus `bench`. Chunks
//! are byte-identical with Ceph's jerasure and isa plugins (crate
//! `iolift-ec`). Unlike Ceph's tool, a bad profile, stripe unit or shard
//! set is one error line and exit status 1, and nothing is written
//! half-way: outputs go to temporary names and are renamed at the end.
//!
//! `--device gpu` runs encode, decode and bench on the CUDA device through
//! the offload engine's erasure-coding kernel (`iolift_offload::kernels::
//! ec::EcKernel` in an `IoPool`); without a GPU it fails with an error
//! saying no CUDA device or driver was found.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use iolift_ec::bench::{self, BenchOptions};
use iolift_ec::{stripe, Codec, Engine, Profile};
use iolift_offload::kernels::ec::{bench as ec_bench, EcKernel, Stripes};
use iolift_offload::{Device as OffloadDevice, IoPool, PoolConfig};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct EcArgs {
    /// Where to encode and decode: cpu, or gpu (the CUDA device; w=8
    /// matrix techniques, stripe units a multiple of 4).
    #[arg(long, value_enum, default_value = "cpu", global = true)]
    pub device: Device,
    /// CPU kernel: auto (native where the CPU has AVX2, else ISA-L if
    /// libisal.so.2 loads, else the portable loop), isal, native (iolift's
    /// AVX2 kernel or portable loop), scalar (portable loop).
    #[arg(long, default_value = "auto", global = true)]
    pub engine: String,
    #[command(subcommand)]
    pub cmd: EcCmd,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

#[derive(Subcommand, Debug)]
pub enum EcCmd {
    /// Exit 0 if the plugin (jerasure, isa) is implemented.
    TestPluginExists { plugin: String },
    /// Check a profile; print chunk_count, data_chunk_count,
    /// coding_chunk_count (or only the ones named).
    ValidateProfile {
        profile: String,
        display_params: Vec<String>,
    },
    /// Print the chunk size Ceph's plugin uses for an object of this size.
    CalcChunkSize {
        profile: String,
        object_size: String,
    },
    /// Encode FNAME into FNAME.N for every shard N in WANT_TO_ENCODE
    /// (comma list): stripes of k x STRIPE_UNIT bytes, zero-padded.
    Encode {
        profile: String,
        stripe_unit: String,
        want_to_encode: String,
        fname: PathBuf,
    },
    /// Decode FNAME from the shards FNAME.N listed in WANT_TO_DECODE (at
    /// least k): writes the k data chunks of every stripe (padding included).
    Decode {
        profile: String,
        stripe_unit: String,
        want_to_decode: String,
        fname: PathBuf,
    },
    /// Encode and decode GB/s (data in) against ISA-L and jerasure, measured
    /// in the same run. With --device gpu: GPU encode GB/s (isa
    /// reed_sol_van), data on the device and from host memory, checked
    /// against the CPU codec.
    Bench(BenchArgs),
    /// Rebuild the replaced or failed children of an `ec:` device, offline
    /// (see docs/ec-device.md); `--check` reads every stripe afterwards.
    Rebuild(super::ec_rebuild::RebuildArgs),
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Data chunk counts (m from --m).
    #[arg(long, value_delimiter = ',', default_value = "6,8,10,12")]
    pub k: Vec<usize>,
    #[arg(long, default_value_t = 4)]
    pub m: usize,
    /// Extra k:m pairs, e.g. 4:2.
    #[arg(long, value_delimiter = ',', default_value = "4:2")]
    pub extra: Vec<String>,
    /// Chunk sizes in bytes (suffixes k, m).
    #[arg(long, value_delimiter = ',', default_value = "4k,64k,1m")]
    pub sizes: Vec<String>,
    /// Thread counts to run with; 0 means all cores.
    #[arg(long, value_delimiter = ',', default_value = "1,0")]
    pub threads: Vec<usize>,
    /// Repetitions per cell (the median and best are printed).
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Milliseconds per repetition.
    #[arg(long, default_value_t = 30)]
    pub ms: u64,
    /// Implementations to run (iolift, iolift-native, iolift-isal, isal,
    /// jerasure, iolift-cauchy, jerasure-cauchy); by default all that load
    /// but iolift-native (what iolift runs on an AVX2 CPU).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// How each rep is timed: wall (the wall clock), or cpu (each thread's
    /// own CPU time, so time descheduled by other processes on a busy
    /// machine does not count; thread rates add up).
    #[arg(long, value_enum, default_value = "wall")]
    pub clock: Clock,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    Wall,
    Cpu,
}

fn profile(text: &str) -> Result<Profile> {
    Ok(Profile::parse(text)?)
}

fn number(what: &str, text: &str) -> Result<usize> {
    text.parse::<usize>()
        .with_context(|| format!("{what}={text} is not a non-negative integer"))
}

fn shard_list(what: &str, text: &str) -> Result<Vec<usize>> {
    let mut v = Vec::new();
    for t in text.split(',').filter(|t| !t.is_empty()) {
        v.push(number(what, t)?);
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

fn size_arg(text: &str) -> Result<usize> {
    let t = text.to_ascii_lowercase();
    let (num, mult) = match t.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => match t.strip_suffix('m') {
            Some(n) => (n, 1 << 20),
            None => (t.as_str(), 1),
        },
    };
    Ok(number("size", num)? * mult)
}

fn shard_name(fname: &Path, i: usize) -> PathBuf {
    let mut s = fname.as_os_str().to_owned();
    s.push(format!(".{i}"));
    PathBuf::from(s)
}

/// Writes every (path, bytes) under a temporary name next to it, then
/// renames them all; on an error the temporary files are removed and no
/// target is touched.
fn write_all_or_nothing(files: &[(PathBuf, &[u8])]) -> Result<()> {
    let tmp: Vec<PathBuf> = files
        .iter()
        .map(|(p, _)| {
            let mut s = p.as_os_str().to_owned();
            s.push(format!(".iolift-tmp-{}", std::process::id()));
            PathBuf::from(s)
        })
        .collect();
    let cleanup = |upto: usize| {
        for t in &tmp[..upto] {
            let _ = std::fs::remove_file(t);
        }
    };
    for (i, ((path, data), t)) in files.iter().zip(&tmp).enumerate() {
        if let Err(e) = std::fs::write(t, data) {
            cleanup(i + 1);
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
    }
    for (i, ((path, _), t)) in files.iter().zip(&tmp).enumerate() {
        if let Err(e) = std::fs::rename(t, path) {
            for t in &tmp[i..] {
                let _ = std::fs::remove_file(t);
            }
            return Err(e).with_context(|| format!("cannot rename into {}", path.display()));
        }
    }
    Ok(())
}

fn engine(args: &EcArgs) -> Result<Engine> {
    Ok(Engine::parse(&args.engine)?)
}

/// Stripes per pool task on the GPU.
const GPU_TASK_STRIPES: usize = 64;

/// The CUDA device, or an error saying none (or no driver) was found.
/// `IOLIFT_EC_GPU_DEVICE=cpu` (a dry run of the GPU path's batching and
/// shard layout where there is no GPU) opens the CPU device instead.
fn gpu_device() -> Result<Arc<dyn OffloadDevice>> {
    let spec = std::env::var("IOLIFT_EC_GPU_DEVICE").unwrap_or_else(|_| "gpu".into());
    iolift_offload::device::open(&spec, 4)
        .map_err(|e| anyhow::anyhow!("--device gpu: no CUDA device/driver found ({e})"))
}

/// `input` as stripes of k x su bytes (zero-padded) through `kernel` on
/// the GPU's I/O pool: the output chunks, row r of stripe s at
/// `(s * rows + r) * su`.
fn gpu_run(dev: &Arc<dyn OffloadDevice>, kernel: EcKernel, input: &[u8]) -> Result<Vec<u8>> {
    kernel
        .gpu_supported()
        .map_err(|e| anyhow::anyhow!("--device gpu: {e}"))?;
    let sb = kernel.stripe_bytes();
    let tasks: Vec<Stripes> = input
        .chunks(sb * GPU_TASK_STRIPES)
        .map(|c| {
            let mut v = c.to_vec();
            v.resize(c.len().div_ceil(sb) * sb, 0);
            v.into()
        })
        .collect();
    // launches of about 256 MiB of data at most (page-locked staging)
    let cfg = PoolConfig {
        max_batch: ((256usize << 20) / (sb * GPU_TASK_STRIPES)).max(1),
        ..PoolConfig::default()
    };
    let pool = IoPool::new(dev.clone(), kernel, cfg)?;
    let out = pool.submit_group(tasks).wait()?;
    let mut bytes = Vec::with_capacity(out.bytes.len());
    for i in 0..out.len() {
        bytes.extend_from_slice(out.task(i));
    }
    Ok(bytes)
}

/// encode_object on the GPU: the k + m shards.
fn gpu_encode(
    dev: &Arc<dyn OffloadDevice>,
    p: &Profile,
    su: usize,
    input: &[u8],
) -> Result<Vec<Vec<u8>>> {
    let codec = Arc::new(Codec::new(p)?);
    let (k, m) = (p.k, p.m);
    let parity = gpu_run(dev, EcKernel::encoder(codec, su)?, input)?;
    let n = input.len().div_ceil(k * su);
    let mut shards = vec![vec![0u8; n * su]; k + m];
    for s in 0..n {
        for (j, sh) in shards.iter_mut().enumerate() {
            let dst = &mut sh[s * su..(s + 1) * su];
            if j < k {
                let a = ((s * k + j) * su).min(input.len());
                let b = ((s * k + j + 1) * su).min(input.len());
                dst[..b - a].copy_from_slice(&input[a..b]);
            } else {
                let r = s * m + j - k;
                dst.copy_from_slice(&parity[r * su..(r + 1) * su]);
            }
        }
    }
    Ok(shards)
}

/// decode_object on the GPU: the k data chunks of every stripe.
fn gpu_decode(
    dev: &Arc<dyn OffloadDevice>,
    p: &Profile,
    su: usize,
    shards: &[Option<Vec<u8>>],
) -> Result<Vec<u8>> {
    let k = p.k;
    let have: Vec<usize> = (0..shards.len()).filter(|&i| shards[i].is_some()).collect();
    let len = shards[have[0]].as_ref().map_or(0, |v| v.len());
    if let Some(&i) = have
        .iter()
        .find(|&&i| shards[i].as_ref().map_or(0, |v| v.len()) != len)
    {
        bail!("shard {i} and shard {} differ in size", have[0]);
    }
    if !len.is_multiple_of(su) {
        bail!("shards are {len} bytes, not a multiple of stripe_unit={su}");
    }
    let count = len / su;
    let use_: Vec<usize> = have[..k].to_vec();
    let missing: Vec<usize> = (0..k).filter(|&i| shards[i].is_none()).collect();
    let rebuilt = if missing.is_empty() || count == 0 {
        Vec::new()
    } else {
        let mut input = Vec::with_capacity(count * k * su);
        for s in 0..count {
            for &i in &use_ {
                input.extend_from_slice(&shards[i].as_ref().unwrap()[s * su..(s + 1) * su]);
            }
        }
        let codec = Arc::new(Codec::new(p)?);
        gpu_run(dev, EcKernel::decoder(codec, &use_, &missing, su)?, &input)?
    };
    let mut out = vec![0u8; count * k * su];
    for s in 0..count {
        for j in 0..k {
            let dst = &mut out[(s * k + j) * su..(s * k + j + 1) * su];
            match &shards[j] {
                Some(sh) => dst.copy_from_slice(&sh[s * su..(s + 1) * su]),
                None => {
                    let r = s * missing.len() + missing.iter().position(|&x| x == j).unwrap();
                    dst.copy_from_slice(&rebuilt[r * su..(r + 1) * su]);
                }
            }
        }
    }
    Ok(out)
}

/// `ec bench --device gpu`: encode GB/s on the GPU, data on the device
/// and from host memory, for every k:m and chunk size; exit status 1 if
/// the GPU's parity differs from the CPU codec's.
fn gpu_bench(km: &[(usize, usize)], sizes: &[usize], ms: u64) -> Result<ExitCode> {
    let dev = gpu_device()?;
    println!("device: {}", dev.name());
    let mut ok = true;
    for &(k, m) in km {
        let p = Profile::parse(&format!("plugin=isa,technique=reed_sol_van,k={k},m={m}"))?;
        let codec = Arc::new(Codec::new(&p)?);
        for &len in sizes {
            let kern = EcKernel::encoder(codec.clone(), len)?;
            let stripes = ((256usize << 20) / kern.stripe_bytes()).max(1);
            let r = ec_bench::gpu_encode(&*dev, &kern, stripes, ms.max(100))?;
            ok &= r.matches_cpu;
            println!(
                "gpu encode k={k} m={m} chunk {len}: data on device {:.1} GB/s, from host memory {:.1} GB/s ({stripes} stripes per launch){}",
                r.resident.gbps,
                r.host.gbps,
                if r.matches_cpu { "" } else { " PARITY MISMATCH with the CPU codec" }
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn run(args: EcArgs) -> Result<ExitCode> {
    match &args.cmd {
        EcCmd::TestPluginExists { plugin } => {
            if !iolift_ec::profile::PLUGINS.contains(&plugin.as_str()) {
                bail!(
                    "plugin {plugin} does not exist in iolift (plugins: {})",
                    iolift_ec::profile::PLUGINS.join(", ")
                );
            }
        }
        EcCmd::ValidateProfile {
            profile: text,
            display_params,
        } => {
            let p = profile(text)?;
            let all = ["chunk_count", "data_chunk_count", "coding_chunk_count"];
            let value = |name: &str| match name {
                "chunk_count" => Some(p.chunk_count()),
                "data_chunk_count" => Some(p.k),
                "coding_chunk_count" => Some(p.m),
                _ => None,
            };
            if let Some(bad) = display_params.iter().find(|d| value(d).is_none()) {
                bail!("invalid display param: {bad} (may be: {})", all.join(", "));
            }
            match display_params.as_slice() {
                [] => all
                    .iter()
                    .for_each(|n| println!("{n}: {}", value(n).unwrap())),
                [one] => println!("{}", value(one).unwrap()),
                many => many
                    .iter()
                    .for_each(|n| println!("{n}: {}", value(n).unwrap())),
            }
        }
        EcCmd::CalcChunkSize {
            profile: text,
            object_size,
        } => {
            let p = profile(text)?;
            let size = number("object_size", object_size)?;
            println!("{}", p.chunk_size(size));
        }
        EcCmd::Encode {
            profile: text,
            stripe_unit,
            want_to_encode,
            fname,
        } => {
            let p = profile(text)?;
            let su = number("stripe_unit", stripe_unit)?;
            p.check_stripe_unit(su)?;
            let want = shard_list("want_to_encode", want_to_encode)?;
            let gpu = args.device == Device::Gpu;
            let codec = Codec::with_engine(&p, engine(&args)?)?;
            let dev = if gpu { Some(gpu_device()?) } else { None };
            let input =
                std::fs::read(fname).with_context(|| format!("cannot read {}", fname.display()))?;
            if input.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            let shards = if let Some(dev) = &dev {
                gpu_encode(dev, &p, su, &input)?
            } else {
                stripe::encode_object(&codec, su, &input)?
            };
            // Ceph's tool ignores shard numbers beyond k+m.
            let files: Vec<(PathBuf, &[u8])> = want
                .iter()
                .filter(|&&i| i < p.chunk_count())
                .map(|&i| (shard_name(fname, i), shards[i].as_slice()))
                .collect();
            write_all_or_nothing(&files)?;
        }
        EcCmd::Decode {
            profile: text,
            stripe_unit,
            want_to_decode,
            fname,
        } => {
            let p = profile(text)?;
            let su = number("stripe_unit", stripe_unit)?;
            p.check_stripe_unit(su)?;
            let have = shard_list("want_to_decode", want_to_decode)?;
            let n = p.chunk_count();
            if let Some(bad) = have.iter().find(|&&i| i >= n) {
                bail!("want_to_decode: shard {bad} does not exist (k+m = {n})");
            }
            if have.len() < p.k {
                bail!(
                    "want_to_decode lists {} shards ({want_to_decode}), at least k={} are needed",
                    have.len(),
                    p.k
                );
            }
            let gpu = args.device == Device::Gpu;
            let codec = Codec::with_engine(&p, engine(&args)?)?;
            let dev = if gpu { Some(gpu_device()?) } else { None };
            let mut shards: Vec<Option<Vec<u8>>> = vec![None; n];
            for &i in &have {
                let path = shard_name(fname, i);
                let data = std::fs::read(&path)
                    .with_context(|| format!("cannot read shard {}", path.display()))?;
                shards[i] = Some(data);
            }
            let out = if let Some(dev) = &dev {
                gpu_decode(dev, &p, su, &shards)?
            } else {
                stripe::decode_object(&codec, su, &shards)?
            };
            write_all_or_nothing(&[(fname.clone(), out.as_slice())])?;
        }
        EcCmd::Rebuild(r) => return super::ec_rebuild::run(r),
        EcCmd::Bench(b) => {
            engine(&args)?;
            let mut km: Vec<(usize, usize)> = b.k.iter().map(|&k| (k, b.m)).collect();
            for e in b.extra.iter().filter(|e| !e.is_empty()) {
                let (k, m) = e
                    .split_once(':')
                    .with_context(|| format!("--extra {e}: expected K:M"))?;
                km.push((number("k", k)?, number("m", m)?));
            }
            let sizes = b
                .sizes
                .iter()
                .map(|s| size_arg(s))
                .collect::<Result<Vec<_>>>()?;
            if args.device == Device::Gpu {
                return gpu_bench(&km, &sizes, b.ms);
            }
            let all = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = b
                .threads
                .iter()
                .map(|&t| if t == 0 { all } else { t })
                .collect();
            let opts = BenchOptions {
                km,
                sizes,
                threads,
                reps: b.reps,
                ms: b.ms,
                only: b.only.clone(),
                cpu_clock: b.clock == Clock::Cpu,
            };
            bench::run(&opts, &mut std::io::stdout())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
