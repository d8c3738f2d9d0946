//! `iolift fs mount --transport devfuse|uring`: the mount served by
//! iolift-fs's devfuse front-end (the virtio-fs FUSE session on /dev/fuse,
//! read/write or FUSE over io_uring) instead of the fuser one. See
//! docs/fs.md.

use super::{mount_label, run_with_metrics, serve_until_stopped, FsMetrics, MountArgs};
use crate::metrics::{self, MetricSource};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use iolift_fs::devfuse::{self, DevFuseOptions, Shared, Transport};
use iolift_fs::virtio::SessionOptions;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum TransportName {
    /// read/write on cloned /dev/fuse fds through the fuser crate.
    #[default]
    Fuser,
    /// read/write on cloned /dev/fuse fds, decoded by the shared FUSE session.
    Devfuse,
    /// FUSE over io_uring (Linux 6.14+ with fuse's enable_uring = Y), one
    /// ring per CPU; served as devfuse when the kernel does not offer it.
    Uring,
}

#[derive(Args, Debug)]
pub(super) struct TransportArgs {
    /// How requests travel between the kernel and this server.
    #[arg(long, value_enum, default_value_t)]
    pub transport: TransportName,
    /// uring: ring entries per queue (one queue per CPU, 1-1024). Each
    /// entry holds a payload buffer of 1 MiB + 4 KiB, touched as used.
    #[arg(long, default_value_t = 8)]
    pub ring_depth: usize,
    /// uring: spin this many microseconds on the ring for the next request
    /// before sleeping (0: sleep at once; at most 10000). Spinning burns
    /// CPU while the mount is idle.
    #[arg(long, default_value_t = 0)]
    pub ring_spin_us: u64,
}

impl TransportArgs {
    /// Whether this file's front-end serves the mount.
    pub(super) fn is_own(&self) -> bool {
        self.transport != TransportName::Fuser
    }
}

/// Requests by the way they arrived, in /metrics.
struct TransportMetrics {
    shared: Arc<Shared>,
    labels: String,
}

impl MetricSource for TransportMetrics {
    fn render(&self, out: &mut String) {
        let s = &self.shared;
        for (path, n) in [
            ("ring", s.ring_requests.load(Ordering::Relaxed)),
            ("dev", s.dev_requests.load(Ordering::Relaxed)),
        ] {
            out.push_str(&format!(
                "iolift_fs_transport_requests_total{{{},path=\"{path}\"}} {n}\n",
                self.labels
            ));
        }
    }
    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[(
            "iolift_fs_transport_requests_total",
            "counter",
            "FUSE requests received, by path: ring (FUSE over io_uring) or dev (read from /dev/fuse)",
        )]
    }
}

pub(super) fn mount(a: MountArgs) -> Result<ExitCode> {
    let t = &a.transport;
    if a.passthrough {
        bail!("--passthrough needs --transport fuser (the devfuse front-end does not register backing files)");
    }
    if !(1..=devfuse::MAX_RING_DEPTH).contains(&t.ring_depth) {
        bail!(
            "--ring-depth {}: must be 1 to {}",
            t.ring_depth,
            devfuse::MAX_RING_DEPTH
        );
    }
    if t.ring_spin_us > 10_000 {
        bail!("--ring-spin-us {}: at most 10000", t.ring_spin_us);
    }
    if !(1..=64).contains(&a.threads) {
        bail!("--threads {}: must be 1 to 64", a.threads);
    }
    let ttl = a.budget.ttl();
    let opts = iolift_fs::BackendOptions {
        mirror: a.budget.mirror(false, a.writeback_cache)?,
    };
    let fs = iolift_fs::open_backend(&a.backend, &opts).map_err(anyhow::Error::msg)?;
    let dopts = DevFuseOptions {
        transport: match t.transport {
            TransportName::Uring => Transport::Uring,
            _ => Transport::ReadWrite,
        },
        threads: a.threads,
        ring_depth: t.ring_depth,
        spin: Duration::from_micros(t.ring_spin_us),
        dir_cache: !a.no_dir_cache,
        session: SessionOptions {
            writeback_cache: a.writeback_cache,
            readdirplus: !a.budget.no_readdirplus,
            ttl,
            ..SessionOptions::default()
        },
        ..DevFuseOptions::default()
    };
    let metrics = a.budget.metrics.clone();
    run_with_metrics(metrics, move |metrics_addr| async move {
        let m = devfuse::mount(fs.clone(), &a.mountpoint, &dopts)
            .with_context(|| format!("mounting {} on {}", a.backend, a.mountpoint.display()))?;
        let labels = mount_label(&m.dir().display().to_string());
        let sources: [Arc<dyn MetricSource>; 2] = [
            Arc::new(FsMetrics {
                stats: m.stats.clone(),
                labels: labels.clone(),
            }),
            Arc::new(TransportMetrics {
                shared: m.shared.clone(),
                labels,
            }),
        ];
        for s in &sources {
            metrics::register(s.clone());
        }
        let on_ring = m.shared.uring.load(Ordering::Relaxed);
        println!(
            "iolift fs: serving {} on {} (transport {}{})",
            fs.name(),
            m.dir().display(),
            if on_ring { "uring" } else { "devfuse" },
            if a.writeback_cache {
                ", writeback cache"
            } else {
                ""
            },
        );
        if let Some(addr) = metrics_addr {
            println!("metrics: curl http://{addr}/metrics");
        }
        serve_until_stopped(m).await?;
        drop(sources);
        Ok(ExitCode::SUCCESS)
    })
}
