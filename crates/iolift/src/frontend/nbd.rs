//! The NBD front-end of `iolift serve`: listeners (inherited from systemd,
//! or bound from `--socket` / `--tcp`) at start, and from
//! [`Frontend::begin`] on the accept loops of [`crate::nbd::run`], which
//! drain the connections when stopped. A client that connects early waits
//! in the listen backlog until every front-end is up.

use super::{BoxFuture, Frontend, RemoveOnDrop};
use crate::config::{show_tcp_addr, Settings};
use crate::export::Export;
use crate::nbd::{self, Listener, Server, ServerCfg};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long open connections may take to finish their requests at stop.
const GRACE: Duration = Duration::from_secs(10);

struct NbdFront {
    shutdown: watch::Sender<bool>,
    /// Until [`Frontend::begin`]: the server and its bound listeners.
    pending: Option<(Arc<Server>, Vec<Listener>)>,
    /// After it: the accept loops and connections.
    task: Option<JoinHandle<()>>,
    hints: Vec<String>,
    /// Socket files we bound; removed if we are dropped without a stop
    /// (after a stop, `nbd::run` has removed them).
    _sockets: Vec<RemoveOnDrop>,
}

pub fn start<'a>(
    s: &'a Settings,
    exports: &'a [Arc<Export>],
) -> BoxFuture<'a, Result<Option<Box<dyn Frontend>>>> {
    Box::pin(async move {
        let mut sockets = Vec::new();
        let mut listeners = inherited_listeners()?;
        if listeners.is_empty() {
            if let Some(p) = &s.socket {
                listeners.push(bind_unix(p)?);
                sockets.push(RemoveOnDrop(p.clone()));
            }
            if let Some(t) = &s.tcp {
                let addr = show_tcp_addr(t);
                let l = tokio::net::TcpListener::bind((t.0.as_str(), t.1))
                    .await
                    .with_context(|| format!("--tcp {addr}: cannot listen"))?;
                listeners.push(Listener::Tcp(l));
            }
        }
        let first = exports.first().map(|e| e.name.as_str()).unwrap_or("");
        let hints = listeners.iter().flat_map(|l| hints(l, first)).collect();
        let server = Arc::new(Server::new(
            exports.iter().cloned(),
            s.default_export.clone(),
            ServerCfg {
                max_request: s.max_request,
                max_inflight: s.max_inflight,
                poll: s.poll_us.mode(),
                poll_spinners: s.threads.saturating_sub(1).max(1),
                coalesce: Duration::from_micros(s.coalesce_us),
                ..ServerCfg::default()
            },
        ));
        Ok(Some(Box::new(NbdFront {
            shutdown: watch::channel(false).0,
            pending: Some((server, listeners)),
            task: None,
            hints,
            _sockets: sockets,
        }) as Box<dyn Frontend>))
    })
}

impl Frontend for NbdFront {
    fn kind(&self) -> &'static str {
        "nbd"
    }

    fn hints(&self) -> Vec<String> {
        self.hints.clone()
    }

    /// Starts accepting connections.
    fn begin(&mut self) {
        if let Some((server, listeners)) = self.pending.take() {
            let rx = self.shutdown.subscribe();
            self.task = Some(tokio::spawn(nbd::run(server, listeners, rx, GRACE)));
        }
    }

    /// Stops accepting and waits for open connections to finish their
    /// requests (at most [`GRACE`]).
    fn stop(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = self.shutdown.send(true);
            if let Some(t) = self.task.take() {
                if let Err(e) = t.await {
                    tracing::warn!("NBD server task: {e}");
                }
            }
        })
    }
}

impl Drop for NbdFront {
    fn drop(&mut self) {
        // Without a stop: stop accepting; the socket files go with
        // `sockets`.
        let _ = self.shutdown.send(true);
    }
}

/// Commands that reach `name` through listener `l`.
fn hints(l: &Listener, name: &str) -> Vec<String> {
    match l {
        Listener::Unix(_, Some(p)) => {
            let p = p.display();
            vec![
                format!("nbdinfo 'nbd+unix:///{name}?socket={p}'"),
                format!("qemu-img info 'nbd+unix:///{name}?socket={p}'"),
                format!("nbd-client -unix {p} -N '{name}' /dev/nbd0"),
            ]
        }
        Listener::Tcp(t) => match t.local_addr() {
            Ok(a) => vec![
                format!("nbdinfo nbd://{a}/{name}"),
                format!("qemu-img info nbd://{a}/{name}"),
                format!("nbd-client {} {} -N '{name}' /dev/nbd0", a.ip(), a.port()),
            ],
            Err(_) => Vec::new(),
        },
        Listener::Unix(_, None) => vec![format!("(inherited socket) {}", l.describe())],
    }
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
