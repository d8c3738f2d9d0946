//! The NBD front-end (protocol: NetworkBlockDevice/nbd doc/proto.md).
//!
//! The parts:
//! - [`proto`], constants; [`wire`], pure parsers and encoders (fuzzed by
//!   the `nbd::tests::fuzz_*` tests);
//! - [`conn`], one connection's lifecycle: the handshake, then
//!   transmission;
//! - `handshake`, option haggling and export selection;
//! - `reader`, request intake: headers, in-flight cap, payloads,
//!   submission, and the poll-mode and coalescing decisions;
//! - `reply`, encoding and the three reply paths;
//! - [`recv`], the receive buffer; [`poll`], poll mode (`adapt`, its
//!   adaptive controller; `sysload`, what the controller measures;
//!   `poll_stats`, its metrics); [`coalesce`], pauses at deep queue
//!   depths;
//! - this file: exports, listeners, accept loops and shutdown.
//!
//! A request's path: the socket is read in 64 KiB chunks into one
//! `BytesMut` (`recv`); the reader copies out the 28-byte header, judges
//! it (`wire::decode_request`), takes its share of the connection's
//! in-flight cap and, for a write, splits the payload off the buffer
//! without a copy, then submits it to the device. A request complete on
//! the first poll of its future is answered by the reader itself, its
//! reply batched and written before the reader next waits for the socket;
//! one that waits gets a task, whose completion goes to the writer task
//! over a channel; on a device with native callbacks (librbd) the reply is
//! written from the device's completion thread. Headers and large read
//! data go out together in one vectored write. When the reader runs out of
//! input it polls the socket for a while before sleeping if the client
//! sends one request at a time (`poll`), or pauses before reading again if
//! the client keeps many requests coming and has many replies to read
//! (`coalesce`). See `docs/nbd.md`.

mod adapt;
pub mod coalesce;
pub mod conn;
mod handshake;
mod judge;
pub mod poll;
mod poll_stats;
pub mod proto;
mod reader;
pub mod recv;
mod reply;
mod sysload;
pub mod wire;

#[cfg(test)]
mod tests;

use crate::block::DevInfo;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use crate::export::Export;

/// Largest read/write payload accepted unless configured otherwise
/// (`serve --max-request`; the settings take it from here).
pub const DEFAULT_MAX_REQUEST: u32 = 32 << 20;

/// Server-wide cap on bytes of requests in flight unless configured
/// otherwise (`serve --max-inflight`).
pub const DEFAULT_MAX_INFLIGHT: u64 = 256 << 20;

/// Server-wide settings.
#[derive(Debug, Clone)]
pub struct ServerCfg {
    /// Largest read/write payload accepted.
    pub max_request: u32,
    /// Per-connection cap on bytes of requests in flight.
    pub inflight_bytes: u64,
    /// Server-wide cap on bytes of requests in flight, over every
    /// connection (`serve --max-inflight`): readers wait for it in turn.
    pub max_inflight: u64,
    /// A client must finish the handshake within this.
    pub handshake_timeout: Duration,
    /// Poll mode: whether and how long a connection's reader retries its
    /// socket before sleeping. See `poll.rs`.
    pub poll: poll::PollMode,
    /// Poll mode: how many connections may poll at once (see
    /// `poll::SpinGate`); `serve` allows one fewer than its worker threads.
    pub poll_spinners: usize,
    /// Longest coalescing pause at deep queue depths (`nbd::coalesce`);
    /// zero turns it off.
    pub coalesce: Duration,
}

impl Default for ServerCfg {
    fn default() -> Self {
        ServerCfg {
            max_request: DEFAULT_MAX_REQUEST,
            inflight_bytes: 64 << 20,
            max_inflight: DEFAULT_MAX_INFLIGHT,
            handshake_timeout: Duration::from_secs(30),
            poll: poll::PollMode::Off,
            poll_spinners: 1,
            coalesce: Duration::ZERO,
        }
    }
}

/// Exports plus settings, shared by every connection.
pub struct Server {
    pub exports: Vec<Arc<Export>>,
    /// The export that answers to the empty name when none is named "".
    pub default_export: Option<String>,
    pub cfg: ServerCfg,
    /// Poll mode: the connections' shared places to poll in.
    pub spin_gate: Arc<poll::SpinGate>,
    /// Adaptive poll mode: the machine's runnable threads, sampled now and
    /// then for every connection.
    pub load: Arc<sysload::LoadSampler>,
    /// The server-wide in-flight budget (`cfg.max_inflight` bytes, at most
    /// `Semaphore::MAX_PERMITS`); tokio's semaphore serves waiting readers
    /// in the order they asked.
    pub budget: Arc<tokio::sync::Semaphore>,
}

impl Server {
    /// `exports`: owned or already shared (`Arc<Export>`, as the other
    /// front-ends hold them).
    pub fn new<E: Into<Arc<Export>>>(
        exports: impl IntoIterator<Item = E>,
        default_export: Option<String>,
        cfg: ServerCfg,
    ) -> Self {
        Server {
            exports: exports.into_iter().map(Into::into).collect(),
            default_export,
            spin_gate: poll::SpinGate::new(cfg.poll_spinners.max(1)),
            load: Arc::new(sysload::LoadSampler::new()),
            budget: Arc::new(tokio::sync::Semaphore::new(budget_bytes(&cfg))),
            cfg,
        }
    }

    /// Bytes of the server-wide in-flight budget.
    pub fn budget_cap(&self) -> usize {
        budget_bytes(&self.cfg)
    }

    /// The export a client's name selects.
    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        if let Some(e) = self.exports.iter().find(|e| e.name == name) {
            return Some(e.clone());
        }
        if name.is_empty() {
            let d = self.default_export.as_deref()?;
            return self.exports.iter().find(|e| e.name == d).cloned();
        }
        None
    }

    /// (minimum, preferred, maximum) block sizes for NBD_INFO_BLOCK_SIZE.
    pub fn block_sizes(&self, info: &DevInfo) -> (u32, u32, u32) {
        let min = info.min_block.max(1);
        let pref = info.pref_block.max(min);
        let max = self.max_request(info).max(pref);
        (min, pref, max)
    }

    fn max_request(&self, info: &DevInfo) -> u32 {
        let m = if info.max_block == 0 {
            self.cfg.max_request
        } else {
            self.cfg.max_request.min(info.max_block)
        };
        m.max(1)
    }

    pub(crate) fn session(
        &self,
        info: &DevInfo,
        tflags: u16,
        structured: bool,
        meta: &Option<(String, bool)>,
        name: &str,
    ) -> wire::Session {
        // Contexts chosen for another export name do not carry over.
        let base_allocation = structured && matches!(meta, Some((n, true)) if n == name);
        wire::Session {
            size: info.size,
            tflags,
            structured,
            base_allocation,
            max_request: self.max_request(info),
        }
    }
}

/// `cfg.max_inflight` as semaphore permits (at least 1, at most
/// `Semaphore::MAX_PERMITS`).
fn budget_bytes(cfg: &ServerCfg) -> usize {
    cfg.max_inflight
        .clamp(1, tokio::sync::Semaphore::MAX_PERMITS as u64) as usize
}

/// A bound listening socket.
pub enum Listener {
    /// A unix socket; the path is removed when the server stops (unless
    /// it was inherited from systemd, then `None`).
    Unix(UnixListener, Option<PathBuf>),
    Tcp(TcpListener),
}

impl Listener {
    pub fn describe(&self) -> String {
        match self {
            Listener::Unix(l, p) => match p {
                Some(p) => format!("unix:{}", p.display()),
                None => format!("unix:{:?} (inherited)", l.local_addr().ok()),
            },
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp:{a}"),
                Err(_) => "tcp:?".into(),
            },
        }
    }
}

/// Serves every listener until `shutdown` turns true; then stops
/// accepting, lets open connections finish their in-flight requests
/// (waiting at most `grace`), and removes unix socket files.
pub async fn run(
    server: Arc<Server>,
    listeners: Vec<Listener>,
    shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut accepters = JoinSet::new();
    let mut paths = Vec::new();
    for l in listeners {
        if let Listener::Unix(_, Some(p)) = &l {
            paths.push(p.clone());
        }
        accepters.spawn(accept_loop(server.clone(), l, shutdown.clone()));
    }
    let mut sets: Vec<JoinSet<()>> = Vec::new();
    while let Some(r) = accepters.join_next().await {
        if let Ok(mut set) = r {
            while set.try_join_next().is_some() {}
            sets.push(set);
        }
    }
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let open: usize = sets.iter().map(|s| s.len()).sum();
    if open > 0 {
        tracing::info!("waiting for {open} connection(s) to finish");
    }
    let wait = async {
        for s in sets.iter_mut() {
            while s.join_next().await.is_some() {}
        }
    };
    if tokio::time::timeout(grace, wait).await.is_err() {
        let left: usize = sets.iter().map(|s| s.len()).sum();
        tracing::warn!("{left} connection(s) still busy after {grace:?}; closing them");
        for s in sets.iter_mut() {
            s.abort_all();
        }
    }
}

/// How long the accept loop waits after a failed accept (EMFILE, ...).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How often a failing accept is logged at most.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(60);

async fn accept_loop(
    server: Arc<Server>,
    l: Listener,
    mut shutdown: watch::Receiver<bool>,
) -> JoinSet<()> {
    let mut conns = JoinSet::new();
    let mut next_id = 0u64;
    let mut last_warn: Option<std::time::Instant> = None;
    loop {
        // Reap finished connections so the set does not grow forever.
        while conns.try_join_next().is_some() {}
        next_id += 1;
        let sd = shutdown.clone();
        let srv = server.clone();
        tokio::select! {
            _ = stopped(&mut shutdown) => break,
            r = accept_one(&l) => match r {
                Ok(Accepted::Unix(s)) => {
                    let peer = format!("unix#{next_id}");
                    tracing::debug!(%peer, "connection");
                    let (r, w) = s.into_split();
                    conns.spawn(conn::serve(srv, r, w, peer, sd));
                }
                Ok(Accepted::Tcp(s, a)) => {
                    let peer = format!("tcp:{a}#{next_id}");
                    tracing::debug!(%peer, "connection");
                    let _ = s.set_nodelay(true);
                    let (r, w) = s.into_split();
                    conns.spawn(conn::serve(srv, r, w, peer, sd));
                }
                Err(e) => {
                    // Out of descriptors (EMFILE, ENFILE) or memory: the
                    // client waits in the kernel's queue while we retry
                    // every ACCEPT_BACKOFF (never spinning). Logged at most
                    // once a minute: with every descriptor in use, each
                    // retry fails, client or not.
                    if last_warn.is_none_or(|t| t.elapsed() >= ACCEPT_WARN_EVERY) {
                        tracing::warn!(
                            "accept on {} failed: {e}; retrying every {ACCEPT_BACKOFF:?} \
                             (logged at most once a minute)",
                            l.describe()
                        );
                        last_warn = Some(std::time::Instant::now());
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    conns
}

/// Completes once `rx` turns true (never, if its sender is gone without
/// turning it true).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream, std::net::SocketAddr),
}

async fn accept_one(l: &Listener) -> std::io::Result<Accepted> {
    match l {
        Listener::Unix(l, _) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
        Listener::Tcp(l) => l.accept().await.map(|(s, a)| Accepted::Tcp(s, a)),
    }
}
