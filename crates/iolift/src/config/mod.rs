//! Settings of `iolift serve`: the defaults, the command-line flags
//! ([`Flags`]), the TOML file ([`Config`], `--config FILE`), and their
//! merge into [`Settings`]. Every value is checked here, by one function
//! per kind of value whether it comes from a flag or the file, and errors
//! name the flag (`--max-request`) or the field (`export[1].backend`).
//!
//! ```toml
//! socket = "/tmp/iolift.sock"      # unix socket path
//! tcp = "127.0.0.1:10809"          # also listen on TCP (HOST:PORT, HOST or :PORT)
//! read_only = false                # every export read-only
//! max_request = "32M"              # largest read/write payload
//! max_inflight = "256M"            # bytes of requests in flight, all connections together
//! threads = 2                      # tokio worker threads
//! poll_us = "auto"                 # poll mode: "auto" or a budget in microseconds (0 = off, the default)
//! coalesce_us = 50                 # longest coalescing pause, microseconds (0 = off)
//! default_export = "disk"          # the export answering to the empty name
//! stages = ["cache:size=64M"]      # stacked on every export (first = top)
//! fuse = ["disk=/run/iolift/disk/disk.img"]  # FUSE block files: "FILE" or "NAME=FILE"
//! metrics = "127.0.0.1:9100"       # Prometheus text at http://ADDR/metrics
//! pidfile = "/run/iolift.pid"      # written once serving, removed at exit
//!
//! [[export]]
//! name = "disk"
//! backend = "file:/var/tmp/disk.img,size=1G"
//! read_only = false
//! stages = []                      # stacked below the global stages
//! description = "scratch disk"
//! ```
//!
//! Flags override the file's values; `--stage`s are stacked above the
//! file's `stages`, `--export`s come before the file's `[[export]]`s, and
//! any `--fuse` replaces the file's `fuse` list. Unknown fields are errors
//! naming the field.

pub mod poll;
pub mod ublk;

use crate::export::ExportPlan;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Backend of the "" export when nothing else is given: a sparse 1 GiB
/// file in the current directory.
pub const DEFAULT_BACKEND: &str = "file:iolift-disk.img,size=1G";
pub const DEFAULT_SOCKET: &str = "/tmp/iolift.sock";
/// `--tcp` without a value, or without a host or a port.
pub const DEFAULT_TCP_HOST: &str = "127.0.0.1";
pub const DEFAULT_TCP_PORT: u16 = 10809;
/// Largest read/write payload accepted: the NBD server's own default, so
/// that a `ServerCfg::default()` and the settings agree.
pub use crate::nbd::DEFAULT_MAX_REQUEST;
/// Tokio worker threads (`serve --threads`, `attach --threads`).
pub const DEFAULT_THREADS: usize = 2;
/// FUSE reader threads per mounted file.
pub const DEFAULT_FUSE_THREADS: usize = 2;
/// Poll mode unless told otherwise: adaptive (`config/poll.rs`,
/// `nbd/adapt.rs`).
pub use poll::{PollSetting, DEFAULT_POLL};
/// Longest coalescing pause unless told otherwise (nbd/coalesce.rs): a few
/// requests' worth of a busy client's time.
pub const DEFAULT_COALESCE_US: u64 = 50;

/// The flags of `iolift serve`.
#[derive(Args, Debug, Default, Clone)]
pub struct Flags {
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
    #[arg(short, long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
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
    /// Bytes of requests in flight over all connections together (their
    /// payloads and read buffers); readers wait for it in turn
    /// [default: 256M]. Each connection is also held to 64M.
    #[arg(long, value_name = "SIZE")]
    pub max_inflight: Option<String>,
    /// Write the server's pid here once listening; removed at exit.
    #[arg(long, value_name = "PATH")]
    pub pidfile: Option<PathBuf>,
    /// Tokio worker threads [default: 2].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Poll mode: a connection's reader retries its socket before sleeping,
    /// saving a wake-up per request at low queue depth at the cost of CPU.
    /// "auto": the budget follows the connection's waits (20 to 1000 us)
    /// and polling backs off while it is descheduled, finds no data, or
    /// the machine has more runnable threads than cores. N: a fixed budget
    /// of N microseconds (max 10000; 0 = off, the default). Either way off
    /// for deep queues and for waits longer than half the budget.
    #[arg(long, value_name = "auto|N")]
    pub poll_us: Option<PollSetting>,
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
    /// `--ublk[=NAME]`, `--ublk-queues`, `--ublk-depth` (see docs/ublk.md).
    #[command(flatten)]
    pub ublk: ublk::UblkFlags,
}

/// A size given as a number of bytes or a string such as "32M".
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    pub fn bytes(&self, field: &str) -> Result<u64> {
        match self {
            SizeValue::Bytes(n) => Ok(*n),
            SizeValue::Text(s) => crate::util::parse_size(s).with_context(|| field.to_string()),
        }
    }
}

/// The TOML file (see the module doc).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub socket: Option<PathBuf>,
    pub tcp: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    pub max_request: Option<SizeValue>,
    pub max_inflight: Option<SizeValue>,
    pub threads: Option<usize>,
    pub poll_us: Option<PollSetting>,
    pub coalesce_us: Option<u64>,
    pub default_export: Option<String>,
    #[serde(default)]
    pub stages: Vec<String>,
    /// `--fuse` specs: "FILE" (the default export) or "NAME=FILE".
    #[serde(default)]
    pub fuse: Vec<String>,
    pub metrics: Option<String>,
    pub pidfile: Option<PathBuf>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportConfig>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    #[serde(default)]
    pub name: String,
    pub backend: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub stages: Vec<String>,
    pub description: Option<String>,
}

impl Config {
    /// Parses and validates TOML text; errors name the bad field.
    pub fn parse(text: &str) -> Result<Config> {
        let c: Config = toml::from_str(text).map_err(|e| anyhow!("{e}"))?;
        c.validate()?;
        Ok(c)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("config {}: cannot read", path.display()))?;
        Config::parse(&text).with_context(|| format!("config {}", path.display()))
    }

    /// Checks the values the types cannot (sizes, specs, names), each
    /// with the same check as its flag.
    pub fn validate(&self) -> Result<()> {
        if let Some(m) = &self.max_request {
            max_request(m.bytes("max_request")?).context("max_request")?;
        }
        if let Some(m) = &self.max_inflight {
            max_inflight(m.bytes("max_inflight")?).context("max_inflight")?;
        }
        if let Some(t) = &self.tcp {
            parse_tcp_addr(t).context("tcp")?;
        }
        threads(self.threads).context("threads")?;
        if let Some(p) = self.poll_us {
            p.check().context("poll_us")?;
        }
        if let Some(n) = self.coalesce_us {
            coalesce_us(n).context("coalesce_us")?;
        }
        if let Some(m) = &self.metrics {
            metrics_addr(m).context("metrics")?;
        }
        for (i, s) in self.stages.iter().enumerate() {
            stage_spec(s).with_context(|| format!("stages[{i}]"))?;
        }
        let mut seen = std::collections::HashSet::new();
        for (i, e) in self.exports.iter().enumerate() {
            let p = format!("export[{i}]");
            export_name(&e.name).with_context(|| format!("{p}.name"))?;
            if !seen.insert(e.name.as_str()) {
                bail!("{p}.name: duplicate export name {:?}", e.name);
            }
            backend_spec(&e.backend).with_context(|| format!("{p}.backend"))?;
            for (j, s) in e.stages.iter().enumerate() {
                stage_spec(s).with_context(|| format!("{p}.stages[{j}]"))?;
            }
        }
        if let Some(d) = &self.default_export {
            if !self.exports.iter().any(|e| &e.name == d) {
                bail!("default_export: no [[export]] named {d:?}");
            }
        }
        for (i, f) in self.fuse.iter().enumerate() {
            if f.is_empty() {
                bail!("fuse[{i}]: empty FILE");
            }
        }
        Ok(())
    }
}

/// A FUSE block file to mount: which export, where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuseFile {
    /// The spec as given, for messages.
    pub spec: String,
    pub export: String,
    pub file: PathBuf,
}

/// Everything `serve` will do, after merging flags over the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub exports: Vec<ExportPlan>,
    pub default_export: Option<String>,
    pub socket: Option<PathBuf>,
    /// TCP listener: host and port.
    pub tcp: Option<(String, u16)>,
    pub max_request: u32,
    /// Server-wide cap on bytes of requests in flight.
    pub max_inflight: u64,
    pub threads: usize,
    /// Poll mode: adaptive or a fixed budget per read (0 = off).
    pub poll_us: PollSetting,
    /// Longest coalescing pause, microseconds (0 = off).
    pub coalesce_us: u64,
    pub pidfile: Option<PathBuf>,
    /// FUSE block files, resolved to their exports.
    pub fuse: Vec<FuseFile>,
    pub metrics: Option<String>,
    /// ublk devices: which exports, how.
    pub ublk: ublk::UblkPlan,
}

impl Settings {
    /// Reads `--config` (if given) and merges the flags over it.
    pub fn load(f: &Flags) -> Result<Settings> {
        let cfg = match &f.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        Settings::merge(f, &cfg)
    }

    /// Merges the flags over a loaded (and so validated) config file,
    /// checking the flags' values on the way.
    pub fn merge(f: &Flags, cfg: &Config) -> Result<Settings> {
        let read_only = f.read_only || cfg.read_only;
        for (i, s) in f.stages.iter().enumerate() {
            stage_spec(s).with_context(|| format!("--stage {s:?} (#{})", i + 1))?;
        }
        let mut global_stages = f.stages.clone();
        global_stages.extend(cfg.stages.iter().cloned());
        let plan = |name: &str, backend: &str| ExportPlan {
            name: name.to_string(),
            backend: backend.to_string(),
            stages: global_stages.clone(),
            read_only,
            description: None,
        };
        let mut exports: Vec<ExportPlan> = Vec::new();
        let add = |exports: &mut Vec<ExportPlan>, p: ExportPlan| -> Result<()> {
            if exports.iter().any(|e| e.name == p.name) {
                bail!("export {:?} given twice", p.name);
            }
            exports.push(p);
            Ok(())
        };
        if let Some(b) = &f.backend {
            backend_spec(b).context("BACKEND")?;
            add(&mut exports, plan("", b))?;
        }
        for e in &f.exports {
            let Some((name, backend)) = e.split_once('=') else {
                bail!("--export {e:?}: expected NAME=BACKEND, e.g. disk=memory:1G");
            };
            export_name(name).with_context(|| format!("--export {e:?}: name"))?;
            backend_spec(backend).with_context(|| format!("--export {e:?}"))?;
            add(&mut exports, plan(name, backend))?;
        }
        for e in &cfg.exports {
            let mut p = plan(&e.name, &e.backend);
            p.stages.extend(e.stages.iter().cloned());
            p.read_only |= e.read_only;
            p.description = e.description.clone();
            add(&mut exports, p)?;
        }
        if exports.is_empty() {
            add(&mut exports, plan("", DEFAULT_BACKEND))?;
        }
        let default_export = f.default_export.clone().or(cfg.default_export.clone());
        if let Some(d) = &default_export {
            if !exports.iter().any(|e| &e.name == d) {
                bail!("--default-export {d:?}: no such export");
            }
        }
        let max_request = match (&f.max_request, &cfg.max_request) {
            (Some(s), _) => crate::util::parse_size(s)
                .and_then(max_request)
                .context("--max-request")?,
            (None, Some(v)) => max_request(v.bytes("max_request")?).context("max_request")?,
            (None, None) => DEFAULT_MAX_REQUEST,
        };
        let max_inflight = match (&f.max_inflight, &cfg.max_inflight) {
            (Some(s), _) => crate::util::parse_size(s)
                .and_then(max_inflight)
                .context("--max-inflight")?,
            (None, Some(v)) => max_inflight(v.bytes("max_inflight")?).context("max_inflight")?,
            (None, None) => crate::nbd::DEFAULT_MAX_INFLIGHT,
        };
        let threads = match f.threads {
            Some(n) => threads(Some(n)).context("--threads")?,
            None => cfg.threads.unwrap_or(DEFAULT_THREADS),
        };
        let poll_us = match (f.poll_us, cfg.poll_us) {
            (Some(p), _) => p.check().context("--poll-us")?,
            (None, Some(p)) => p,
            (None, None) => DEFAULT_POLL,
        };
        let coalesce_us = match (f.coalesce_us, cfg.coalesce_us) {
            (Some(n), _) => coalesce_us(n).context("--coalesce-us")?,
            (None, Some(n)) => n,
            (None, None) => DEFAULT_COALESCE_US,
        };
        let tcp = match (&f.tcp, &cfg.tcp) {
            (Some(t), _) => Some(parse_tcp_addr(t).context("--tcp")?),
            (None, Some(t)) => Some(parse_tcp_addr(t).context("tcp")?),
            (None, None) => None,
        };
        let socket = match (f.socket.clone().or(cfg.socket.clone()), &tcp) {
            (Some(s), _) => Some(s),
            (None, Some(_)) => None,
            (None, None) => Some(PathBuf::from(DEFAULT_SOCKET)),
        };
        let metrics = match &f.metrics {
            Some(m) => Some(metrics_addr(m).context("--metrics")?.to_string()),
            None => cfg.metrics.clone(),
        };
        let (fuse_specs, what) = if f.fuse.is_empty() {
            (&cfg.fuse, "fuse")
        } else {
            (&f.fuse, "--fuse")
        };
        let names: Vec<String> = exports.iter().map(|e| e.name.clone()).collect();
        let mut fuse = Vec::new();
        for spec in fuse_specs {
            let (export, file) = parse_fuse_spec(spec, &names, default_export.as_deref())
                .with_context(|| format!("{what} {spec}"))?;
            fuse.push(FuseFile {
                spec: spec.clone(),
                export: export.to_string(),
                file,
            });
        }
        let ublk = ublk::UblkPlan::resolve(&f.ublk, &names, default_export.as_deref())?;
        Ok(Settings {
            exports,
            default_export,
            socket,
            tcp,
            max_request,
            max_inflight,
            threads,
            poll_us,
            coalesce_us,
            pidfile: f.pidfile.clone().or(cfg.pidfile.clone()),
            fuse,
            metrics,
            ublk,
        })
    }
}

/// Parses `HOST:PORT`, `HOST` or `:PORT` (IPv6 as `[::1]:PORT`); a missing
/// host or port is [`DEFAULT_TCP_HOST`] / [`DEFAULT_TCP_PORT`].
pub fn parse_tcp_addr(s: &str) -> Result<(String, u16)> {
    let s = s.trim();
    let host = |h: &str| {
        if h.is_empty() {
            DEFAULT_TCP_HOST.to_string()
        } else {
            h.to_string()
        }
    };
    let port = |p: &str| -> Result<u16> {
        p.parse::<u16>()
            .with_context(|| format!("bad TCP address {s:?}: port {p:?} is not a number 0-65535"))
    };
    if let Some(rest) = s.strip_prefix('[') {
        let Some((h, tail)) = rest.split_once(']') else {
            bail!("bad TCP address {s:?}: missing ']'");
        };
        let p = match tail.strip_prefix(':') {
            Some(p) => port(p)?,
            None if tail.is_empty() => DEFAULT_TCP_PORT,
            None => bail!("bad TCP address {s:?}"),
        };
        return Ok((host(h), p));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((host(h), port(p)?)),
        // No port, or a bare IPv6 address.
        _ => Ok((host(s), DEFAULT_TCP_PORT)),
    }
}

/// `host:port` for messages, IPv6 hosts in brackets.
pub fn show_tcp_addr((host, port): &(String, u16)) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A duration in microseconds, 0 (off) up to `max`.
fn us_at_most(n: u64, max: std::time::Duration) -> Result<u64> {
    let max = max.as_micros() as u64;
    if n > max {
        bail!("{n} us is more than the maximum of {max} us");
    }
    Ok(n)
}

/// The longest coalescing pause: 0 (off) up to 1 ms.
pub fn coalesce_us(n: u64) -> Result<u64> {
    us_at_most(n, crate::nbd::coalesce::MAX_PAUSE)
}

/// max_request must fit the wire's 32-bit length and be at least 512.
pub fn max_request(n: u64) -> Result<u32> {
    if !(512..=u32::MAX as u64).contains(&n) {
        bail!("{n} out of range (512 bytes to 4G-1)");
    }
    Ok(n as u32)
}

/// The server-wide in-flight budget: at least one largest request's worth
/// (1M), at most what a semaphore counts.
pub fn max_inflight(n: u64) -> Result<u64> {
    let max = tokio::sync::Semaphore::MAX_PERMITS as u64;
    if !(1 << 20..=max).contains(&n) {
        bail!("{n} out of range (1M to {max} bytes)");
    }
    Ok(n)
}

fn threads(n: Option<usize>) -> Result<usize> {
    match n {
        Some(0) => bail!("must be at least 1"),
        Some(n) => Ok(n),
        None => Ok(DEFAULT_THREADS),
    }
}

/// `HOST:PORT` of the metrics endpoint (the host may be a name).
fn metrics_addr(a: &str) -> Result<&str> {
    let port = a
        .rsplit_once(':')
        .map(|(h, p)| (h.is_empty(), p.parse::<u16>()));
    match port {
        Some((false, Ok(_))) => Ok(a),
        _ => bail!("{a:?}: expected HOST:PORT, e.g. 127.0.0.1:9100"),
    }
}

/// An export name must be a valid NBD string.
fn export_name(n: &str) -> Result<()> {
    crate::nbd::wire::check_string(n.as_bytes()).map_err(|m| anyhow!("{m}"))?;
    Ok(())
}

/// A backend spec, checked as strictly as opening it would (nothing is opened).
fn backend_spec(s: &str) -> Result<()> {
    crate::backend::check_spec(s)
}

/// A stage spec, checked as strictly as building it would (nothing is built).
fn stage_spec(s: &str) -> Result<()> {
    crate::stage::check_spec(s)
}

/// Which export a `[NAME=]FILE` FUSE spec names, and the file.
///
/// `FILE` alone names the default export: `default` (the default export's
/// name) if given, else the export named `""`, else the only export.
/// `NAME=FILE` is taken as a name only when NAME is an export, so file
/// names may contain `=`.
pub fn parse_fuse_spec<'a>(
    spec: &str,
    names: &'a [String],
    default: Option<&'a str>,
) -> Result<(&'a str, PathBuf)> {
    if spec.is_empty() {
        bail!("empty FILE");
    }
    if let Some((n, f)) = spec.split_once('=') {
        if let Some(name) = names.iter().find(|x| x.as_str() == n) {
            if f.is_empty() {
                bail!("empty FILE");
            }
            return Ok((name.as_str(), PathBuf::from(f)));
        }
    }
    let name = match default {
        Some(d) if names.iter().any(|x| x == d) => d,
        _ => match names.iter().find(|x| x.is_empty()) {
            Some(n) => n.as_str(),
            None if names.len() == 1 => names[0].as_str(),
            None => bail!("no default export among {names:?}; use NAME=FILE"),
        },
    };
    Ok((name, PathBuf::from(spec)))
}

#[cfg(test)]
mod tests;
