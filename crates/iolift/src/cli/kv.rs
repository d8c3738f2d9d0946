//! `iolift kv`: the key-value store of crates/iolift-kv (rusty-leveldb on
//! AccelFS, see docs/kv.md). `bench` speaks db_bench's flags and prints
//! its report lines; `dump` prints every key and value.

use super::accelfs::{open_image, DirectArg};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use iolift_direct::fs::{fsck, mkfs, Fs, Mkfs};
use iolift_direct::{Config, Engine};
use iolift_kv::bench::{self, BenchOpts};
use iolift_kv::env::lock_image;
use iolift_kv::{AccelEnv, EnvConfig, PosixSyncEnv, SyncMode};
use rusty_leveldb::{LdbIterator, Options, PosixDiskEnv, DB};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;

#[derive(Args, Debug)]
pub struct KvArgs {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// db_bench: run workloads, print `NAME : X micros/op; Y MB/s` lines.
    Bench(BenchArgs),
    /// Print every key and its value in hex, one `KEY HEX` line each.
    Dump(StoreArgs),
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum EnvKind {
    /// AccelFS on --image through the io_uring engine; sync = hard sync
    /// (or soft, --accelfs_sync soft).
    Accelfs,
    /// rusty-leveldb's own POSIX environment on --db (its sync is a
    /// write(2) without fsync).
    Posix,
    /// rusty-leveldb's POSIX environment with sync = fdatasync(2).
    PosixFsync,
}

/// What the engine's sync does on AccelFS (`SyncMode`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SyncArg {
    /// Dirty blocks, inode, device flush: survives a power loss (as
    /// --env posix-fsync).
    Hard,
    /// Dirty blocks and inode written, no device flush: survives the
    /// process being killed, not a power loss (as --env posix).
    Soft,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Snappy,
}

/// Where the database lives and the engine's settings (memory budgets).
#[derive(Args, Debug)]
struct StoreArgs {
    #[arg(long, value_enum, default_value = "accelfs")]
    env: EnvKind,
    /// The database directory: an AccelFS path with --env accelfs, a host
    /// directory otherwise.
    #[arg(long, default_value = "/db")]
    db: String,
    /// The AccelFS image file or block device (--env accelfs).
    #[arg(long)]
    image: Option<PathBuf>,
    /// Make a new AccelFS on --image first; SIZE creates a missing image
    /// file (e.g. 1G; an existing file or device keeps its size). An
    /// image file is allocated in full (fallocate), as a device is.
    #[arg(long, value_name = "SIZE")]
    mkfs: Option<String>,
    /// AccelFS block size for --mkfs.
    #[arg(long = "block_size", default_value = "8K")]
    block_size: String,
    /// O_DIRECT on the image: auto (where allowed), on, off.
    #[arg(long, value_enum, default_value = "auto")]
    direct: DirectArg,
    /// A kernel thread polls the engine's submission queue.
    #[arg(long)]
    sqpoll: bool,
    /// Spin on the engine's completion ring this many microseconds before
    /// sleeping in the kernel (0: sleep at once; a busy CPU meanwhile).
    #[arg(long = "spin_us", default_value_t = 0)]
    spin_us: u32,
    /// AccelFS cache blocks per open file (4 MiB at 8 KiB blocks: a
    /// level-0 table of the default 4 MiB memtable).
    #[arg(long = "cache_blocks", default_value_t = iolift_kv::KV_CACHE_BLOCKS)]
    cache_blocks: usize,
    /// AccelFS cache of all open files together, in MiB (256: what the
    /// host's page cache holds of a default db_bench run's files at 1 KiB
    /// values, so that reads find what they would find there).
    #[arg(long = "accelfs_cache_mb", default_value_t = 256)]
    accelfs_cache_mb: usize,
    /// The engine's memtable size in bytes (db_bench's flag).
    #[arg(long = "write_buffer_size", default_value_t = 4 << 20)]
    write_buffer_size: usize,
    /// The engine's block cache in bytes (db_bench's flag).
    #[arg(long = "cache_size", default_value_t = 8 << 20)]
    cache_size: usize,
    /// Files the engine keeps open (db_bench's flag).
    #[arg(long = "open_files", default_value_t = 100)]
    open_files: usize,
    #[arg(long = "compression_type", value_enum, default_value = "none")]
    compression: Compression,
    /// The engine's sync on AccelFS: hard (with a device flush, the
    /// durability of --env posix-fsync) or soft (without, the durability
    /// of --env posix).
    #[arg(long = "accelfs_sync", value_enum, default_value = "hard")]
    accelfs_sync: SyncArg,
    /// AccelFS write-behind for table files, in blocks: each run of this
    /// many whole blocks is started on the disk while the engine still
    /// writes the table (0: off; at most 1 MiB's worth is used).
    #[arg(long = "accelfs_write_behind", default_value_t = iolift_kv::KV_WRITE_BEHIND)]
    accelfs_write_behind: usize,
    /// Check the file system after the run (--env accelfs); errors fail.
    #[arg(long)]
    fsck: bool,
}

fn flag01(s: &str) -> Result<bool, String> {
    match s {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("{s:?}: 0 or 1")),
    }
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Comma-separated: fillseq, fillrandom, fillsync, overwrite, readseq,
    /// readrandom, compact, verify.
    #[arg(
        long,
        default_value = "fillseq,fillrandom,overwrite,readseq,readrandom"
    )]
    benchmarks: String,
    #[arg(long, default_value_t = 1_000_000)]
    num: u64,
    /// readrandom reads and readseq entries (default: --num).
    #[arg(long)]
    reads: Option<u64>,
    #[arg(long = "value_size", default_value_t = 100)]
    value_size: usize,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Sync every write (0 or 1).
    #[arg(long, value_parser = flag01, default_value = "0", num_args = 0..=1, default_missing_value = "1")]
    sync: bool,
    /// Keep the database between fills (0 or 1).
    #[arg(long = "use_existing_db", value_parser = flag01, default_value = "0", num_args = 0..=1, default_missing_value = "1")]
    use_existing_db: bool,
    #[arg(long, default_value_t = 301)]
    seed: u64,
    /// Print `synced KEY VALUE-HEX` after each synced write.
    #[arg(long = "print_synced")]
    print_synced: bool,
    /// After the report lines, print what the run asked of the storage:
    /// the io_uring engine's requests, bytes and flushes (--env accelfs)
    /// and the process's /proc/self/io counters (every environment).
    #[arg(long)]
    stats: bool,
}

/// The environment: `AccelEnv` (to unmount at the end) or a POSIX one.
struct Store {
    opt: Options,
    accel: Option<AccelEnv>,
    db: PathBuf,
    what: String,
}

fn open_store(a: &StoreArgs) -> Result<Store> {
    if a.open_files < 20 {
        bail!("--open_files: {} (at least 20)", a.open_files);
    }
    let mut opt = Options {
        write_buffer_size: a.write_buffer_size,
        block_cache_capacity_bytes: a.cache_size,
        max_open_files: a.open_files,
        compressor: match a.compression {
            Compression::None => 0,
            Compression::Snappy => 1,
        },
        ..Options::default()
    };
    if a.cache_blocks == 0 {
        bail!("--cache_blocks: 0 (at least 1)");
    }
    if a.accelfs_cache_mb == 0 || a.accelfs_cache_mb > 1 << 20 {
        bail!(
            "--accelfs_cache_mb: {} (1 to {})",
            a.accelfs_cache_mb,
            1 << 20
        );
    }
    match a.env {
        EnvKind::Accelfs => {
            let image = a.image.as_ref().context("--env accelfs needs --image")?;
            let (env, what) = accel_env(a, image)?;
            opt.env = Rc::new(Box::new(env.clone()));
            Ok(Store {
                opt,
                accel: Some(env),
                db: PathBuf::from(&a.db),
                what,
            })
        }
        EnvKind::Posix | EnvKind::PosixFsync => {
            if a.image.is_some() || a.mkfs.is_some() {
                bail!("--image and --mkfs are for --env accelfs");
            }
            opt.env = match a.env {
                EnvKind::Posix => Rc::new(Box::new(PosixDiskEnv::new())),
                _ => Rc::new(Box::new(PosixSyncEnv::new())),
            };
            Ok(Store {
                opt,
                accel: None,
                db: PathBuf::from(&a.db),
                what: format!("{:?} environment in {}", a.env, a.db).to_lowercase(),
            })
        }
    }
}

fn accel_env(a: &StoreArgs, image: &Path) -> Result<(AccelEnv, String)> {
    let create = match &a.mkfs {
        Some(s) if !image.exists() => Some(crate::util::parse_size(s)?),
        _ => None,
    };
    let t = open_image("kv", image, a.direct, create)?;
    if a.mkfs.is_some() {
        // A fresh image is sparse: allocate it, as a block device is.
        if let Err(e) = t.allocate() {
            eprintln!("iolift kv: image left sparse: {e}");
        }
    }
    let io = if t.align() > 1 {
        "O_DIRECT"
    } else {
        "buffered"
    };
    let lock = lock_image(image)?;
    let cfg = Config {
        sqpoll: a.sqpoll.then_some(1000),
        // AccelFS waits for every request: no engine thread.
        inline: true,
        spin_us: a.spin_us,
        ..Config::default()
    };
    let eng = Engine::new(t, cfg)?;
    if a.mkfs.is_some() {
        let bs = crate::util::parse_size(&a.block_size)?;
        let o = Mkfs {
            block_size: u32::try_from(bs).context("--block_size")?,
            inodes: 0,
        };
        mkfs(&eng, &o).with_context(|| format!("mkfs {}", image.display()))?;
    }
    let fs = Fs::mount(eng).with_context(|| format!("mount {}", image.display()))?;
    let what = format!(
        "accelfs on {} ({} byte blocks, {io}, {} sync), database {}",
        image.display(),
        fs.superblock().block_size,
        format!("{:?}", a.accelfs_sync).to_lowercase(),
        a.db
    );
    let cache_budget = (a.accelfs_cache_mb << 20) / fs.superblock().block_size as usize;
    let env = AccelEnv::new(
        fs,
        &EnvConfig {
            cache_blocks: a.cache_blocks,
            cache_budget,
            sync: match a.accelfs_sync {
                SyncArg::Hard => SyncMode::Hard,
                SyncArg::Soft => SyncMode::Soft,
            },
            write_behind: a.accelfs_write_behind,
        },
        Some(lock),
    );
    Ok((env, what))
}

/// Checks (with --fsck) and unmounts an AccelFS store.
fn finish(store: Store, check: bool) -> Result<bool> {
    let Some(env) = store.accel else {
        return Ok(true);
    };
    let mut ok = true;
    if check {
        let r = env.with_fs(|fs| Ok(fsck::fsck(fs)))?;
        for e in &r.errors {
            println!("fsck error: {e}");
        }
        println!(
            "fsck: {} files, {} directories, {} blocks used, {} errors, {} leaked blocks",
            r.files,
            r.dirs,
            r.used_blocks,
            r.errors.len(),
            r.leaked_blocks.len()
        );
        ok = r.is_consistent();
    }
    env.unmount()?;
    Ok(ok)
}

pub fn run(a: KvArgs) -> Result<ExitCode> {
    match a.cmd {
        Sub::Bench(b) => bench_cmd(b),
        Sub::Dump(s) => {
            let store = open_store(&s)?;
            {
                // The engine drops a damaged log's tail and skips a
                // damaged table block without a word: refuse them first.
                let env = store.opt.env.as_ref().as_ref();
                iolift_kv::logcheck::check_logs(env, &store.db)
                    .and_then(|()| iolift_kv::tablecheck::check_tables(env, &store.db))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let mut db = DB::open(&store.db, store.opt.clone())
                    .map_err(|e| anyhow::anyhow!("opening the database: {e}"))?;
                let mut it = db
                    .new_iter()
                    .map_err(|e| anyhow::anyhow!("iterating: {e}"))?;
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                while it.advance() {
                    if let Some((k, v)) = it.current() {
                        let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
                        writeln!(out, "{} {hex}", String::from_utf8_lossy(&k))?;
                    }
                }
                out.flush()?;
                drop(it);
                db.close().map_err(|e| anyhow::anyhow!("closing: {e}"))?;
            }
            let ok = finish(store, s.fsck)?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn bench_cmd(b: BenchArgs) -> Result<ExitCode> {
    let o = BenchOpts {
        benchmarks: b
            .benchmarks
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        num: b.num,
        reads: b.reads,
        value_size: b.value_size,
        threads: b.threads,
        sync: b.sync,
        use_existing_db: b.use_existing_db,
        seed: b.seed,
        print_synced: b.print_synced,
    };
    o.check().map_err(anyhow::Error::msg)?;
    let store = open_store(&b.store)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "iolift kv bench: rusty-leveldb on {}", store.what)?;
    writeln!(out, "Keys:       16 bytes each")?;
    writeln!(out, "Values:     {} bytes each", o.value_size)?;
    writeln!(out, "Entries:    {}", o.num)?;
    writeln!(
        out,
        "RawSize:    {:.1} MB (estimated)",
        (16 + o.value_size) as f64 * o.num as f64 / 1048576.0
    )?;
    writeln!(out, "Threads:    {}", o.threads)?;
    writeln!(out, "------------------------------------------------")?;
    let before = IoCounts::now(&store);
    let r = bench::run(&o, &store.opt, &store.db, &mut out);
    if b.stats {
        IoCounts::now(&store).print_since(&before, &mut out)?;
    }
    drop(out);
    let ok = finish(store, b.store.fsck)?;
    r.map_err(anyhow::Error::msg)?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What a run asked of the storage: the engine's counters (AccelFS) and
/// the process's /proc/self/io (name, value) lines.
struct IoCounts {
    engine: Option<iolift_direct::Stats>,
    proc_io: Vec<(String, u64)>,
}

impl IoCounts {
    fn now(store: &Store) -> IoCounts {
        let engine = store
            .accel
            .as_ref()
            .and_then(|e| e.with_fs(|fs| Ok(fs.engine().stats())).ok());
        let proc_io = std::fs::read_to_string("/proc/self/io")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        IoCounts { engine, proc_io }
    }

    fn print_since(&self, before: &IoCounts, out: &mut dyn Write) -> Result<()> {
        let mib = |b: u64| b as f64 / 1048576.0;
        if let (Some(a), Some(b)) = (self.engine, before.engine) {
            writeln!(
                out,
                "stats: engine: {} reads ({:.1} MiB), {} writes ({:.1} MiB), {} flushes, {} io_uring_enter calls",
                a.reads - b.reads,
                mib(a.read_bytes - b.read_bytes),
                a.writes - b.writes,
                mib(a.written_bytes - b.written_bytes),
                a.flushes - b.flushes,
                a.enters - b.enters
            )?;
        }
        let mut line = String::from("stats: /proc/self/io:");
        for (k, v) in &self.proc_io {
            let was = before
                .proc_io
                .iter()
                .find(|(n, _)| n == k)
                .map_or(0, |x| x.1);
            line.push_str(&format!(" {k} {}", v.saturating_sub(was)));
        }
        writeln!(out, "{line}")?;
        Ok(())
    }
}
