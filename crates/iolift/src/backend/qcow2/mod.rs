//! `qcow2:PATH[,cache=ENTRIES][,paths=N][,direct][,control=SOCKET][,ro]`:
//! a qcow2 image (version 3, or 2), read and written through
//! `iolift-qcow2`.
//!
//! The image has one control plane (the only code that changes its
//! metadata) and `paths` data paths, each with a mapping cache of
//! `cache` entries (one entry maps one guest cluster). Requests run on
//! tokio's blocking pool; each pool thread is given a data path once
//! (round robin) and keeps it, so the caches are per worker: a thread
//! never waits for another's cache lock on a hit, and the number of
//! caches, and with it the memory, stays fixed however many NBD
//! connections there are. `cache=0` serves every request under the
//! control plane's lock (the slow path, for comparison).
//!
//! Flush and FUA are fdatasync of the image file; trim discards whole
//! clusters; write-zeroes sets the zero flag (version 3).
//!
//! `direct`: the data paths read and write with O_DIRECT (past the page
//! cache). `control=SOCKET`: a unix socket for online control (snapshots,
//! discard, compaction, cache resize, statistics; `control.rs`). Each
//! read and write is timed into the latency histogram of the path it
//! took (hit, miss, control plane; `lat.rs`).

mod control;
mod lat;
mod place;
mod uring;

use super::{BackendSpec, Kind, OptHelp};
use crate::block::{BlockDev, DevInfo, DevRef, Errno, Extent, IoFuture, Reply, Request};
use crate::metrics::{self, Instance, MetricSource};
use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use control::ControlSocket;
use iolift_qcow2::{ControlPlane, DataPath, Options, Served, MAX_DATA_PATHS};
use lat::Latency;
use place::{worker, Conns, Placement};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "cache",
        kind: Kind::Count,
        default: "65536",
        help: "mapping cache entries (guest clusters) per data path; 0: no cache, every request through the control plane",
    },
    OptHelp {
        name: "paths",
        kind: Kind::Count,
        default: "4",
        help: "data paths, each with its own cache, shared round robin by the worker threads (1 to 64)",
    },
    OptHelp {
        name: "direct",
        kind: Kind::Flag,
        default: "off",
        help: "data paths read and write the image with O_DIRECT (4 KiB aligned requests), past the page cache",
    },
    OptHelp {
        name: "engine",
        kind: Kind::Text("threads|uring"),
        default: "uring with direct, else threads",
        help: "uring (needs direct): cache hits read and write through io_uring, from the thread that read the request; threads: every request on the blocking pool. Without an engine= and where io_uring cannot be set up, direct falls back to threads (logged)",
    },
    OptHelp {
        name: "inline_us",
        kind: Kind::Count,
        default: "10",
        help: "engine=uring: a request alone on its data path (nothing else in flight there, idle at least this many us) runs on the thread that read it (a hit: a blocking pread/pwrite, or with spin_us the inline ring); 0: never",
    },
    OptHelp {
        name: "spin_us",
        kind: Kind::Count,
        default: "0",
        help: "engine=uring: a hit run on the thread that read it (inline_us) goes through the path's inline ring and spins on its completion up to this many us before sleeping in the kernel; 0: a blocking pread/pwrite instead",
    },
    OptHelp {
        name: "bufs",
        kind: Kind::Count,
        default: "32",
        help: "engine=uring: registered 16 KiB buffers per data path (0 to 256)",
    },
    OptHelp {
        name: "placement",
        kind: Kind::Text("worker|conn"),
        default: "worker",
        help: "which data path serves a request: the worker thread's (given round robin) or the NBD connection's (given round robin per connection)",
    },
    OptHelp {
        name: "control",
        kind: Kind::Text("SOCKET"),
        default: "none",
        help: "unix socket for online control: snapshot create/delete/list, discard, compact, cache resize, stats (iolift qcow2 control SOCKET ...)",
    },
    OptHelp {
        name: "ro",
        kind: Kind::Flag,
        default: "off",
        help: "read-only",
    },
    OptHelp {
        name: "name",
        kind: Kind::Label,
        default: "a number",
        help: "the instance label of this image's metrics",
    },
];

pub struct Qcow2Config {
    pub path: PathBuf,
    pub opts: Options,
    pub name: Option<String>,
    pub control: Option<PathBuf>,
    /// engine=uring: registered buffers per data path (None: threads).
    pub uring: Option<usize>,
    /// engine=uring was asked for by name (else chosen by `direct`, and
    /// the threads engine is the fallback where io_uring fails).
    pub uring_named: bool,
    /// engine=uring: the `inline_us` gap (None: 0, never inline).
    pub inline_gap: Option<Duration>,
    /// engine=uring: how long an inline request spins on its completion
    /// before sleeping in the kernel (`spin_us`, 0: not at all).
    pub spin_us: u32,
    pub placement: Placement,
}

pub fn parse(s: &BackendSpec) -> Result<Qcow2Config> {
    if s.arg.is_empty() {
        bail!("backend qcow2: missing PATH (qcow2:PATH[,cache=ENTRIES][,paths=N][,direct][,control=SOCKET][,ro])");
    }
    let paths = s.opts.u64("paths", 4)?;
    if !(1..=MAX_DATA_PATHS as u64).contains(&paths) {
        return Err(s
            .opts
            .err("paths", format!("{paths}: 1 to {MAX_DATA_PATHS}")));
    }
    let direct = s.opts.flag("direct")?;
    let named = s.opts.get("engine");
    let default = if direct { "uring" } else { "threads" };
    let uring = match named.unwrap_or(default) {
        "threads" => None,
        "uring" if !direct => return Err(s.opts.err("engine", "uring needs direct")),
        "uring" => {
            let bufs = s.opts.u64("bufs", 32)?;
            if bufs > 256 {
                return Err(s.opts.err("bufs", format!("{bufs}: 0 to 256")));
            }
            Some(bufs as usize)
        }
        e => return Err(s.opts.err("engine", format!("{e}: threads or uring"))),
    };
    let placement = match s.opts.get("placement").unwrap_or("worker") {
        "worker" => Placement::Worker,
        "conn" => Placement::Conn,
        p => return Err(s.opts.err("placement", format!("{p}: worker or conn"))),
    };
    let inline_us = s.opts.u64("inline_us", 10)?;
    if inline_us > 1_000_000 {
        return Err(s
            .opts
            .err("inline_us", format!("{inline_us}: 0 to 1000000")));
    }
    let spin_us = s.opts.u64("spin_us", 0)?;
    if spin_us > 1000 {
        return Err(s.opts.err("spin_us", format!("{spin_us}: 0 to 1000")));
    }
    Ok(Qcow2Config {
        spin_us: spin_us as u32,
        uring_named: named == Some("uring"),
        inline_gap: (inline_us > 0).then(|| Duration::from_micros(inline_us)),
        uring,
        placement,
        path: PathBuf::from(&s.arg),
        opts: Options {
            read_only: s.opts.flag("ro")?,
            cache_entries: s.opts.u64("cache", 65536)?,
            data_paths: paths as usize,
            direct,
        },
        name: s.opts.get("name").map(str::to_string),
        control: s.opts.get("control").map(PathBuf::from),
    })
}

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let c = parse(s)?;
    let cp = ControlPlane::open(&c.path, &c.opts)
        .with_context(|| format!("backend qcow2: {}", c.path.display()))?;
    let paths = (0..c.opts.data_paths)
        .map(|i| DataPath::new(cp.clone(), i))
        .collect();
    let lat = Arc::new(Latency::new(c.opts.data_paths));
    let uring = match c.uring {
        Some(bufs) => {
            let n = c.opts.data_paths;
            match uring::Uring::open(&c.path, n, c.opts.read_only, bufs, c.inline_gap, c.spin_us) {
                Ok(u) => Some(Arc::new(u)),
                Err(e) if !c.uring_named => {
                    tracing::warn!(
                        "qcow2 {}: io_uring not available ({e:#}); the data paths use the blocking pool (engine=threads)",
                        c.path.display()
                    );
                    None
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("backend qcow2: {}", c.path.display()))
                }
            }
        }
        None => None,
    };
    let control = match &c.control {
        Some(p) => Some(
            ControlSocket::start(p, cp.clone(), lat.clone(), uring.clone())
                .with_context(|| format!("backend qcow2: {}", c.path.display()))?,
        ),
        None => None,
    };
    let inner = Arc::new(Inner {
        cp,
        paths,
        uring,
        placement: c.placement,
        conns: Conns::default(),
        path: c.path,
        id: Instance::new("qcow2", c.name),
        lat,
        control: Mutex::new(control),
    });
    metrics::register(inner.clone());
    Ok(Arc::new(Qcow2Dev { inner }))
}

pub struct Qcow2Dev {
    inner: Arc<Inner>,
}

struct Inner {
    cp: Arc<ControlPlane>,
    paths: Vec<DataPath>,
    uring: Option<Arc<uring::Uring>>,
    placement: Placement,
    conns: Conns,
    path: PathBuf,
    id: Instance,
    lat: Arc<Latency>,
    control: Mutex<Option<ControlSocket>>,
}

fn errno(e: iolift_qcow2::Error) -> Errno {
    tracing::error!("qcow2: {e}");
    Errno(e.errno())
}

impl Inner {
    /// The data path for a request submitted from this thread now, when
    /// the submitter decides it: always with placement=conn (the
    /// connection's), and with engine=uring (the submitting thread's, so a
    /// miss warms the cache its next hit looks in). `None`: the blocking
    /// pool thread that runs the request decides (its own path).
    fn submitter_path(&self) -> Option<usize> {
        match self.placement {
            Placement::Conn => Some(self.conns.path() % self.paths.len()),
            Placement::Worker if self.uring.is_some() => Some(worker() % self.paths.len()),
            Placement::Worker => None,
        }
    }

    fn run(&self, w: Option<usize>, req: Request) -> Result<Reply, Errno> {
        let w = w.unwrap_or_else(worker) % self.paths.len();
        let dp = &self.paths[w];
        let t0 = Instant::now();
        match req {
            Request::Read { offset, len } => {
                let mut buf = BytesMut::zeroed(len as usize);
                let how = dp.read_served(offset, &mut buf).map_err(errno)?;
                self.lat.record(w, how, t0.elapsed());
                Ok(Reply::Data(buf.freeze()))
            }
            Request::Write {
                offset,
                data,
                flags,
            } => {
                let how = dp.write_served(offset, &data, flags.fua).map_err(errno)?;
                self.lat.record(w, how, t0.elapsed());
                Ok(Reply::Done(data.len() as u64))
            }
            Request::Flush => self.cp.flush().map(|_| Reply::Done(0)).map_err(errno),
            Request::Trim { offset, len, .. } => {
                self.cp.discard(offset, len as u64).map_err(errno)?;
                self.lat.record(w, Served::Control, t0.elapsed());
                Ok(Reply::Done(0))
            }
            Request::WriteZeroes { offset, len, flags } => {
                self.cp
                    .write_zeroes(offset, len as u64, flags.no_hole)
                    .map_err(errno)?;
                if flags.fua {
                    self.cp.flush().map_err(errno)?;
                }
                self.lat.record(w, Served::Control, t0.elapsed());
                Ok(Reply::Done(0))
            }
            Request::Cache { .. } => Ok(Reply::Done(0)),
            Request::BlockStatus { offset, len } => {
                let runs = self.cp.block_status(offset, len as u64).map_err(errno)?;
                Ok(Reply::Extents(
                    runs.into_iter()
                        .map(|(len, kind)| Extent {
                            len,
                            hole: kind == 2,
                            zero: kind != 0,
                        })
                        .collect(),
                ))
            }
        }
    }
}

impl Qcow2Dev {
    /// Runs `req` on the blocking pool, on data path `w` (`None`: the
    /// pool thread's own).
    fn submit_on(&self, w: Option<usize>, req: Request) -> IoFuture {
        let cp = &self.inner.cp;
        if let Err(e) = req.admit(cp.size(), cp.read_only()) {
            return crate::block::ready(Err(e));
        }
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.run(w, req))
                .await
                .unwrap_or(Err(Errno::EIO))
        })
    }
}

impl BlockDev for Qcow2Dev {
    fn info(&self) -> DevInfo {
        let cp = &self.inner.cp;
        DevInfo {
            read_only: cp.read_only(),
            can_fast_zero: false,
            ..DevInfo::full(cp.size())
        }
    }

    fn submit(&self, req: Request) -> IoFuture {
        let w = self.inner.submitter_path();
        self.submit_on(w, req)
    }

    /// With engine=uring, hits complete on the data path's ring thread.
    fn native_callbacks(&self) -> bool {
        self.inner.uring.is_some()
    }

    fn submit_cb(&self, req: Request, cb: crate::block::Callback) {
        let Some(u) = &self.inner.uring else {
            return crate::block::drive(self.submit(req), cb);
        };
        let cp = &self.inner.cp;
        if let Err(e) = req.admit(cp.size(), cp.read_only()) {
            return cb(Err(e));
        }
        let w = self.inner.submitter_path().unwrap_or(0);
        let dp = &self.inner.paths[w];
        match u.start(w, dp, &self.inner.lat, req, cb) {
            uring::Start::Started => {}
            uring::Start::Here(req, cb) => cb(self.inner.run(Some(w), req)),
            uring::Start::Pool(req, cb) => crate::block::drive(self.submit_on(Some(w), req), cb),
        }
    }

    fn name(&self) -> String {
        format!("qcow2({})", self.inner.path.display())
    }

    fn close(&self) -> IoFuture {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                if let Some(mut c) = lock(&inner.control).take() {
                    c.stop();
                }
                inner.cp.close().map(|_| Reply::Done(0))
            })
            .await
            .unwrap_or(Ok(Reply::Done(0)))
            .map_err(errno)
        })
    }
}

const HEADERS: &[(&str, &str, &str)] = &[
    (
        "iolift_qcow2_cache_hits_total",
        "counter",
        "requests a data path's mapping cache answered",
    ),
    (
        "iolift_qcow2_cache_misses_total",
        "counter",
        "lookups that went to the control plane",
    ),
    (
        "iolift_qcow2_cache_evictions_total",
        "counter",
        "entries evicted to stay within the budget",
    ),
    (
        "iolift_qcow2_cache_invalidations_total",
        "counter",
        "entries the control plane invalidated before changing a mapping",
    ),
    ("iolift_qcow2_cache_entries", "gauge", "entries held"),
    (
        "iolift_qcow2_translations_total",
        "counter",
        "translations the control plane answered",
    ),
    (
        "iolift_qcow2_locked_requests_total",
        "counter",
        "requests served under the control plane's lock",
    ),
    (
        "iolift_qcow2_allocations_total",
        "counter",
        "data clusters allocated",
    ),
    (
        "iolift_qcow2_cache_hit_ratio",
        "gauge",
        "hits / (hits + misses) over every data path since start",
    ),
    (
        "iolift_qcow2_compaction_moved_total",
        "counter",
        "clusters (data and L2 tables) compaction moved",
    ),
    (
        "iolift_qcow2_latency_seconds",
        "summary",
        "request latency by the path it took: hit (every cluster from the cache), miss (translated), control (under the control plane's lock)",
    ),
];

impl MetricSource for Inner {
    fn render(&self, out: &mut String) {
        for (i, c) in self.cp.caches().iter().enumerate() {
            let p = i.to_string();
            let l = [("path", p.as_str())];
            let s = &c.stats;
            self.id.sample(out, HEADERS[0].0, &l, s.hits.load(Relaxed));
            self.id
                .sample(out, HEADERS[1].0, &l, s.misses.load(Relaxed));
            self.id
                .sample(out, HEADERS[2].0, &l, s.evictions.load(Relaxed));
            self.id
                .sample(out, HEADERS[3].0, &l, s.invalidations.load(Relaxed));
            self.id.sample(out, HEADERS[4].0, &l, c.len());
        }
        let (hits, misses) = self.cp.caches().iter().fold((0, 0), |(h, m), c| {
            (
                h + c.stats.hits.load(Relaxed),
                m + c.stats.misses.load(Relaxed),
            )
        });
        let ratio = if hits + misses == 0 {
            0.0
        } else {
            hits as f64 / (hits + misses) as f64
        };
        self.id.sample(out, HEADERS[8].0, &[], ratio);
        let s = &self.cp.stats;
        self.id
            .sample(out, HEADERS[9].0, &[], s.moved.load(Relaxed));
        self.lat.render(&self.id, HEADERS[10].0, out);
        self.id
            .sample(out, HEADERS[5].0, &[], s.translations.load(Relaxed));
        self.id
            .sample(out, HEADERS[6].0, &[], s.locked_requests.load(Relaxed));
        self.id
            .sample(out, HEADERS[7].0, &[], s.allocations.load(Relaxed));
    }

    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        HEADERS
    }
}
