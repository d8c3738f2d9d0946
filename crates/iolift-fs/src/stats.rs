//! Per-operation counters of a front-end: requests, errors and a latency
//! histogram (from the request's arrival to its completion), rendered in
//! Prometheus text format. Fixed size: one row of atomics per operation.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The operations counted, in the order they are rendered.
pub const OPS: &[&str] = &[
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "symlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "access",
    "create",
    "fallocate",
    "lseek",
    "copy_file_range",
    "other",
];

/// Upper bounds of the latency buckets, in microseconds.
pub const BUCKETS_US: &[u64] = &[
    2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000, 1_000_000,
];

/// The index of `name` in [`OPS`] ("other" if absent).
pub fn op(name: &str) -> usize {
    OPS.iter().position(|o| *o == name).unwrap_or(OPS.len() - 1)
}

#[derive(Default)]
struct Row {
    count: AtomicU64,
    errors: AtomicU64,
    sum_ns: AtomicU64,
    /// One per bucket, plus +Inf.
    buckets: [AtomicU64; 15],
}

/// The counters of one mount.
pub struct OpStats {
    rows: Vec<Row>,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            rows: OPS.iter().map(|_| Row::default()).collect(),
        }
    }
}

impl OpStats {
    /// Counts one completed request of operation `op` that arrived at `start`.
    pub fn record(&self, op: usize, start: Instant, ok: bool) {
        let Some(r) = self.rows.get(op) else { return };
        let ns = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        r.count.fetch_add(1, Relaxed);
        if !ok {
            r.errors.fetch_add(1, Relaxed);
        }
        r.sum_ns.fetch_add(ns, Relaxed);
        let us = ns / 1000;
        let b = BUCKETS_US
            .iter()
            .position(|&u| us < u)
            .unwrap_or(BUCKETS_US.len());
        r.buckets[b].fetch_add(1, Relaxed);
    }

    /// Requests of `op` completed so far.
    pub fn count(&self, op: usize) -> u64 {
        self.rows.get(op).map_or(0, |r| r.count.load(Relaxed))
    }

    /// Appends the samples of every operation seen at least once, each
    /// series starting with the labels `labels` (`k="v",...`).
    pub fn render(&self, labels: &str, out: &mut String) {
        for (name, r) in OPS.iter().zip(&self.rows) {
            let n = r.count.load(Relaxed);
            if n == 0 {
                continue;
            }
            let l = format!("{labels},op=\"{name}\"");
            let _ = writeln!(out, "iolift_fs_requests_total{{{l}}} {n}");
            let _ = writeln!(
                out,
                "iolift_fs_errors_total{{{l}}} {}",
                r.errors.load(Relaxed)
            );
            let mut acc = 0;
            for (i, b) in r.buckets.iter().enumerate() {
                acc += b.load(Relaxed);
                let le = BUCKETS_US
                    .get(i)
                    .map_or("+Inf".to_string(), |u| format!("{}", *u as f64 / 1e6));
                let _ = writeln!(
                    out,
                    "iolift_fs_latency_seconds_bucket{{{l},le=\"{le}\"}} {acc}"
                );
            }
            let sum = r.sum_ns.load(Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "iolift_fs_latency_seconds_sum{{{l}}} {sum}");
            let _ = writeln!(out, "iolift_fs_latency_seconds_count{{{l}}} {acc}");
        }
    }

    /// (family, type, help) of what [`render`](Self::render) writes.
    pub const HEADERS: &'static [(&'static str, &'static str, &'static str)] = &[
        (
            "iolift_fs_requests_total",
            "counter",
            "file-system requests completed, by operation",
        ),
        (
            "iolift_fs_errors_total",
            "counter",
            "file-system requests completed with an errno",
        ),
        (
            "iolift_fs_latency_seconds",
            "histogram",
            "time from a request's arrival to its completion",
        ),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_counts_are_cumulative_and_match_the_total() {
        let s = OpStats::default();
        let t = Instant::now();
        s.record(op("read"), t, true);
        s.record(op("read"), t, false);
        s.record(op("no-such-op"), t, true);
        let mut out = String::new();
        s.render("mount=\"m\"", &mut out);
        assert!(out.contains("iolift_fs_requests_total{mount=\"m\",op=\"read\"} 2"));
        assert!(out.contains("iolift_fs_errors_total{mount=\"m\",op=\"read\"} 1"));
        assert!(out.contains("iolift_fs_latency_seconds_count{mount=\"m\",op=\"read\"} 2"));
        assert!(out.contains("le=\"+Inf\"} 2"));
        assert!(out.contains("op=\"other\""));
        assert!(!out.contains("op=\"write\""));
    }
}
