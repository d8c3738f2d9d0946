//! The `ec` device's counters on /metrics (`stage="ec",instance=NAME`).

use super::Inner;
use crate::metrics::{self, Instance, MetricSource};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

/// Counters; gauges are read from the device when rendered.
pub struct EcMetrics {
    id: Instance,
    dev: Mutex<Weak<Inner>>,
    /// Stripes not yet rebuilt while a rebuild runs.
    pub rebuild_left: AtomicU64,
    pub rebuilt_bytes: AtomicU64,
    /// Chunks that failed their crc.
    pub crc_errors: AtomicU64,
    /// Chunk column ranges written back after a crc mismatch.
    pub repairs: AtomicU64,
    pub repaired_bytes: AtomicU64,
    /// Reads that had to decode.
    pub decodes: AtomicU64,
    /// Children marked failed.
    pub failures: AtomicU64,
    pub stripe_writes: AtomicU64,
    /// Write requests sent to children (any: chunks, journal, bitmap,
    /// crc table, superblock).
    pub child_writes: AtomicU64,
    /// Journal updates written again at open.
    pub replayed: AtomicU64,
    /// Stripes of dirty bitmap regions whose parity or crcs were rewritten.
    pub resynced: AtomicU64,
    /// Stripes whose parity the offload engine computed (`device=gpu`).
    pub offloaded: AtomicU64,
}

const HEADERS: &[(&str, &str, &str)] = &[
    (
        "iolift_ec_children_failed",
        "gauge",
        "children failed or being rebuilt",
    ),
    (
        "iolift_ec_degraded_stripes",
        "gauge",
        "stripes without full redundancy",
    ),
    (
        "iolift_ec_rebuilt_bytes_total",
        "counter",
        "bytes written by rebuilds",
    ),
    (
        "iolift_ec_crc_errors_total",
        "counter",
        "chunk reads that failed their crc32c",
    ),
    (
        "iolift_ec_repairs_total",
        "counter",
        "corrupt chunk ranges rewritten from parity",
    ),
    (
        "iolift_ec_repaired_bytes_total",
        "counter",
        "bytes rewritten from parity",
    ),
    (
        "iolift_ec_decoded_reads_total",
        "counter",
        "chunk reads served by decoding",
    ),
    (
        "iolift_ec_child_failures_total",
        "counter",
        "children marked failed",
    ),
    ("iolift_ec_stripe_writes_total", "counter", "stripe updates"),
    (
        "iolift_ec_child_writes_total",
        "counter",
        "write requests sent to the children",
    ),
    (
        "iolift_ec_journal_replayed_total",
        "counter",
        "updates written again after a crash",
    ),
    (
        "iolift_ec_resynced_stripes_total",
        "counter",
        "stripes whose parity or crcs the resync after an unclean stop rewrote",
    ),
];

impl EcMetrics {
    pub fn new(name: Option<String>) -> Arc<EcMetrics> {
        let m = Arc::new(EcMetrics {
            id: Instance::new("ec", name),
            dev: Mutex::new(Weak::new()),
            rebuild_left: AtomicU64::new(0),
            rebuilt_bytes: AtomicU64::new(0),
            crc_errors: AtomicU64::new(0),
            repairs: AtomicU64::new(0),
            repaired_bytes: AtomicU64::new(0),
            decodes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            stripe_writes: AtomicU64::new(0),
            child_writes: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            resynced: AtomicU64::new(0),
            offloaded: AtomicU64::new(0),
        });
        metrics::register(m.clone());
        m
    }

    /// Lets the gauges read the device.
    pub fn attach(&self, dev: &Arc<Inner>) {
        *self.dev.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(dev);
    }

    /// Stripes without full redundancy: all of them while a child is
    /// failed and no rebuild runs, else those the rebuild has not reached.
    pub fn degraded_stripes(&self, d: &Inner) -> u64 {
        if d.degraded() == 0 {
            0
        } else if d.degraded_failed() > 0 {
            d.geo.stripes
        } else {
            self.rebuild_left.load(Relaxed)
        }
    }
}

impl MetricSource for EcMetrics {
    fn render(&self, out: &mut String) {
        let dev = self.dev.lock().unwrap_or_else(|e| e.into_inner()).upgrade();
        if let Some(d) = &dev {
            self.id
                .sample(out, "iolift_ec_children_failed", &[], d.degraded());
            self.id.sample(
                out,
                "iolift_ec_degraded_stripes",
                &[],
                self.degraded_stripes(d),
            );
        }
        for (fam, v) in [
            ("iolift_ec_rebuilt_bytes_total", &self.rebuilt_bytes),
            ("iolift_ec_crc_errors_total", &self.crc_errors),
            ("iolift_ec_repairs_total", &self.repairs),
            ("iolift_ec_repaired_bytes_total", &self.repaired_bytes),
            ("iolift_ec_decoded_reads_total", &self.decodes),
            ("iolift_ec_child_failures_total", &self.failures),
            ("iolift_ec_stripe_writes_total", &self.stripe_writes),
            ("iolift_ec_child_writes_total", &self.child_writes),
            ("iolift_ec_journal_replayed_total", &self.replayed),
            ("iolift_ec_resynced_stripes_total", &self.resynced),
            ("iolift_ec_offloaded_stripes_total", &self.offloaded),
        ] {
            self.id.sample(out, fam, &[], v.load(Relaxed));
        }
    }

    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        HEADERS
    }
}
