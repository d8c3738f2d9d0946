//! Front-ends: what receives requests from outside and hands them to the
//! exports' devices (NBD listeners, FUSE block files, the metrics endpoint).
//!
//! Each front-end is one file here with a [`Start`] function, registered
//! in [`SERVE`]: `iolift serve` starts them in that order on the same
//! exports, lets them all take requests ([`Frontend::begin`]), prints their
//! [`Frontend::hints`], waits for a signal and stops them in the same order
//! before it flushes the exports ([`Running`]). A start function looks at
//! the [`Settings`] and returns `None` when it has nothing to do (e.g. no
//! `--fuse`).
//!
//! Cleanup is by ownership: a front-end releases what it holds (socket
//! files, mounts) when it is dropped, so an error half-way through
//! starting undoes the front-ends already started; [`Frontend::stop`] is the
//! orderly way, which also waits for requests in flight.

pub mod fuse;
pub mod metrics;
pub mod nbd;
pub mod ublk;

use crate::config::Settings;
use crate::export::Export;
use anyhow::{Context, Result};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// A boxed, sendable future (front-ends are chosen at run time).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A started front-end.
pub trait Frontend: Send {
    /// What it is, for logs: "nbd", "fuse", "metrics".
    fn kind(&self) -> &'static str;
    /// How a user reaches it, one command or address per line (printed
    /// under "connect with:").
    fn hints(&self) -> Vec<String>;
    /// Called once every front-end has started: begin taking requests if
    /// that was held back until then (NBD accepts its first connection
    /// here, so a client that connects sees every other front-end ready).
    fn begin(&mut self) {}
    /// Stops taking new requests and waits until those in flight have
    /// completed, then releases what it holds.
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// Starts a front-end for `iolift serve`, if the settings ask for it.
/// Runs on the server's runtime.
pub type Start =
    for<'a> fn(&'a Settings, &'a [Arc<Export>]) -> BoxFuture<'a, Result<Option<Box<dyn Frontend>>>>;

/// The front-ends of `iolift serve`, in the order they start and stop.
pub const SERVE: &[Start] = &[nbd::start, metrics::start, fuse::start, ublk::start];

/// Started front-ends plus the pidfile that says they run. Dropping it
/// releases everything (sockets, mounts, pidfile) without waiting;
/// [`Running::close`] stops in order and flushes the exports.
pub struct Running {
    fronts: Vec<Box<dyn Frontend>>,
    pidfile: Option<RemoveOnDrop>,
}

impl Running {
    /// Wraps front-ends started by hand (`attach`).
    pub fn new(fronts: Vec<Box<dyn Frontend>>) -> Running {
        Running {
            fronts,
            pidfile: None,
        }
    }

    /// Starts every front-end of [`SERVE`] that the settings ask for.
    pub async fn start(s: &Settings, exports: &[Arc<Export>]) -> Result<Running> {
        let mut r = Running::new(Vec::new());
        for start in SERVE {
            if let Some(f) = start(s, exports).await? {
                tracing::debug!("front-end {} started", f.kind());
                r.fronts.push(f);
            }
        }
        Ok(r)
    }

    /// Writes this process's pid to `path`; the file is removed when
    /// `self` is dropped or closed.
    pub fn write_pidfile(&mut self, path: &Path) -> Result<()> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write pidfile {}", path.display()))?;
        self.pidfile = Some(RemoveOnDrop(path.to_path_buf()));
        Ok(())
    }

    /// Lets every front-end take requests ([`Frontend::begin`]).
    pub fn begin(&mut self) {
        for f in &mut self.fronts {
            f.begin();
        }
    }

    /// Every front-end's hint lines, in start order.
    pub fn hints(&self) -> Vec<String> {
        self.fronts.iter().flat_map(|f| f.hints()).collect()
    }

    /// Stops the front-ends in start order, then flushes (`close()`) every
    /// export, each within `flush_timeout`, then removes the pidfile.
    /// Exit code 1 if a flush failed or timed out.
    pub async fn close(mut self, exports: &[Arc<Export>], flush_timeout: Duration) -> ExitCode {
        for f in std::mem::take(&mut self.fronts) {
            let kind = f.kind();
            f.stop().await;
            tracing::debug!("front-end {kind} stopped");
        }
        let mut code = ExitCode::SUCCESS;
        for e in exports {
            match tokio::time::timeout(flush_timeout, e.dev.close()).await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => {
                    tracing::error!("{}: flush at close failed: {err}", e.label());
                    code = ExitCode::from(1);
                }
                Err(_) => {
                    tracing::error!("{}: flush at close timed out", e.label());
                    code = ExitCode::from(1);
                }
            }
        }
        code
    }
}

/// A multi-threaded tokio runtime with `threads` workers (at least 1).
pub fn runtime(threads: usize, name: &str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.clamp(1, 256))
        .thread_name(name)
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// Which signals end the wait of [`wait_for_signal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOn {
    /// SIGINT and SIGTERM.
    IntTerm,
    /// SIGINT, SIGTERM and SIGHUP.
    IntTermHup,
}

/// Waits for one of the signals and returns its name. If the handlers
/// cannot be installed, logs it and never returns.
pub async fn wait_for_signal(on: StopOn) -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let hup = match on {
        StopOn::IntTerm => None,
        StopOn::IntTermHup => Some(signal(SignalKind::hangup())),
    };
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        hup.transpose(),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    let hangup = async {
        match hup.as_mut() {
            Some(h) => h.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hangup => "SIGHUP",
    }
}

/// Removes a file when dropped (pidfiles, socket files).
#[derive(Debug)]
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The lines printed when `serve` is ready: the exports, then how to
/// connect.
pub fn print_ready(exports: &[Arc<Export>], running: &Running) {
    eprintln!("iolift: serving {} export(s):", exports.len());
    for e in exports {
        let size = crate::util::format_size(e.dev.info().size);
        eprintln!(
            "  {:?}: {} ({size}{})",
            e.name,
            e.dev.name(),
            if e.read_only { ", read-only" } else { "" }
        );
    }
    eprintln!("connect with:");
    for h in running.hints() {
        eprintln!("  {h}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Records the order of stops in a shared counter.
    struct Probe {
        order: Arc<AtomicUsize>,
        stopped_as: Arc<AtomicUsize>,
    }

    impl Frontend for Probe {
        fn kind(&self) -> &'static str {
            "probe"
        }
        fn hints(&self) -> Vec<String> {
            vec!["probe hint".into()]
        }
        fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                let n = self.order.fetch_add(1, Ordering::SeqCst);
                self.stopped_as.store(n + 1, Ordering::SeqCst);
            })
        }
    }

    #[test]
    fn close_stops_in_order_flushes_and_removes_the_pidfile() {
        let rt = runtime(1, "t").unwrap();
        let order = Arc::new(AtomicUsize::new(0));
        let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let probe = |s: &Arc<AtomicUsize>| -> Box<dyn Frontend> {
            Box::new(Probe {
                order: order.clone(),
                stopped_as: s.clone(),
            })
        };
        let mut r = Running::new(vec![probe(&a), probe(&b)]);
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("x.pid");
        r.write_pidfile(&pid).unwrap();
        assert_eq!(
            std::fs::read_to_string(&pid).unwrap().trim(),
            std::process::id().to_string()
        );
        assert_eq!(r.hints(), ["probe hint", "probe hint"]);
        let ex = crate::export::build_exports(&[crate::export::ExportPlan {
            name: "m".into(),
            backend: "memory:1M".into(),
            stages: vec![],
            read_only: false,
            description: None,
        }])
        .unwrap();
        let code = rt.block_on(r.close(&ex, Duration::from_secs(5)));
        assert_eq!(code, ExitCode::SUCCESS);
        assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (1, 2));
        assert!(!pid.exists(), "pidfile left after close");
    }

    #[test]
    fn dropping_running_removes_the_pidfile() {
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("y.pid");
        let mut r = Running::new(Vec::new());
        r.write_pidfile(&pid).unwrap();
        assert!(pid.exists());
        drop(r);
        assert!(!pid.exists());
        let mut r = Running::new(Vec::new());
        let e = r.write_pidfile(&dir.path().join("no/such/dir.pid"));
        assert!(format!("{:#}", e.unwrap_err()).contains("pidfile"));
    }
}
