//! `iolift ec ...`: erasure coding with the subcommands, arguments and file
//! names of Ceph's `ceph-erasure-code-tool` (test-plugin-exists,
//! validate-profile, calc-chunk-size, encode, decode), plus `bench`. Chunks
//! are byte-identical with Ceph's jerasure and isa plugins (crate
//! `iolift-ec`). Unlike Ceph's tool, a bad profile, stripe unit or shard
//! set is one error line and exit status 1, and nothing is written
//! half-way: outputs go to temporary names and are renamed at the end.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use iolift_ec::bench::{self, BenchOptions};
use iolift_ec::{stripe, Codec, Engine, Profile};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct EcArgs {
    /// Where to encode and decode. Only cpu exists so far.
    #[arg(long, value_enum, default_value = "cpu", global = true)]
    pub device: Device,
    /// CPU kernel: auto (ISA-L if libisal.so.2 loads, else native), isal,
    /// native (iolift's AVX2 or portable loop), scalar (portable loop).
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
    /// in the same run.
    Bench(BenchArgs),
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
    /// Implementations to run (iolift, iolift-native, isal, jerasure,
    /// jerasure-cauchy); by default all that load.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
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
    if args.device == Device::Gpu {
        bail!("--device gpu: no GPU erasure-coding kernel yet (use --device cpu)");
    }
    Ok(Engine::parse(&args.engine)?)
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
            let codec = Codec::with_engine(&p, engine(&args)?)?;
            let input =
                std::fs::read(fname).with_context(|| format!("cannot read {}", fname.display()))?;
            if input.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            let shards = stripe::encode_object(&codec, su, &input)?;
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
            let codec = Codec::with_engine(&p, engine(&args)?)?;
            let mut shards: Vec<Option<Vec<u8>>> = vec![None; n];
            for &i in &have {
                let path = shard_name(fname, i);
                let data = std::fs::read(&path)
                    .with_context(|| format!("cannot read shard {}", path.display()))?;
                shards[i] = Some(data);
            }
            let out = stripe::decode_object(&codec, su, &shards)?;
            write_all_or_nothing(&[(fname.clone(), out.as_slice())])?;
        }
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
            };
            bench::run(&opts, &mut std::io::stdout())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
