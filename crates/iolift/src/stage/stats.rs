//! `stats`: per-op counters and latency histograms of the requests passing
//! through, exported in Prometheus text format by `--metrics ADDR`.
//!
//! `stats[:name=LABEL]`; its series carry `stage="stats"` and
//! `instance="LABEL"` (by default a number in creation order), so several
//! stats stages in one stack are told apart by `name`.

use super::{Kind, OptHelp, Opts};
use crate::block::{BlockDev, Completion, DevInfo, DevRef, IoFuture, OpKind, Reply, Request};
use crate::metrics::{self, Instance, MetricSource};
use anyhow::Result;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Default)]
struct OpCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
}

pub struct StatsInner {
    id: Instance,
    ops: [OpCounters; 7],
    /// Latency in nanoseconds, per op.
    lat: [Mutex<Histogram<u64>>; 7],
}

pub struct StatsDev {
    below: DevRef,
    inner: Arc<StatsInner>,
}

fn idx(k: OpKind) -> usize {
    OpKind::ALL.iter().position(|&x| x == k).unwrap_or(0)
}

pub const OPTIONS: &[OptHelp] = &[OptHelp {
    name: "name",
    kind: Kind::Label,
    default: "a number",
    help: "the `instance` label of its /metrics series",
}];

pub fn build(o: Opts, below: DevRef) -> Result<DevRef> {
    Ok(Arc::new(StatsDev::new(o.label("name")?, below)))
}

impl StatsDev {
    /// A stats stage named `name` (`None`: numbered) over `below`.
    pub fn new(name: Option<String>, below: DevRef) -> Self {
        let inner = Arc::new(StatsInner {
            id: Instance::new("stats", name),
            ops: Default::default(),
            lat: std::array::from_fn(|_| {
                Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram"))
            }),
        });
        metrics::register(inner.clone());
        StatsDev { below, inner }
    }

    /// Requests seen of one kind.
    pub fn requests(&self, k: OpKind) -> u64 {
        self.inner.ops[idx(k)].requests.load(Relaxed)
    }
}

impl StatsInner {
    fn done(&self, k: OpKind, start: Instant, c: &Completion) {
        let i = idx(k);
        let o = &self.ops[i];
        o.requests.fetch_add(1, Relaxed);
        match c {
            Err(_) => {
                o.errors.fetch_add(1, Relaxed);
            }
            Ok(Reply::Data(d)) => {
                o.bytes.fetch_add(d.len() as u64, Relaxed);
            }
            Ok(Reply::Done(n)) => {
                o.bytes.fetch_add(*n, Relaxed);
            }
            Ok(Reply::Extents(_)) => {}
        }
        let ns = start.elapsed().as_nanos().clamp(1, 3_600_000_000_000) as u64;
        let _ = self.lat[i]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(ns);
    }
}

impl MetricSource for StatsInner {
    fn render(&self, out: &mut String) {
        for (i, k) in OpKind::ALL.iter().enumerate() {
            let o = &self.ops[i];
            let op = [("op", k.name())];
            let sample = |out: &mut String, fam: &str, v: &dyn std::fmt::Display| {
                self.id.sample(out, fam, &op, v)
            };
            sample(
                out,
                "iolift_stats_requests_total",
                &o.requests.load(Relaxed),
            );
            sample(out, "iolift_stats_errors_total", &o.errors.load(Relaxed));
            sample(out, "iolift_stats_bytes_total", &o.bytes.load(Relaxed));
            let h = self.lat[i].lock().unwrap_or_else(|e| e.into_inner());
            for q in [0.5, 0.9, 0.99, 0.999] {
                let v = if h.is_empty() {
                    0.0
                } else {
                    h.value_at_quantile(q) as f64 / 1e9
                };
                let q = q.to_string();
                let labels = [("op", k.name()), ("quantile", q.as_str())];
                self.id.sample(
                    out,
                    "iolift_stats_latency_seconds",
                    &labels,
                    format!("{v:e}"),
                );
            }
            let sum = h.mean() * h.len() as f64 / 1e9;
            sample(out, "iolift_stats_latency_seconds_sum", &format!("{sum:e}"));
            sample(out, "iolift_stats_latency_seconds_count", &h.len());
        }
    }

    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[
            (
                "iolift_stats_requests_total",
                "counter",
                "Requests completed, by stats stage and op.",
            ),
            (
                "iolift_stats_errors_total",
                "counter",
                "Requests failed, by stats stage and op.",
            ),
            (
                "iolift_stats_bytes_total",
                "counter",
                "Bytes read or written, by stats stage and op.",
            ),
            (
                "iolift_stats_latency_seconds",
                "summary",
                "Request latency below the stats stage.",
            ),
        ]
    }
}

impl BlockDev for StatsDev {
    fn info(&self) -> DevInfo {
        self.below.info()
    }

    fn submit(&self, req: Request) -> IoFuture {
        let k = req.kind();
        let start = Instant::now();
        let f = self.below.submit(req);
        let inner = self.inner.clone();
        Box::pin(async move {
            let c = f.await;
            inner.done(k, start, &c);
            c
        })
    }

    fn name(&self) -> String {
        format!("stats({})", self.inner.id.name())
    }

    fn close(&self) -> IoFuture {
        self.below.close()
    }
}
