//! The control socket of a served qcow2 image (`control=PATH`): a unix
//! socket that takes one command per line and answers zero or more lines
//! of data, then `ok` or `error: MESSAGE`. `iolift qcow2 control PATH
//! COMMAND...` is its client; `socat - UNIX-CONNECT:PATH` works too.
//!
//! Commands (sizes in bytes):
//!
//! ```text
//! stats                        counters and per-path latency
//! snapshot list                one line per snapshot: ID NAME DATE
//! snapshot create NAME
//! snapshot delete NAME
//! snapshot revert NAME         (alias apply) the disk as at the snapshot
//! discard OFFSET LENGTH        whole clusters inside the range
//! compact                      move clusters to the front, cut the file
//! cache ENTRIES                resize every data path's mapping cache
//! flush
//! ```
//!
//! They run on the control plane while clients do I/O: each invalidates
//! the cached mappings it changes first. The socket is served by one
//! thread, plus one per connection (at most [`MAX_CONNECTIONS`] at once,
//! a line at most [`MAX_LINE`] bytes, idle connections closed after
//! [`IDLE`]).

use super::lat::Latency;
use super::uring::Uring;
use anyhow::{bail, Context, Result};
use iolift_qcow2::ControlPlane;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

pub const MAX_CONNECTIONS: usize = 8;
pub const MAX_LINE: u64 = 4096;
pub const IDLE: Duration = Duration::from_secs(600);

pub struct ControlSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Binds `path`; a stale socket file no one listens on is replaced, any
/// other file there is an error (never removed).
fn bind(path: &Path) -> Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "control socket {}: a file that is not a socket is there",
                path.display()
            );
        }
        if UnixStream::connect(path).is_ok() {
            bail!(
                "control socket {}: in use by a running server",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| {
            format!("control socket {}: removing the stale file", path.display())
        })?;
    }
    UnixListener::bind(path).with_context(|| format!("control socket {}", path.display()))
}

impl ControlSocket {
    pub fn start(
        path: &Path,
        cp: Arc<ControlPlane>,
        lat: Arc<Latency>,
        uring: Option<Arc<Uring>>,
    ) -> Result<ControlSocket> {
        let l = bind(path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("qcow2-control".into())
            .spawn(move || accept_loop(l, cp, lat, uring, s))
            .context("starting the control socket's thread")?;
        Ok(ControlSocket {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stops taking connections (those open finish their command) and
    /// removes the socket file. Idempotent.
    pub fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, SeqCst);
            let _ = UnixStream::connect(&self.path); // wakes accept()
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    l: UnixListener,
    cp: Arc<ControlPlane>,
    lat: Arc<Latency>,
    uring: Option<Arc<Uring>>,
    stop: Arc<AtomicBool>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    for conn in l.incoming() {
        if stop.load(SeqCst) {
            break;
        }
        let Ok(mut s) = conn else { continue };
        if open.fetch_add(1, SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, SeqCst);
            let _ = writeln!(
                s,
                "error: busy ({MAX_CONNECTIONS} control connections open)"
            );
            continue;
        }
        let (cp, lat, uring, open) = (cp.clone(), lat.clone(), uring.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("qcow2-control-conn".into())
            .spawn(move || {
                let _ = serve(s, &cp, &lat, uring.as_deref());
                open.fetch_sub(1, SeqCst);
            });
        if spawned.is_err() {
            tracing::error!("qcow2 control socket: cannot start a connection thread");
        }
    }
}

fn serve(
    s: UnixStream,
    cp: &ControlPlane,
    lat: &Latency,
    uring: Option<&Uring>,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(IDLE))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        let n = (&mut r).take(MAX_LINE).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        if !line.ends_with('\n') && n as u64 >= MAX_LINE {
            writeln!(w, "error: line longer than {MAX_LINE} bytes")?;
            return Ok(());
        }
        let reply = match run(cp, lat, uring, line.trim()) {
            Ok(text) => format!("{text}ok\n"),
            Err(e) => format!("error: {}\n", format!("{e:#}").replace('\n', " ")),
        };
        w.write_all(reply.as_bytes())?;
    }
}

fn num(what: &str, v: Option<&str>) -> Result<u64> {
    let v = v.with_context(|| format!("missing {what}"))?;
    v.parse()
        .with_context(|| format!("{what} {v:?} is not a number of bytes"))
}

/// Runs one command; returns its data lines.
pub fn run(cp: &ControlPlane, lat: &Latency, uring: Option<&Uring>, line: &str) -> Result<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = String::new();
    match words.as_slice() {
        ["stats"] => {
            out = stats(cp);
            if let Some(u) = uring {
                let s = u.stats();
                let _ = write!(
                    out,
                    "uring_ops {}\nuring_enters {}\nuring_max_batch {}\nuring_inline_hits {}\nuring_inline_misses {}\nuring_inline_other {}\nuring_inline_sync {}\n",
                    s.ops,
                    s.enters,
                    s.max_batch,
                    s.inline_hits,
                    s.inline_misses,
                    s.inline_other,
                    s.inline_sync
                );
            }
            out.push_str(&lat.text());
        }
        ["snapshot", "list"] => {
            for s in cp.snapshots() {
                let _ = writeln!(out, "{} {} {}", s.id, s.name, s.date_sec);
            }
        }
        ["snapshot", "create", name] => cp
            .snapshot_create(name)
            .with_context(|| format!("snapshot create {name:?}"))?,
        ["snapshot", "delete", name] => cp
            .snapshot_delete(name)
            .with_context(|| format!("snapshot delete {name:?}"))?,
        // Under the control plane's lock: every cached mapping is
        // invalidated (waiting for the I/O in flight on it) before the
        // active L1 table changes; requests after it see the snapshot.
        ["snapshot", "revert" | "apply", name] => cp
            .snapshot_revert(name)
            .with_context(|| format!("snapshot revert {name:?}"))?,
        ["discard", rest @ ..] if rest.len() <= 2 => {
            let off = num("discard OFFSET", rest.first().copied())?;
            let len = num("discard LENGTH", rest.get(1).copied())?;
            match off.checked_add(len) {
                Some(end) if end <= cp.size() => {}
                _ => bail!(
                    "discard {off} {len}: past the end of the image ({} bytes)",
                    cp.size()
                ),
            }
            cp.discard(off, len).context("discard")?;
        }
        ["compact"] => {
            let st = cp.compact().context("compact")?;
            let _ = writeln!(
                out,
                "moved data={} tables={} file_bytes_before={} file_bytes_after={}",
                st.data_moved, st.tables_moved, st.len_before, st.len_after
            );
        }
        ["cache", n] => {
            let n = n
                .parse::<u64>()
                .with_context(|| format!("cache ENTRIES {n:?} is not a number"))?;
            if cp.caches().is_empty() {
                bail!("cache: the image was opened with cache=0 (no data path caches)");
            }
            if n == 0 {
                bail!("cache 0: a cache needs at least one entry (cache=0 is an open option)");
            }
            for i in 0..cp.caches().len() {
                cp.resize_cache(i, n);
            }
        }
        ["flush"] => cp.flush().context("flush")?,
        [] => bail!("empty command"),
        _ => bail!(
            "unknown command {line:?} (stats, snapshot list|create NAME|delete NAME|revert NAME, \
             discard OFFSET LENGTH, compact, cache ENTRIES, flush)"
        ),
    }
    Ok(out)
}

fn stats(cp: &ControlPlane) -> String {
    let mut out = String::new();
    let (mut hits, mut misses, mut ev, mut inv, mut entries, mut budget) = (0, 0, 0, 0, 0, 0);
    for c in cp.caches() {
        hits += c.stats.hits.load(Relaxed);
        misses += c.stats.misses.load(Relaxed);
        ev += c.stats.evictions.load(Relaxed);
        inv += c.stats.invalidations.load(Relaxed);
        entries += c.len() as u64;
        budget += c.budget();
    }
    let ratio = if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    };
    let s = &cp.stats;
    let _ = writeln!(out, "cache_paths {}", cp.caches().len());
    let _ = writeln!(out, "cache_entries {entries}");
    let _ = writeln!(out, "cache_budget {budget}");
    let _ = writeln!(out, "cache_hits {hits}");
    let _ = writeln!(out, "cache_misses {misses}");
    let _ = writeln!(out, "cache_hit_ratio {ratio:.4}");
    let _ = writeln!(out, "cache_evictions {ev}");
    let _ = writeln!(out, "cache_invalidations {inv}");
    let _ = writeln!(out, "translations {}", s.translations.load(Relaxed));
    let _ = writeln!(out, "locked_requests {}", s.locked_requests.load(Relaxed));
    let _ = writeln!(out, "allocations {}", s.allocations.load(Relaxed));
    let _ = writeln!(out, "compaction_moved {}", s.moved.load(Relaxed));
    let _ = writeln!(out, "snapshots {}", cp.snapshots().len());
    out
}
