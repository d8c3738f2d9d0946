//! `iolift accelfs`: tools for AccelFS, the small file system of
//! crates/iolift-direct on its io_uring engine (see docs/direct.md): mkfs,
//! fsck, ls, mkdir, rm, cp-in, cp-out. IMAGE is an image file or a block
//! device. Also the streaming application on host files (gen-fasta,
//! stream), which uses the same engine.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use iolift_direct::fs::{fsck, layout, mkfs, Fs, Mkfs};
use iolift_direct::{lat, stream};
use iolift_direct::{Config, Direct, Engine, Open, Target};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct AccelfsArgs {
    /// O_DIRECT: auto (where the file system allows it), on, off.
    #[arg(long, value_enum, default_value = "auto", global = true)]
    direct: DirectArg,
    /// A kernel thread polls the engine's submission queue.
    #[arg(long, global = true)]
    sqpoll: bool,
    /// Spin on the engine's completion ring this many microseconds before
    /// sleeping in the kernel (0: sleep at once). Costs a busy CPU while
    /// a request is out; with --sqpoll a request then needs no system call.
    #[arg(long, global = true, default_value_t = 0)]
    spin_us: u32,
    /// The engine's ring is used by this thread only and the kernel posts
    /// completions when it waits (IORING_SETUP_SINGLE_ISSUER and
    /// DEFER_TASKRUN); not with --sqpoll or --spin-us.
    #[arg(long, global = true)]
    defer_taskrun: bool,
    #[command(subcommand)]
    cmd: Sub,
}

/// `--direct` of `iolift accelfs` and `iolift kv`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirectArg {
    Auto,
    On,
    Off,
}

impl From<DirectArg> for Direct {
    fn from(d: DirectArg) -> Direct {
        match d {
            DirectArg::Auto => Direct::Auto,
            DirectArg::On => Direct::On,
            DirectArg::Off => Direct::Off,
        }
    }
}

/// Opens an AccelFS image (created with `create` bytes when given) and
/// says on stderr, as `tool`, when it fell back to buffered I/O.
pub(crate) fn open_image(
    tool: &str,
    image: &Path,
    direct: DirectArg,
    create: Option<u64>,
) -> Result<Target> {
    let t = Target::open(
        image,
        &Open {
            direct: direct.into(),
            create_size: create,
            ..Open::default()
        },
    )?;
    if let Some(why) = t.fallback() {
        eprintln!("iolift {tool}: buffered I/O: {why}");
    }
    Ok(t)
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Make an empty file system (a missing image file is created with --size).
    Mkfs {
        image: PathBuf,
        /// Size of a new image file (e.g. 64M).
        #[arg(long)]
        size: Option<String>,
        /// Block size: 4K to 64K, a power of two.
        #[arg(long, default_value = "8K")]
        block_size: String,
        /// Inodes (0: one per 16 blocks).
        #[arg(long, default_value_t = 0)]
        inodes: u32,
    },
    /// Check bitmap, inode and directory consistency: one line per problem,
    /// exit status 1 when there is one. Leaked space is listed apart.
    Fsck {
        image: PathBuf,
        /// Free leaked blocks and orphan inodes (only when there is no error).
        #[arg(long)]
        repair: bool,
    },
    /// List a directory: kind, size, name.
    Ls {
        image: PathBuf,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Make a directory.
    Mkdir { image: PathBuf, path: String },
    /// Remove a file or an empty directory.
    Rm { image: PathBuf, path: String },
    /// Copy a host file (or - for stdin) into the file system; ends with a
    /// hard sync.
    CpIn {
        image: PathBuf,
        src: PathBuf,
        dst: String,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
        /// Hard sync after every this many bytes, printing `synced BYTES`
        /// on stdout after each.
        #[arg(long)]
        sync_every: Option<String>,
    },
    /// Copy a file out to a host file (or - for stdout).
    CpOut {
        image: PathBuf,
        src: String,
        dst: PathBuf,
    },
    /// Write a FASTA-like file (the streaming application's input) on the
    /// host: `>seqN length=L` headers, bases in lines of 60.
    GenFasta {
        file: PathBuf,
        /// About this many bytes (whole records), e.g. 4G.
        #[arg(long, default_value = "1G")]
        size: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The streaming application: read a host file in chunks and count its
    /// records (`>` at a line start) and lines on the CPU; prints
    /// `records R lines L bytes B seconds S GB/s G`.
    Stream {
        file: PathBuf,
        /// uring: the io_uring engine into registered buffers (O_DIRECT per
        /// --direct); read: read(2) into pageable memory.
        #[arg(long, value_enum, default_value = "uring")]
        io: StreamIo,
        #[arg(long, default_value = "64K")]
        chunk: String,
        /// Reads in flight (uring).
        #[arg(long, default_value_t = 4)]
        depth: usize,
    },
    /// Latency of one request at a time at random aligned offsets: the
    /// engine or pread/pwrite/fdatasync on TARGET (fill it first), or a
    /// file /lat of --span bytes on the AccelFS TARGET; prints `ops N
    /// mean_us M p50_us P p99_us Q cpu_us C` (C: CPU time per request).
    Lat {
        target: PathBuf,
        #[arg(long, value_enum, default_value = "uring")]
        io: LatIo,
        #[arg(long, value_enum, default_value = "read")]
        op: LatOpArg,
        #[arg(long, default_value = "4K")]
        bs: String,
        #[arg(long, default_value_t = 1000)]
        count: usize,
        /// Bytes the offsets range over.
        #[arg(long, default_value = "64M")]
        span: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LatIo {
    Uring,
    Posix,
    Accelfs,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LatOpArg {
    Read,
    Write,
    WriteSync,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum StreamIo {
    Uring,
    Read,
}

impl AccelfsArgs {
    fn direct(&self) -> Direct {
        self.direct.into()
    }

    fn engine(&self, image: &Path, create: Option<u64>) -> Result<Engine> {
        let t = open_image("accelfs", image, self.direct, create)?;
        let cfg = Config {
            sqpoll: self.sqpoll.then_some(1000),
            // AccelFS waits for every request: no engine thread.
            inline: true,
            spin_us: self.spin_us,
            defer_taskrun: self.defer_taskrun,
            ..Config::default()
        };
        Ok(Engine::new(t, cfg)?)
    }

    fn mount(&self, image: &Path) -> Result<Fs> {
        let eng = self.engine(image, None)?;
        Fs::mount(eng).with_context(|| format!("mount {}", image.display()))
    }
}

fn size_arg(s: &str) -> Result<u64> {
    crate::util::parse_size(s)
}

pub fn run(a: AccelfsArgs) -> Result<ExitCode> {
    match &a.cmd {
        Sub::Mkfs {
            image,
            size,
            block_size,
            inodes,
        } => {
            let size = size.as_deref().map(size_arg).transpose()?;
            let bs = size_arg(block_size)?;
            let eng = a.engine(image, size)?;
            let sb = mkfs(
                &eng,
                &Mkfs {
                    block_size: u32::try_from(bs).context("block size")?,
                    inodes: *inodes,
                },
            )
            .with_context(|| format!("mkfs {}", image.display()))?;
            println!(
                "{}: {} blocks of {} bytes, {} inodes, data from block {}",
                image.display(),
                sb.blocks,
                sb.block_size,
                sb.inodes,
                sb.data_start
            );
        }
        Sub::Fsck { image, repair } => {
            let mut fs = a.mount(image)?;
            let r = fsck::fsck(&fs);
            for e in &r.errors {
                println!("error: {e}");
            }
            if !r.leaked_blocks.is_empty() || !r.orphans.is_empty() {
                println!(
                    "leaked: {} blocks, {} orphan inodes {:?}",
                    r.leaked_blocks.len(),
                    r.orphans.len(),
                    r.orphans
                );
            }
            for (ino, dir) in &r.twice_named {
                println!(
                    "twice named: inode {ino} in directory inode {dir} (an interrupted rename)"
                );
            }
            println!(
                "{}: {} files, {} directories, {} blocks used, {} errors",
                image.display(),
                r.files,
                r.dirs,
                r.used_blocks,
                r.errors.len()
            );
            if !r.errors.is_empty() {
                return Ok(ExitCode::from(1));
            }
            if *repair && (!r.leaked_blocks.is_empty() || !r.orphans.is_empty()) {
                fsck::repair(&mut fs, &r)?;
                println!("repaired: leaked space freed");
            }
            fs.unmount()?;
        }
        Sub::Ls { image, path } => {
            let fs = a.mount(image)?;
            for e in fs.list(path)? {
                let p = format!("{}/{}", path.trim_end_matches('/'), e.name);
                let st = fs.stat(&p)?;
                let kind = if e.kind == layout::KIND_DIR { 'd' } else { '-' };
                println!("{kind} {:>12} {}", st.size, e.name);
            }
        }
        Sub::Mkdir { image, path } => {
            let mut fs = a.mount(image)?;
            fs.mkdir(path)?;
            fs.unmount()?;
        }
        Sub::Rm { image, path } => {
            let mut fs = a.mount(image)?;
            fs.remove(path)?;
            fs.unmount()?;
        }
        Sub::CpIn {
            image,
            src,
            dst,
            force,
            sync_every,
        } => {
            let every = sync_every.as_deref().map(size_arg).transpose()?;
            let mut input: Box<dyn Read> = if src.as_os_str() == "-" {
                Box::new(std::io::stdin())
            } else {
                Box::new(
                    std::fs::File::open(src)
                        .with_context(|| format!("cannot open {}", src.display()))?,
                )
            };
            let mut fs = a.mount(image)?;
            if fs.lookup(dst).is_ok() {
                if !*force {
                    bail!("{dst}: exists in {} (give --force)", image.display());
                }
                fs.remove(dst)?;
            }
            fs.create(dst)?;
            let mut f = fs.open(dst)?;
            let mut buf = vec![0u8; 1 << 20];
            let (mut off, mut since) = (0u64, 0u64);
            loop {
                let n = input.read(&mut buf).context("read input")?;
                if n == 0 {
                    break;
                }
                fs.write(&mut f, off, &buf[..n])?;
                off += n as u64;
                since += n as u64;
                if let Some(e) = every {
                    if since >= e {
                        fs.sync_hard(&mut f)?;
                        since = 0;
                        println!("synced {off}");
                        std::io::stdout().flush()?;
                    }
                }
            }
            fs.sync_hard(&mut f)?;
            fs.close(f)?;
            fs.unmount()?;
        }
        Sub::CpOut { image, src, dst } => {
            let mut fs = a.mount(image)?;
            let mut f = fs.open(src)?;
            let mut out: Box<dyn Write> = if dst.as_os_str() == "-" {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(
                    std::fs::File::create(dst)
                        .with_context(|| format!("cannot create {}", dst.display()))?,
                )
            };
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            loop {
                let n = fs.read(&mut f, off, &mut buf)?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])?;
                off += n as u64;
            }
            out.flush()?;
        }
        Sub::GenFasta { file, size, seed } => {
            let c = stream::generate_fasta(file, size_arg(size)?, *seed)?;
            println!("records {} lines {} bytes {}", c.records, c.lines, c.bytes);
        }
        Sub::Lat {
            target,
            io,
            op,
            bs,
            count,
            span,
        } => {
            let spec = lat::LatSpec {
                path: match io {
                    LatIo::Uring => lat::Path::Uring,
                    LatIo::Posix => lat::Path::Posix,
                    LatIo::Accelfs => lat::Path::Accelfs,
                },
                op: match op {
                    LatOpArg::Read => lat::LatOp::Read,
                    LatOpArg::Write => lat::LatOp::Write,
                    LatOpArg::WriteSync => lat::LatOp::WriteSync,
                },
                bs: usize::try_from(size_arg(bs)?).context("--bs")?,
                count: *count,
                span: size_arg(span)?,
                direct: a.direct(),
                seed: 1,
                sqpoll: a.sqpoll.then_some(1000),
                spin_us: a.spin_us,
                defer_taskrun: a.defer_taskrun,
            };
            let r = lat::measure(target, &spec)?;
            println!(
                "ops {} mean_us {:.1} p50_us {:.1} p99_us {:.1} cpu_us {:.2}",
                r.ops, r.mean_us, r.p50_us, r.p99_us, r.cpu_us
            );
        }
        Sub::Stream {
            file,
            io,
            chunk,
            depth,
        } => {
            let chunk = usize::try_from(size_arg(chunk)?).context("--chunk")?;
            let t0 = std::time::Instant::now();
            let c = match io {
                StreamIo::Read => stream::stream_read(file, chunk)?,
                StreamIo::Uring => {
                    stream::stream_direct(file, chunk, *depth, a.direct(), a.sqpoll)?
                }
            };
            let s = t0.elapsed().as_secs_f64();
            println!(
                "records {} lines {} bytes {} seconds {s:.3} GB/s {:.3}",
                c.records,
                c.lines,
                c.bytes,
                c.bytes as f64 / s / 1e9
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
