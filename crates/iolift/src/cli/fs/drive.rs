//! `iolift fs drive-virtiofs --socket-path PATH --file NAME`: plays a
//! guest's part against a vhost-user-fs daemon (iolift's or QEMU's
//! virtiofsd) and measures random reads or writes of one file of the
//! shared directory, for bench/fs.sh. See docs/fs.md.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use iolift_fs::virtio::driver::{DriveOptions, Driver};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Rw {
    Randread,
    Randwrite,
}

#[derive(Args, Debug)]
pub struct DriveArgs {
    /// The daemon's vhost-user socket.
    #[arg(long, value_name = "PATH")]
    socket_path: PathBuf,
    /// A regular file in the root of the shared directory.
    #[arg(long)]
    file: String,
    #[arg(long, value_enum, default_value = "randread")]
    rw: Rw,
    /// Bytes per request (512 to 1 MiB).
    #[arg(long, default_value_t = 4096)]
    bs: u32,
    /// Requests in flight (1 to 128).
    #[arg(long, default_value_t = 1)]
    iodepth: usize,
    /// Offsets are picked in the first SPAN bytes of the file.
    #[arg(long, default_value_t = 256 << 20)]
    span: u64,
    /// How long to run, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    runtime_ms: u64,
    /// Request queues to set up (the daemon must offer as many, e.g.
    /// `serve-virtiofs --queues N`); requests are spread round-robin.
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Writes carry their own offset in every 8-byte word; reads must find
    /// that pattern or zeros (else the run fails).
    #[arg(long)]
    verify: bool,
}

pub fn run(a: DriveArgs) -> Result<ExitCode> {
    if !(1..=128).contains(&a.iodepth) {
        bail!("--iodepth {}: must be 1 to 128", a.iodepth);
    }
    if !(512..=1 << 20).contains(&a.bs) {
        bail!("--bs {}: must be 512 to 1048576", a.bs);
    }
    let o = DriveOptions {
        file: a.file.clone(),
        write: matches!(a.rw, Rw::Randwrite),
        bs: a.bs,
        depth: a.iodepth,
        span: a.span,
        runtime: Duration::from_millis(a.runtime_ms),
        verify: a.verify,
    };
    let mut d = Driver::connect(&a.socket_path, &a.file, a.iodepth, a.queues)
        .with_context(|| format!("driving {}", a.socket_path.display()))?;
    let r = d.run(&o).context("running the requests")?;
    let per_queue: Vec<String> = r.per_queue.iter().map(u64::to_string).collect();
    println!(
        "ops={} secs={:.3} iops={:.0} lat_p50_us={:.1} lat_mean_us={:.1} per_queue={}",
        r.ops,
        r.secs,
        r.ops as f64 / r.secs.max(1e-9),
        r.lat_p50_us,
        r.lat_mean_us,
        per_queue.join(",")
    );
    Ok(ExitCode::SUCCESS)
}
