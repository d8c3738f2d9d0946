//! `iolift fs mount BACKEND MOUNTPOINT`: serves a file-system backend of
//! crates/iolift-fs (`null`, `null:SIZE`, `mirror:DIR`, `nfs://HOST/EXPORT`,
//! `kv:rados:POOL`) to the kernel's
//! FUSE client on MOUNTPOINT until SIGINT or SIGTERM (or an unmount from
//! outside), then unmounts. See docs/fs.md.

mod budget;
mod devfuse;
mod drive;
mod virtio;

use crate::frontend::{wait_for_signal, StopOn};
use crate::metrics::{self, MetricSource};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use iolift_fs::kernel::{self, KernelOptions};
use iolift_fs::stats::OpStats;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct FsArgs {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Mount BACKEND (null, null:SIZE, mirror:DIR, nfs://HOST/EXPORT,
    /// kv:rados:POOL) on MOUNTPOINT through the kernel's FUSE client (root);
    /// serve until SIGINT/SIGTERM.
    Mount(MountArgs),
    /// Serve BACKEND (null, null:SIZE, mirror:DIR, nfs://HOST/EXPORT,
    /// kv:rados:POOL; or --shared-dir DIR) to a virtual machine over a vhost-user socket (QEMU's vhost-user-fs-pci);
    /// the guest mounts it with `mount -t virtiofs TAG /mnt`. Serves one
    /// connection, then exits (as virtiofsd does).
    ServeVirtiofs(Box<virtio::VirtioArgs>),
    /// Benchmark driver: plays a guest's part against a vhost-user-fs
    /// daemon (iolift's or virtiofsd) and measures random I/O on one file.
    DriveVirtiofs(drive::DriveArgs),
}

#[derive(Args, Debug)]
struct MountArgs {
    /// null | null:SIZE | mirror:DIR | nfs://HOST/EXPORT | kv:rados:POOL
    backend: String,
    /// An existing directory.
    mountpoint: PathBuf,
    /// Worker threads, each reading its own clone of the /dev/fuse fd (1-64).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Let the kernel cache writes and send them later (FUSE_WRITEBACK_CACHE).
    #[arg(long)]
    writeback_cache: bool,
    /// mirror: hand open files to the kernel (FUSE passthrough, Linux 6.9+):
    /// reads and writes then go to the host file without this server.
    #[arg(long)]
    passthrough: bool,
    /// mirror: do not let the kernel keep directory listings (by default it
    /// keeps them and checks the directory's mtime when a listing starts,
    /// once the attributes are older than --ttl-ms).
    #[arg(long)]
    no_dir_cache: bool,
    #[command(flatten)]
    budget: budget::BudgetArgs,
    #[command(flatten)]
    transport: devfuse::TransportArgs,
}

pub fn run(a: FsArgs) -> Result<ExitCode> {
    match a.cmd {
        Sub::Mount(m) => mount(m),
        Sub::ServeVirtiofs(v) => virtio::run(*v),
        Sub::DriveVirtiofs(d) => drive::run(d),
    }
}

/// The mount's counters in /metrics, labelled with the mount point.
pub(super) struct FsMetrics {
    pub(super) stats: Arc<OpStats>,
    pub(super) labels: String,
}

impl MetricSource for FsMetrics {
    fn render(&self, out: &mut String) {
        self.stats.render(&self.labels, out)
    }
    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        OpStats::HEADERS
    }
}

fn mount(a: MountArgs) -> Result<ExitCode> {
    if a.transport.is_own() {
        return devfuse::mount(a);
    }
    if !(1..=64).contains(&a.threads) {
        bail!("--threads {}: must be 1 to 64", a.threads);
    }
    if a.passthrough && !a.backend.starts_with("mirror:") {
        bail!("--passthrough needs the mirror backend (host files to hand to the kernel)");
    }
    if a.passthrough && a.writeback_cache {
        bail!("--passthrough and --writeback-cache do not go together: the kernel refuses passthrough opens while its writeback cache is on");
    }
    let ttl = a.budget.ttl();
    let opts = iolift_fs::BackendOptions {
        mirror: a.budget.mirror(a.passthrough, a.writeback_cache)?,
    };
    let fs = iolift_fs::open_backend(&a.backend, &opts).map_err(anyhow::Error::msg)?;
    let kopts = KernelOptions {
        threads: a.threads,
        writeback_cache: a.writeback_cache,
        passthrough: a.passthrough,
        readdirplus: !a.budget.no_readdirplus,
        ttl,
        dir_cache: !a.no_dir_cache,
        ..KernelOptions::default()
    };
    let metrics = a.budget.metrics.clone();
    run_with_metrics(metrics, move |metrics_addr| async move {
        let m = kernel::mount(fs.clone(), &a.mountpoint, &kopts)
            .with_context(|| format!("mounting {} on {}", a.backend, a.mountpoint.display()))?;
        let source: Arc<dyn MetricSource> = Arc::new(FsMetrics {
            stats: m.stats.clone(),
            labels: mount_label(&m.dir().display().to_string()),
        });
        metrics::register(source.clone());
        println!(
            "iolift fs: serving {} on {} ({} threads{}{})",
            fs.name(),
            m.dir().display(),
            a.threads,
            if a.writeback_cache {
                ", writeback cache"
            } else {
                ""
            },
            if a.passthrough { ", passthrough" } else { "" }
        );
        if let Some(addr) = metrics_addr {
            println!("metrics: curl http://{addr}/metrics");
        }
        serve_until_stopped(m).await?;
        drop(source);
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs `serve` on a current-thread runtime, with the metrics endpoint
/// started first when `--metrics ADDR` asked for one (its address is
/// handed to `serve`).
fn run_with_metrics<F, Fut>(metrics: Option<String>, serve: F) -> Result<ExitCode>
where
    F: FnOnce(Option<std::net::SocketAddr>) -> Fut,
    Fut: std::future::Future<Output = Result<ExitCode>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let addr = match &metrics {
            Some(addr) => Some(metrics::spawn(addr).await?),
            None => None,
        };
        serve(addr).await
    })
}

/// The label every metric of one mount or socket carries, `mount="NAME"`,
/// with the characters a Prometheus label value cannot hold as they are
/// replaced by `_`.
fn mount_label(name: &str) -> String {
    format!("mount=\"{}\"", name.replace(['"', '\\', '\n'], "_"))
}

/// A kernel FUSE mount as the `fs mount` loop needs it, whichever
/// front-end serves it.
trait Served: Send + 'static {
    fn dir(&self) -> &std::path::Path;
    fn is_finished(&self) -> bool;
    fn unmount(self, lazy: bool) -> std::io::Result<()>;
}

impl Served for kernel::Mounted {
    fn dir(&self) -> &std::path::Path {
        kernel::Mounted::dir(self)
    }
    fn is_finished(&self) -> bool {
        kernel::Mounted::is_finished(self)
    }
    fn unmount(self, lazy: bool) -> std::io::Result<()> {
        kernel::Mounted::unmount(self, lazy)
    }
}

impl Served for iolift_fs::devfuse::Mounted {
    fn dir(&self) -> &std::path::Path {
        iolift_fs::devfuse::Mounted::dir(self)
    }
    fn is_finished(&self) -> bool {
        iolift_fs::devfuse::Mounted::is_finished(self)
    }
    fn unmount(self, lazy: bool) -> std::io::Result<()> {
        iolift_fs::devfuse::Mounted::unmount(self, lazy)
    }
}

/// Serves `m` until SIGINT/SIGTERM or an unmount from outside (checked
/// every 200 ms), then unmounts it.
async fn serve_until_stopped(m: impl Served) -> Result<()> {
    let stop = async {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if m.is_finished() {
                return "unmounted from outside";
            }
        }
    };
    let why = tokio::select! {
        s = wait_for_signal(StopOn::IntTerm) => s,
        s = stop => s,
    };
    tracing::info!("{why}: unmounting {}", m.dir().display());
    let dir = m.dir().to_path_buf();
    tokio::task::spawn_blocking(move || m.unmount(false))
        .await
        .context("unmount task")?
        .with_context(|| format!("unmounting {}", dir.display()))
}
