//! Latency histograms of the qcow2 backend, one set per data path and one
//! histogram per path a request took (`Served`: hit, miss, control), so
//! a worker records into its own data path's set and workers on
//! different paths never share a lock. Rendered merged, as a Prometheus
//! summary per path. Memory: 3 histograms per data path of about 20 KiB
//! each (1 ns to 60 s, 2 significant digits).

use hdrhistogram::Histogram;
use iolift_qcow2::Served;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const MAX_NS: u64 = 60_000_000_000;
const QUANTILES: &[f64] = &[0.5, 0.9, 0.99, 0.999, 0.9999];

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 2).expect("histogram bounds")
}

fn index(s: Served) -> usize {
    match s {
        Served::Hit => 0,
        Served::Miss => 1,
        Served::Control => 2,
    }
}

pub struct Latency {
    per_path: Vec<Mutex<[Histogram<u64>; 3]>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Latency {
    pub fn new(paths: usize) -> Latency {
        Latency {
            per_path: (0..paths.max(1))
                .map(|_| Mutex::new([new_hist(), new_hist(), new_hist()]))
                .collect(),
        }
    }

    /// Records one request of data path `path`.
    pub fn record(&self, path: usize, s: Served, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1, MAX_NS);
        let mut g = lock(&self.per_path[path % self.per_path.len()]);
        g[index(s)].saturating_record(ns);
    }

    /// Every data path's histogram of `s`, merged.
    pub fn merged(&self, s: Served) -> Histogram<u64> {
        let mut h = new_hist();
        for p in &self.per_path {
            let _ = h.add(&lock(p)[index(s)]);
        }
        h
    }

    /// Appends one summary per path (`served` label), in seconds.
    pub fn render(&self, id: &crate::metrics::Instance, family: &str, out: &mut String) {
        for s in Served::ALL {
            let h = self.merged(s);
            for &q in QUANTILES {
                let qs = q.to_string();
                let v = if h.is_empty() {
                    0.0
                } else {
                    h.value_at_quantile(q) as f64 / 1e9
                };
                id.sample(out, family, &[("served", s.name()), ("quantile", &qs)], v);
            }
            let sum = h.mean() * h.len() as f64 / 1e9;
            let l = [("served", s.name())];
            id.sample(out, &format!("{family}_sum"), &l, format!("{sum:e}"));
            id.sample(out, &format!("{family}_count"), &l, h.len());
        }
    }

    /// One line per path: count and microseconds at the quantiles (the
    /// control socket's `stats`).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for s in Served::ALL {
            let h = self.merged(s);
            let _ = write!(out, "latency_{} count={}", s.name(), h.len());
            if !h.is_empty() {
                let _ = write!(out, " avg_us={:.1}", h.mean() / 1e3);
                for &q in QUANTILES {
                    let _ = write!(
                        out,
                        " p{}_us={:.1}",
                        q * 100.0,
                        h.value_at_quantile(q) as f64 / 1e3
                    );
                }
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_per_path_and_merges() {
        let l = Latency::new(2);
        l.record(0, Served::Hit, Duration::from_micros(10));
        l.record(1, Served::Hit, Duration::from_micros(30));
        l.record(5, Served::Miss, Duration::from_millis(2));
        assert_eq!(l.merged(Served::Hit).len(), 2);
        assert_eq!(l.merged(Served::Miss).len(), 1);
        assert!(l.merged(Served::Control).is_empty());
        let p50 = l.merged(Served::Miss).value_at_quantile(0.5);
        assert!((1_980_000..=2_020_000).contains(&p50), "{p50}");
        let t = l.text();
        assert!(t.contains("latency_hit count=2"), "{t}");
        let id = crate::metrics::Instance::new("qcow2", Some("t".into()));
        let mut out = String::new();
        l.render(&id, "lat", &mut out);
        assert!(
            out.contains(
                "lat{stage=\"qcow2\",instance=\"t\",served=\"miss\",quantile=\"0.5\"} 0.00"
            ),
            "{out}"
        );
        assert!(
            out.contains("lat_count{stage=\"qcow2\",instance=\"t\",served=\"hit\"} 2"),
            "{out}"
        );
    }
}
