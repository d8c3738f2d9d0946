//! Poll mode in the Prometheus metrics (`serve --metrics ADDR`): one
//! connection's poll state, budget and counters.
//!
//! A connection's [`Polled`](super::poll::Polled) updates its
//! [`PollStats`] (relaxed atomics, no locks); once the handshake has chosen
//! an export the reader registers a [`ConnPollMetrics`] for it, which the
//! registry drops when the connection ends. Series, with the label scheme
//! of `metrics.rs` (`stage="nbd"`, `instance` a number per connection) plus
//! the export's name:
//!
//! ```text
//! iolift_nbd_poll_state{stage="nbd",instance="7",export="",state="polling"} 1
//! iolift_nbd_poll_budget_us{stage="nbd",instance="7",export=""} 45
//! iolift_nbd_poll_cpu_stall_permille{stage="nbd",instance="7",export=""} 12
//! iolift_nbd_polls_total{stage="nbd",instance="7",export="",result="data"} 1234
//! iolift_nbd_poll_backoffs_total{stage="nbd",instance="7",export="",reason="load"} 2
//! ```

use super::adapt::Reason;
use super::judge::ProbeResult;
use crate::metrics::{Instance, MetricSource};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// A connection's poll mode at its last wait for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PollState {
    /// `--poll-us 0`.
    Off = 0,
    /// A fixed budget (`--poll-us N`).
    Fixed = 1,
    /// Adaptive, polling.
    Polling = 2,
    /// Adaptive, not polling because the client keeps many requests
    /// coming or waits are too long for a poll.
    Idle = 3,
    /// Adaptive, backed off: polling cost more than it saved.
    Backoff = 4,
    /// Adaptive, not polling because the judge (`nbd/judge.rs`) runs an
    /// unpolled window: polling did not shorten the request cycle, or a
    /// probe measures the unpolled one.
    Unpolled = 5,
}

impl PollState {
    const ALL: [PollState; 6] = [
        PollState::Off,
        PollState::Fixed,
        PollState::Polling,
        PollState::Idle,
        PollState::Backoff,
        PollState::Unpolled,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PollState::Off => "off",
            PollState::Fixed => "fixed",
            PollState::Polling => "polling",
            PollState::Idle => "idle",
            PollState::Backoff => "backoff",
            PollState::Unpolled => "unpolled",
        }
    }
}

/// One connection's poll counters.
#[derive(Debug, Default)]
pub struct PollStats {
    state: AtomicU8,
    budget_us: AtomicU64,
    data: AtomicU64,
    empty: AtomicU64,
    backoffs: [AtomicU64; 3],
    /// The machine's CPU stall share at the last decision, in 1/1024ths.
    stall: AtomicU32,
    /// The judge's verdicts: polling won, lost.
    verdicts: [AtomicU64; 2],
    /// The last probe's typical request cycle, ns: unpolled, polled.
    cycle_ns: [AtomicU64; 2],
}

impl PollStats {
    pub fn set(&self, state: PollState, budget_us: u64) {
        self.state.store(state as u8, Ordering::Relaxed);
        self.budget_us.store(budget_us, Ordering::Relaxed);
    }

    pub fn state(&self) -> PollState {
        let s = self.state.load(Ordering::Relaxed);
        PollState::ALL
            .into_iter()
            .find(|x| *x as u8 == s)
            .unwrap_or(PollState::Off)
    }

    /// The machine's CPU stall share (`sysload::LoadSampler::stall`) seen
    /// by the last decision.
    pub fn set_stall(&self, stall: u32) {
        self.stall.store(stall, Ordering::Relaxed);
    }

    /// A poll ended, with data or not.
    pub fn polled(&self, found: bool) {
        let c = if found { &self.data } else { &self.empty };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The judge finished a probe.
    pub fn probed(&self, r: ProbeResult) {
        self.verdicts[usize::from(!r.polled_wins)].fetch_add(1, Ordering::Relaxed);
        self.cycle_ns[0].store(r.unpolled_ns, Ordering::Relaxed);
        self.cycle_ns[1].store(r.polled_ns, Ordering::Relaxed);
    }

    pub fn backed_off(&self, r: Reason) {
        let i = Reason::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.backoffs[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Polls that ended with data, without.
    pub fn polls(&self) -> (u64, u64) {
        (
            self.data.load(Ordering::Relaxed),
            self.empty.load(Ordering::Relaxed),
        )
    }
}

/// One connection's series in /metrics.
pub struct ConnPollMetrics {
    inst: Instance,
    export: String,
    stats: Arc<PollStats>,
}

impl ConnPollMetrics {
    /// Registers the connection's series; they go when the returned value
    /// is dropped.
    pub fn register(export: &str, stats: Arc<PollStats>) -> Arc<ConnPollMetrics> {
        let m = Arc::new(ConnPollMetrics {
            inst: Instance::new("nbd", None),
            export: export.to_string(),
            stats,
        });
        crate::metrics::register(m.clone());
        m
    }
}

impl MetricSource for ConnPollMetrics {
    fn render(&self, out: &mut String) {
        let (i, e, s) = (&self.inst, self.export.as_str(), &self.stats);
        let now = s.state();
        for st in PollState::ALL {
            let v = u8::from(st == now);
            i.sample(
                out,
                "iolift_nbd_poll_state",
                &[("export", e), ("state", st.name())],
                v,
            );
        }
        let budget = s.budget_us.load(Ordering::Relaxed);
        i.sample(out, "iolift_nbd_poll_budget_us", &[("export", e)], budget);
        let stall = s.stall.load(Ordering::Relaxed) as u64 * 1000 / 1024;
        i.sample(
            out,
            "iolift_nbd_poll_cpu_stall_permille",
            &[("export", e)],
            stall,
        );
        let (data, empty) = s.polls();
        for (result, v) in [("data", data), ("empty", empty)] {
            i.sample(
                out,
                "iolift_nbd_polls_total",
                &[("export", e), ("result", result)],
                v,
            );
        }
        for (k, v) in ["poll", "sleep"].into_iter().enumerate() {
            i.sample(
                out,
                "iolift_nbd_poll_verdicts_total",
                &[("export", e), ("verdict", v)],
                s.verdicts[k].load(Ordering::Relaxed),
            );
        }
        for (k, m) in ["unpolled", "polled"].into_iter().enumerate() {
            i.sample(
                out,
                "iolift_nbd_poll_cycle_ns",
                &[("export", e), ("mode", m)],
                s.cycle_ns[k].load(Ordering::Relaxed),
            );
        }
        for (k, r) in Reason::ALL.into_iter().enumerate() {
            let v = s.backoffs[k].load(Ordering::Relaxed);
            i.sample(
                out,
                "iolift_nbd_poll_backoffs_total",
                &[("export", e), ("reason", r.name())],
                v,
            );
        }
    }

    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[
            (
                "iolift_nbd_poll_state",
                "gauge",
                "1 for the connection's poll mode at its last wait for a request (off, fixed, polling, idle, backoff, unpolled)",
            ),
            (
                "iolift_nbd_poll_verdicts_total",
                "counter",
                "probes of adaptive poll mode, by verdict: poll (polled request cycles were shorter by the margin) or sleep",
            ),
            (
                "iolift_nbd_poll_cycle_ns",
                "gauge",
                "typical request cycle (one wait for a request to the next; mean of each window's cycles up to 8x its median) the connection's last probe measured, by mode, nanoseconds",
            ),
            (
                "iolift_nbd_poll_budget_us",
                "gauge",
                "poll budget of the connection's last poll decision, microseconds (0: not polling)",
            ),
            (
                "iolift_nbd_poll_cpu_stall_permille",
                "gauge",
                "share of time some thread waited for a CPU (kernel CPU pressure), per mille, as the connection's last adaptive decision saw it; past 200 polling backs off",
            ),
            (
                "iolift_nbd_polls_total",
                "counter",
                "polls of the connection's socket, by whether they ended with data",
            ),
            (
                "iolift_nbd_poll_backoffs_total",
                "counter",
                "times adaptive poll mode backed off, by reason",
            ),
        ]
    }
}
