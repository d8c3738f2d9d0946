//! `iolift serve`: the NBD server.
//!
//! Order of work in [`run`]: settings (flags merged over `--config`) ->
//! [`build_exports`] (backends opened, stages stacked) -> front-ends
//! (listeners bound, connection hints printed) -> serve until SIGINT or
//! SIGTERM -> drain connections -> `close()` (flush) every export.
//! Front-ends other than NBD (FUSE, metrics) hook in at the marked place
//! in [`serve_async`], using the same `Vec<Export>`.

use crate::config::{self, Config};
use crate::nbd::{self, Listener, Server, ServerCfg};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

pub use crate::nbd::Export;

/// Default backend of the "" export when nothing else is given.
pub const DEFAULT_BACKEND: &str = "file:iolift-disk.img,size=1G";
pub const DEFAULT_SOCKET: &str = "/tmp/iolift.sock";
/// Poll mode's budget unless told otherwise: covers a local client's turn
/// around at queue depth 1 (tens of microseconds), while the gap and burst
/// rules keep it off for slower backends and deep queues (nbd/poll.rs).
pub const DEFAULT_POLL_US: u64 = 100;
/// Longest coalescing pause unless told otherwise (nbd/coalesce.rs): a few
/// requests' worth of a busy client's time.
pub const DEFAULT_COALESCE_US: u64 = 50;
pub const DEFAULT_TCP: &str = "127.0.0.1:10809";
const DEFAULT_PORT: u16 = 10809;

#[derive(Args, Debug, Default, Clone)]
pub struct ServeArgs {
    /// Backend of the default export (name ""), e.g. memory:1G,
    /// file:PATH,size=1G, null:1G. Default: file:iolift-disk.img,size=1G
    /// (a sparse 1 GiB file in the current directory) unless --export or
    /// a config file names exports.
    pub backend: Option<String>,
    /// Add a named export NAME=BACKEND (repeatable).
    #[arg(short = 'e', long = "export", value_name = "NAME=BACKEND")]
    pub exports: Vec<String>,
    /// The export that answers to the empty name when there is no "" export.
    #[arg(long, value_name = "NAME")]
    pub default_export: Option<String>,
    /// Unix socket path [default: /tmp/iolift.sock].
    #[arg(short, long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Also listen on TCP: HOST:PORT, HOST or :PORT [default when given
    /// without value: 127.0.0.1:10809]. With --tcp and no --socket, TCP only.
    #[arg(short, long, value_name = "ADDR", num_args = 0..=1, default_missing_value = DEFAULT_TCP)]
    pub tcp: Option<String>,
    /// Make every export read-only.
    #[arg(short, long)]
    pub read_only: bool,
    /// Stack a stage on every export (repeatable; first given = top).
    #[arg(long = "stage", value_name = "SPEC")]
    pub stages: Vec<String>,
    /// TOML config file (see docs/nbd.md); flags override its values.
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Largest read/write payload accepted [default: 32M].
    #[arg(long, value_name = "SIZE")]
    pub max_request: Option<String>,
    /// Write the server's pid here once listening; removed at exit.
    #[arg(long, value_name = "PATH")]
    pub pidfile: Option<PathBuf>,
    /// Tokio worker threads [default: 2].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Poll mode: a connection's reader retries its socket for up to N
    /// microseconds before sleeping (max 10000; 0 = off) [default: 100].
    /// Saves a wake-up per request at low queue depth; costs CPU while a
    /// client waits for each reply. Off by itself for deep queues and for
    /// waits longer than half the budget.
    #[arg(long, value_name = "N")]
    pub poll_us: Option<u64>,
    /// Coalescing: while a client has at least 12 of our replies still to
    /// read, the reader waits up to N microseconds before reading its next
    /// requests, so that they come in larger batches (max 1000; 0 = off)
    /// [default: 50]. Self-tuning: it never leaves the client without
    /// replies to read. Saves server and client CPU at deep queue depths.
    #[arg(long, value_name = "N")]
    pub coalesce_us: Option<u64>,
    /// Serve the stats/cache/scheduler stages' counters in Prometheus text
    /// format at http://ADDR/metrics, e.g. 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Also show an export as one regular file on a FUSE mount (its parent
    /// dir, created if missing), for a loop device: `--fuse FILE` (the
    /// default export) or `--fuse NAME=FILE` (repeatable; root). See docs/fuse.md.
    #[arg(long = "fuse", value_name = "[NAME=]FILE")]
    pub fuse: Vec<String>,
    // Further front-end flags (--fuse FILE, --metrics ADDR) go here; they
    // are started in `serve_async` next to the NBD listeners.
}

/// One export to build: name, backend spec, stage specs (first = top).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportPlan {
    pub name: String,
    pub backend: String,
    pub stages: Vec<String>,
    pub read_only: bool,
    pub description: Option<String>,
}

/// Everything `serve` will do, after merging flags over the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub exports: Vec<ExportPlan>,
    pub default_export: Option<String>,
    pub socket: Option<PathBuf>,
    pub tcp: Option<String>,
    pub max_request: u32,
    pub threads: usize,
    /// Poll-mode budget per read, microseconds (0 = off).
    pub poll_us: u64,
    /// Longest coalescing pause, microseconds (0 = off).
    pub coalesce_us: u64,
    pub pidfile: Option<PathBuf>,
    /// `--fuse [NAME=]FILE` specs.
    pub fuse: Vec<String>,
    pub metrics: Option<String>,
}

/// Parses `HOST:PORT`, `HOST` or `:PORT` (IPv6 as `[::1]:PORT`).
pub fn parse_tcp_addr(s: &str) -> Result<(String, u16)> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(("127.0.0.1".into(), DEFAULT_PORT));
    }
    let port = |p: &str| -> Result<u16> {
        p.parse::<u16>()
            .with_context(|| format!("bad TCP address {s:?}: port {p:?} is not a number 0-65535"))
    };
    if let Some(rest) = s.strip_prefix('[') {
        let Some((host, tail)) = rest.split_once(']') else {
            bail!("bad TCP address {s:?}: missing ']'");
        };
        let p = match tail.strip_prefix(':') {
            Some(p) => port(p)?,
            None if tail.is_empty() => DEFAULT_PORT,
            None => bail!("bad TCP address {s:?}"),
        };
        return Ok((host.to_string(), p));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => {
            let h = if h.is_empty() { "127.0.0.1" } else { h };
            Ok((h.to_string(), port(p)?))
        }
        Some(_) => Ok((s.to_string(), DEFAULT_PORT)), // bare IPv6
        None => Ok((s.to_string(), DEFAULT_PORT)),
    }
}

/// Merges flags over the config file (if any) into [`Settings`].
pub fn settings(a: &ServeArgs) -> Result<Settings> {
    let cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    settings_from(a, &cfg)
}

/// [`settings`] with the config already loaded.
pub fn settings_from(a: &ServeArgs, cfg: &Config) -> Result<Settings> {
    let read_only = a.read_only || cfg.read_only;
    let mut global_stages = a.stages.clone();
    global_stages.extend(cfg.stages.iter().cloned());
    let mut exports: Vec<ExportPlan> = Vec::new();
    fn add(exports: &mut Vec<ExportPlan>, p: ExportPlan) -> Result<()> {
        if exports.iter().any(|e| e.name == p.name) {
            bail!("export {:?} given twice", p.name);
        }
        exports.push(p);
        Ok(())
    }
    if let Some(b) = &a.backend {
        crate::backend::BackendSpec::parse(b).context("BACKEND")?;
        add(
            &mut exports,
            ExportPlan {
                name: String::new(),
                backend: b.clone(),
                stages: global_stages.clone(),
                read_only,
                description: None,
            },
        )?;
    }
    for e in &a.exports {
        let Some((name, backend)) = e.split_once('=') else {
            bail!("--export {e:?}: expected NAME=BACKEND, e.g. disk=memory:1G");
        };
        crate::nbd::wire::check_string(name.as_bytes())
            .map_err(|m| anyhow::anyhow!("--export {e:?}: name: {m}"))?;
        crate::backend::BackendSpec::parse(backend).with_context(|| format!("--export {e:?}"))?;
        add(
            &mut exports,
            ExportPlan {
                name: name.to_string(),
                backend: backend.to_string(),
                stages: global_stages.clone(),
                read_only,
                description: None,
            },
        )?;
    }
    for e in &cfg.exports {
        let mut stages = global_stages.clone();
        stages.extend(e.stages.iter().cloned());
        add(
            &mut exports,
            ExportPlan {
                name: e.name.clone(),
                backend: e.backend.clone(),
                stages,
                read_only: read_only || e.read_only,
                description: e.description.clone(),
            },
        )?;
    }
    if exports.is_empty() {
        add(
            &mut exports,
            ExportPlan {
                name: String::new(),
                backend: DEFAULT_BACKEND.into(),
                stages: global_stages.clone(),
                read_only,
                description: None,
            },
        )?;
    }
    let default_export = a.default_export.clone().or(cfg.default_export.clone());
    if let Some(d) = &default_export {
        if !exports.iter().any(|e| &e.name == d) {
            bail!("--default-export {d:?}: no such export");
        }
    }
    let max_request = match (&a.max_request, &cfg.max_request) {
        (Some(s), _) => {
            config::validate_max_request(crate::util::parse_size(s).context("--max-request")?)
                .context("--max-request")?
        }
        (None, Some(v)) => {
            config::validate_max_request(v.bytes("max_request")?).context("max_request")?
        }
        (None, None) => 32 << 20,
    };
    let threads = a.threads.or(cfg.threads).unwrap_or(2);
    if threads == 0 {
        bail!("--threads: must be at least 1");
    }
    let poll_us = match (a.poll_us, cfg.poll_us) {
        (Some(n), _) => config::validate_poll_us(n).context("--poll-us")?,
        (None, Some(n)) => config::validate_poll_us(n).context("poll_us")?,
        (None, None) => DEFAULT_POLL_US,
    };
    let coalesce_us = match (a.coalesce_us, cfg.coalesce_us) {
        (Some(n), _) => config::validate_coalesce_us(n).context("--coalesce-us")?,
        (None, Some(n)) => config::validate_coalesce_us(n).context("coalesce_us")?,
        (None, None) => DEFAULT_COALESCE_US,
    };
    let tcp = a.tcp.clone().or(cfg.tcp.clone());
    if let Some(t) = &tcp {
        parse_tcp_addr(t).context("--tcp")?;
    }
    let socket = a.socket.clone().or(cfg.socket.clone());
    let socket = match (socket, &tcp) {
        (Some(s), _) => Some(s),
        (None, Some(_)) => None,
        (None, None) => Some(PathBuf::from(DEFAULT_SOCKET)),
    };
    Ok(Settings {
        exports,
        default_export,
        socket,
        tcp,
        max_request,
        threads,
        poll_us,
        coalesce_us,
        pidfile: a.pidfile.clone(),
        fuse: a.fuse.clone(),
        metrics: a.metrics.clone(),
    })
}

/// Opens every export's backend and stacks its stages.
pub fn build_exports(s: &Settings) -> Result<Vec<Export>> {
    let mut out = Vec::with_capacity(s.exports.len());
    for p in &s.exports {
        let what = if p.name.is_empty() {
            "default export".to_string()
        } else {
            format!("export {:?}", p.name)
        };
        let backend = crate::backend::open(&p.backend).with_context(|| what.clone())?;
        let dev = crate::stage::build_stack(&p.stages, backend).with_context(|| what.clone())?;
        let read_only = p.read_only || dev.info().read_only;
        let description = p.description.clone().unwrap_or_else(|| dev.name());
        out.push(Export {
            name: p.name.clone(),
            dev,
            read_only,
            description,
        });
    }
    Ok(out)
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    let s = settings(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(s.threads)
        .thread_name("iolift")
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve_async(s))
}

/// Systemd socket activation: listeners inherited on fd 3.. when
/// LISTEN_PID is us.
fn inherited_listeners() -> Result<Vec<Listener>> {
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let n: i32 = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if !pid_ok || n <= 0 {
        return Ok(Vec::new());
    }
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    let mut out = Vec::new();
    for fd in 3..3 + n {
        use std::os::fd::FromRawFd;
        // SAFETY: systemd passes these fds to us for our exclusive use.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: ss/len are valid out-pointers of the right size.
        let r =
            unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
        if r != 0 {
            bail!("LISTEN_FDS: fd {fd} is not a socket");
        }
        let l = if ss.ss_family as i32 == libc::AF_UNIX {
            // SAFETY: fd is an inherited listening unix socket we now own.
            let std_l = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
            std_l.set_nonblocking(true)?;
            Listener::Unix(tokio::net::UnixListener::from_std(std_l)?, None)
        } else {
            // SAFETY: fd is an inherited listening TCP socket we now own.
            let std_l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
            std_l.set_nonblocking(true)?;
            Listener::Tcp(tokio::net::TcpListener::from_std(std_l)?)
        };
        out.push(l);
    }
    Ok(out)
}

/// Binds a unix socket, removing a stale socket file first (but never a
/// live server's socket or a non-socket file).
fn bind_unix(path: &Path) -> Result<Listener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            bail!("--socket {}: exists and is not a socket", path.display());
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "--socket {}: another server is listening there",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let l = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("--socket {}: cannot listen", path.display()))?;
    Ok(Listener::Unix(l, Some(path.to_path_buf())))
}

async fn bind_tcp(addr: &str) -> Result<Listener> {
    let (host, port) = parse_tcp_addr(addr)?;
    let l = tokio::net::TcpListener::bind((host.as_str(), port))
        .await
        .with_context(|| format!("--tcp {addr}: cannot listen"))?;
    Ok(Listener::Tcp(l))
}

fn print_hints(listeners: &[Listener], exports: &[Export]) {
    let names: Vec<&str> = exports.iter().map(|e| e.name.as_str()).collect();
    let name = names.first().copied().unwrap_or("");
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
    for l in listeners {
        match l {
            Listener::Unix(_, Some(p)) => {
                let p = p.display();
                eprintln!("  nbdinfo 'nbd+unix:///{name}?socket={p}'");
                eprintln!("  qemu-img info 'nbd+unix:///{name}?socket={p}'");
                eprintln!("  nbd-client -unix {p} -N '{name}' /dev/nbd0");
            }
            Listener::Tcp(t) => {
                if let Ok(a) = t.local_addr() {
                    eprintln!("  nbdinfo nbd://{a}/{name}");
                    eprintln!("  qemu-img info nbd://{a}/{name}");
                    eprintln!("  nbd-client {} {} -N '{name}' /dev/nbd0", a.ip(), a.port());
                }
            }
            Listener::Unix(_, None) => eprintln!("  (inherited socket) {}", l.describe()),
        }
    }
}

async fn serve_async(s: Settings) -> Result<ExitCode> {
    let exports = build_exports(&s)?;
    let mut listeners = inherited_listeners()?;
    if listeners.is_empty() {
        if let Some(p) = &s.socket {
            listeners.push(bind_unix(p)?);
        }
        if let Some(t) = &s.tcp {
            match bind_tcp(t).await {
                Ok(l) => listeners.push(l),
                Err(e) => {
                    remove_sockets(&listeners);
                    return Err(e);
                }
            }
        }
    }
    if let Some(m) = &s.metrics {
        match crate::stage::metrics::spawn(m).await {
            Ok(addr) => tracing::info!("metrics: http://{addr}/metrics"),
            Err(e) => {
                remove_sockets(&listeners);
                return Err(e);
            }
        }
    }
    if let Some(p) = &s.pidfile {
        if let Err(e) = std::fs::write(p, format!("{}\n", std::process::id())) {
            remove_sockets(&listeners);
            return Err(e).with_context(|| format!("--pidfile {}", p.display()));
        }
    }
    print_hints(&listeners, &exports);
    let devs: Vec<(String, crate::block::DevRef)> = exports
        .iter()
        .map(|e| (e.name.clone(), e.dev.clone()))
        .collect();
    // Other front-ends (--fuse, --metrics) start here on `exports`.
    let fuse_exports: Vec<_> = exports
        .iter()
        .map(|e| (e.name.clone(), e.dev.clone(), e.read_only))
        .collect();
    let fuse_mounts = match crate::fuse::mount_exports(
        &s.fuse,
        &fuse_exports,
        s.default_export.as_deref(),
        tokio::runtime::Handle::current(),
    ) {
        Ok(m) => m,
        Err(e) => {
            remove_sockets(&listeners);
            if let Some(p) = &s.pidfile {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
    };
    let server = Arc::new(Server::new(
        exports,
        s.default_export.clone(),
        ServerCfg {
            max_request: s.max_request,
            poll: Duration::from_micros(s.poll_us),
            poll_spinners: s.threads.saturating_sub(1).max(1),
            coalesce: Duration::from_micros(s.coalesce_us),
            ..ServerCfg::default()
        },
    ));
    let (sd_tx, sd_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received: stopping (in-flight requests finish first)");
        let _ = sd_tx.send(true);
    });
    nbd::run(server, listeners, sd_rx, Duration::from_secs(10)).await;
    // Unmount FUSE files (no new requests), then flush every export.
    tokio::task::block_in_place(|| drop(fuse_mounts));
    let mut code = ExitCode::SUCCESS;
    for (name, dev) in devs {
        match tokio::time::timeout(Duration::from_secs(30), dev.close()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!("export {name:?}: flush at close failed: {e}");
                code = ExitCode::from(1);
            }
            Err(_) => {
                tracing::error!("export {name:?}: flush at close timed out");
                code = ExitCode::from(1);
            }
        }
    }
    if let Some(p) = &s.pidfile {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!("stopped");
    Ok(code)
}

fn remove_sockets(ls: &[Listener]) {
    for l in ls {
        if let Listener::Unix(_, Some(p)) = l {
            let _ = std::fs::remove_file(p);
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_addresses() {
        assert_eq!(parse_tcp_addr(":1234").unwrap(), ("127.0.0.1".into(), 1234));
        assert_eq!(
            parse_tcp_addr("0.0.0.0").unwrap(),
            ("0.0.0.0".into(), 10809)
        );
        assert_eq!(parse_tcp_addr("h:5").unwrap(), ("h".into(), 5));
        assert_eq!(parse_tcp_addr("[::1]:7").unwrap(), ("::1".into(), 7));
        assert!(parse_tcp_addr("h:99999").is_err());
        assert!(parse_tcp_addr("h:x").is_err());
    }

    #[test]
    fn settings_merge() {
        let a = ServeArgs::default();
        let s = settings_from(&a, &Config::default()).unwrap();
        assert_eq!(s.exports.len(), 1);
        assert_eq!(s.exports[0].backend, DEFAULT_BACKEND);
        assert_eq!(s.socket, Some(PathBuf::from(DEFAULT_SOCKET)));
        assert_eq!(s.max_request, 32 << 20);
        assert_eq!(s.poll_us, DEFAULT_POLL_US);
        assert_eq!(s.coalesce_us, DEFAULT_COALESCE_US);
        assert_eq!(s.threads, 2);
        let cfg = Config {
            poll_us: Some(0),
            ..Default::default()
        };
        assert_eq!(
            settings_from(&a, &cfg).unwrap().poll_us,
            0,
            "poll_us = 0 turns it off"
        );
        let a0 = ServeArgs {
            poll_us: Some(7),
            ..Default::default()
        };
        assert_eq!(
            settings_from(&a0, &cfg).unwrap().poll_us,
            7,
            "the flag beats the file"
        );
        let cfg = Config {
            coalesce_us: Some(0),
            ..Default::default()
        };
        assert_eq!(
            settings_from(&ServeArgs::default(), &cfg)
                .unwrap()
                .coalesce_us,
            0
        );
        let a0 = ServeArgs {
            coalesce_us: Some(20),
            ..Default::default()
        };
        assert_eq!(settings_from(&a0, &cfg).unwrap().coalesce_us, 20);
        let bad = ServeArgs {
            coalesce_us: Some(5000),
            ..Default::default()
        };
        assert!(
            format!("{:#}", settings_from(&bad, &Config::default()).unwrap_err())
                .contains("--coalesce-us")
        );

        let a = ServeArgs {
            exports: vec!["a=memory:1M".into(), "b=null:1M".into()],
            default_export: Some("b".into()),
            tcp: Some(":0".into()),
            read_only: true,
            ..Default::default()
        };
        let s = settings_from(&a, &Config::default()).unwrap();
        assert_eq!(s.exports.len(), 2);
        assert!(s.exports.iter().all(|e| e.read_only));
        assert_eq!(s.socket, None, "--tcp alone means TCP only");

        let bad = ServeArgs {
            exports: vec!["nobackend".into()],
            ..Default::default()
        };
        assert!(
            format!("{:#}", settings_from(&bad, &Config::default()).unwrap_err())
                .contains("--export")
        );
        let bad = ServeArgs {
            max_request: Some("12Q".into()),
            ..Default::default()
        };
        assert!(
            format!("{:#}", settings_from(&bad, &Config::default()).unwrap_err())
                .contains("--max-request")
        );
        let bad = ServeArgs {
            exports: vec!["a=memory:1M".into()],
            default_export: Some("zz".into()),
            ..Default::default()
        };
        assert!(
            format!("{:#}", settings_from(&bad, &Config::default()).unwrap_err())
                .contains("--default-export")
        );
    }
}
