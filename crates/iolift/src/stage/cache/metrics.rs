//! The cache's lines on the /metrics endpoint.
//!
//! Contract: [`Inner`] is a metrics source registered when the cache is
//! built; rendering reads the counters and takes the block-map lock once
//! for the two gauges (bytes held, dirty bytes). Every sample carries the
//! stage's labels (`stage="cache",instance=...`, see
//! [`crate::metrics::Instance`]).

use super::Inner;
use crate::metrics::MetricSource;
use std::sync::atomic::Ordering::Relaxed;

impl MetricSource for Inner {
    fn render(&self, out: &mut String) {
        let (bytes, dirty) = {
            let st = self.lock();
            (st.bytes, st.dirty_bytes)
        };
        for (k, v) in [
            ("hits_total", self.hits.load(Relaxed)),
            ("misses_total", self.misses.load(Relaxed)),
            ("writebacks_total", self.writebacks.load(Relaxed)),
            ("writeback_bytes_total", self.writeback_bytes.load(Relaxed)),
            ("evictions_total", self.evictions.load(Relaxed)),
            ("bytes", bytes),
            ("dirty_bytes", dirty),
        ] {
            self.id.sample(out, &format!("iolift_cache_{k}"), &[], v);
        }
    }

    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[
            (
                "iolift_cache_hits_total",
                "counter",
                "Blocks read from the cache.",
            ),
            (
                "iolift_cache_misses_total",
                "counter",
                "Blocks read from below.",
            ),
            (
                "iolift_cache_writebacks_total",
                "counter",
                "Write-back requests sent below.",
            ),
            (
                "iolift_cache_writeback_bytes_total",
                "counter",
                "Bytes written back.",
            ),
            (
                "iolift_cache_evictions_total",
                "counter",
                "Clean blocks evicted.",
            ),
            ("iolift_cache_bytes", "gauge", "Bytes cached."),
            ("iolift_cache_dirty_bytes", "gauge", "Dirty bytes cached."),
        ]
    }
}
