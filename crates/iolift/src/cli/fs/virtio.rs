//! `iolift fs serve-virtiofs BACKEND --socket-path PATH`: serves a
//! file-system backend to a virtual machine over vhost-user (QEMU's
//! `vhost-user-fs-pci`), one connection, until the guest disconnects or
//! SIGINT/SIGTERM. Flag names follow QEMU's virtiofsd where they mean the
//! same thing. See docs/fs.md.

use super::{run_with_metrics, FsMetrics};
use crate::frontend::{wait_for_signal, StopOn};
use crate::metrics::{self, MetricSource};
use anyhow::{bail, Context, Result};
use clap::Args;
use iolift_fs::virtio::{Server, SessionOptions, VirtioOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct VirtioArgs {
    /// null | null:SIZE | mirror:DIR | nfs://HOST/EXPORT | kv:rados:POOL
    /// (or give --shared-dir DIR instead).
    backend: Option<String>,
    /// The directory to share: the same as the backend mirror:DIR.
    #[arg(long, value_name = "DIR")]
    shared_dir: Option<PathBuf>,
    /// The vhost-user socket to listen on (QEMU: -chardev socket,path=PATH).
    #[arg(long, alias = "socket", value_name = "PATH")]
    socket_path: PathBuf,
    /// The tag reported in the device's config space, for front-ends that
    /// read it from the device (QEMU's vhost-user-fs-pci takes tag= itself).
    #[arg(long)]
    tag: Option<String>,
    /// Request queues offered (QEMU: vhost-user-fs-pci,num-request-queues=N).
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Largest virtqueue (entries) the guest may set up; a power of two.
    #[arg(long, default_value_t = 1024)]
    queue_size: u16,
    /// Worker threads serving requests (0: each request on its queue's thread).
    #[arg(long, default_value_t = 0)]
    thread_pool_size: usize,
    /// Let the guest cache writes and send them later (FUSE_WRITEBACK_CACHE).
    #[arg(long)]
    writeback: bool,
    #[command(flatten)]
    budget: super::budget::BudgetArgs,
}

pub fn run(a: VirtioArgs) -> Result<ExitCode> {
    let backend = match (&a.backend, &a.shared_dir) {
        (Some(b), None) => b.clone(),
        (None, Some(d)) => format!("mirror:{}", d.display()),
        (Some(_), Some(_)) => bail!("give either BACKEND or --shared-dir, not both"),
        (None, None) => bail!("no backend: give BACKEND (null, mirror:DIR, nfs://HOST/EXPORT, kv:rados:POOL) or --shared-dir DIR"),
    };
    if !(1..=64).contains(&a.queues) {
        bail!("--queues {}: must be 1 to 64", a.queues);
    }
    if a.thread_pool_size > 1024 {
        bail!("--thread-pool-size {}: at most 1024", a.thread_pool_size);
    }
    let ttl = a.budget.ttl();
    let bopts = iolift_fs::BackendOptions {
        mirror: a.budget.mirror(false, a.writeback)?,
    };
    let fs = iolift_fs::open_backend(&backend, &bopts).map_err(anyhow::Error::msg)?;
    let vopts = VirtioOptions {
        queues: a.queues,
        queue_size: a.queue_size,
        thread_pool_size: a.thread_pool_size,
        tag: a.tag.clone(),
        session: SessionOptions {
            writeback_cache: a.writeback,
            readdirplus: !a.budget.no_readdirplus,
            ttl,
            ..SessionOptions::default()
        },
    };
    let server = Server::new(fs.clone(), &a.socket_path, &vopts)
        .with_context(|| format!("--socket-path {}", a.socket_path.display()))?;
    let stats = server.stats.clone();
    let metrics = a.budget.metrics.clone();
    run_with_metrics(metrics, move |metrics_addr| async move {
        let source: Arc<dyn MetricSource> = Arc::new(FsMetrics {
            stats,
            labels: super::mount_label(&format!("virtiofs:{}", a.socket_path.display())),
        });
        metrics::register(source.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let sock = a.socket_path.clone();
        let line = format!(
            "iolift fs: serving {} over vhost-user on {} ({} request queue{}, queue size {}, {} pool threads)",
            fs.name(),
            sock.display(),
            a.queues,
            if a.queues == 1 { "" } else { "s" },
            a.queue_size,
            a.thread_pool_size
        );
        let worker = std::thread::Builder::new()
            .name("vhost-user".into())
            .spawn(move || {
                server.serve(move || {
                    println!("{line}");
                    let _ = tx.send(());
                })
            })
            .context("starting the vhost-user thread")?;
        let _ = rx.await;
        if let Some(addr) = metrics_addr {
            println!("metrics: curl http://{addr}/metrics");
        }
        let done = async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if worker.is_finished() {
                    return;
                }
            }
        };
        tokio::select! {
            s = wait_for_signal(StopOn::IntTerm) => {
                tracing::info!("{s}: closing {}", sock.display());
                let _ = std::fs::remove_file(&sock);
                Ok(ExitCode::SUCCESS)
            }
            () = done => {
                let r = worker.join().map_err(|_| anyhow::anyhow!("the vhost-user thread panicked"))?;
                drop(source);
                r?;
                tracing::info!("the front-end disconnected");
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}
