//! The adaptive poll controller (`serve --poll-us auto`, the default): per
//! connection, whether the next wait for a request polls and for how long.
//!
//! A pure state machine over what the caller observed, so that its
//! decisions can be tested with made-up samples: [`Controller::admit`]
//! takes the time, the connection's average wait for a request and whether
//! threads are kept waiting for a CPU (`sysload::LoadSampler::busy`); [`Controller::observe`]
//! takes what one poll cost and found ([`PollSample`]). `nbd/poll.rs` feeds
//! it from the clocks and counters of `nbd/sysload.rs`.
//!
//! - Budget: three times the average wait, within [`AUTO_MIN`] and
//!   [`AUTO_MAX`]: a memory backend's client turns a reply around in tens
//!   of microseconds, an RBD image's requests take a few hundred. Waits
//!   averaging more than half of [`AUTO_MAX`] (an idle client, a slow
//!   backend) do not poll at all.
//! - Back-off: polling costs more than it saves when the poller is
//!   descheduled while it spins (its involuntary context switches grew, or
//!   its wall time ran far past its own CPU time: someone else needed the
//!   core), when polls end without data, or when threads are kept waiting
//!   for a CPU (the machine's CPU pressure). Then the connection sleeps in epoll like
//!   `--poll-us 0` for a back-off period, 10 ms doubling up to 1 s each time
//!   it backs off again; when the period ends it polls again only if the
//!   machine is quiet (no threads kept waiting for a CPU), else the
//!   period starts over. A long run of clean polls halves the period again.

use std::time::{Duration, Instant};

/// Shortest automatic budget.
pub const AUTO_MIN: Duration = Duration::from_micros(20);
/// Longest automatic budget: past this, sleeping is cheaper even for a
/// slow backend.
pub const AUTO_MAX: Duration = Duration::from_micros(1000);
/// First back-off period; each further back-off doubles it.
pub const BACKOFF_BASE: Duration = Duration::from_millis(10);
/// Longest back-off period (`BACKOFF_BASE << MAX_LEVEL`, about 1.3 s).
pub const MAX_LEVEL: u32 = 7;
/// Clean polls in a row after which the back-off level drops by one.
pub const CLEAN_RUN: u32 = 512;

/// Moving averages are fractions in 1/1024ths, updated by 1/8 per poll.
const ONE: u32 = 1024;
/// Back off past this share of descheduled polls (1/4).
const LOST_LIMIT: u32 = ONE / 4;
/// Back off past this share of polls without data (5/8): one in two
/// polls without data stays below it.
const EMPTY_LIMIT: u32 = ONE * 5 / 8;
/// A poll whose wall time passes twice its CPU time plus this was
/// descheduled (clock granularity and the syscalls around it stay below).
const SLACK: Duration = Duration::from_micros(10);

/// What one poll cost and found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollSample {
    /// How long it spun.
    pub wall: Duration,
    /// The polling thread's CPU time over it.
    pub cpu: Duration,
    /// Its involuntary context switches grew meanwhile.
    pub preempted: bool,
    /// It ended with data (else its budget ran out).
    pub found: bool,
}

impl PollSample {
    /// Lost its core part of the time: preempted or wall time far past
    /// CPU time.
    pub fn descheduled(&self) -> bool {
        self.preempted || self.wall > self.cpu * 2 + SLACK
    }
}

/// Why the controller backed off (the metrics' `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Polls were descheduled.
    Descheduled,
    /// Polls ended without data.
    Empty,
    /// Threads kept waiting for a CPU (the machine's CPU pressure).
    Load,
}

impl Reason {
    pub const ALL: [Reason; 3] = [Reason::Descheduled, Reason::Empty, Reason::Load];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Descheduled => "descheduled",
            Reason::Empty => "empty",
            Reason::Load => "load",
        }
    }
}

/// The controller's answer for one wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Poll for this long.
    Poll(Duration),
    /// Waits are too long to poll for (not a back-off).
    Idle,
    /// Backed off: sleep.
    Backoff,
    /// Backed off just now, for this reason.
    BackoffNow(Reason),
}

/// One connection's adaptive poll state.
#[derive(Debug, Clone)]
pub struct Controller {
    /// Share of recent polls that were descheduled, in 1/1024ths.
    lost: u32,
    /// Share of recent polls that ended without data, in 1/1024ths.
    empty: u32,
    /// Backed off until then.
    until: Option<Instant>,
    /// How many times in a row it backed off (the period's exponent).
    level: u32,
    /// Clean polls since the level last changed.
    clean: u32,
    /// The budget of the last `Poll` verdict (for the metrics).
    budget: Duration,
}

impl Default for Controller {
    fn default() -> Self {
        Self::new()
    }
}

impl Controller {
    pub fn new() -> Self {
        Controller {
            lost: 0,
            empty: 0,
            until: None,
            level: 0,
            clean: 0,
            budget: Duration::ZERO,
        }
    }

    /// The budget for a wait whose connection has lately waited `gap` on
    /// average, at `now`; `busy`: threads are kept waiting for a CPU.
    pub fn admit(&mut self, now: Instant, gap: Duration, busy: bool) -> Verdict {
        if let Some(until) = self.until {
            if now < until {
                return Verdict::Backoff;
            }
            if busy {
                // Come back only to a quiet machine: another period.
                self.until = Some(now + self.period());
                return Verdict::Backoff;
            }
            self.until = None;
            self.lost = 0;
            self.empty = 0;
        }
        if busy {
            return self.back_off(now, Reason::Load);
        }
        if gap * 2 > AUTO_MAX {
            self.budget = Duration::ZERO;
            return Verdict::Idle;
        }
        self.budget = (gap * 3).clamp(AUTO_MIN, AUTO_MAX);
        Verdict::Poll(self.budget)
    }

    /// What the poll that the last `Poll` verdict allowed cost and found.
    /// Returns the reason when this sample makes it back off.
    pub fn observe(&mut self, now: Instant, s: PollSample) -> Option<Reason> {
        let lost = s.descheduled();
        self.lost = avg(self.lost, lost);
        self.empty = avg(self.empty, !s.found);
        if self.lost > LOST_LIMIT {
            return self.back_off_reason(now, Reason::Descheduled);
        }
        if self.empty > EMPTY_LIMIT {
            return self.back_off_reason(now, Reason::Empty);
        }
        if lost || !s.found {
            self.clean = 0;
        } else {
            self.clean += 1;
            if self.clean >= CLEAN_RUN {
                self.clean = 0;
                self.level = self.level.saturating_sub(1);
            }
        }
        None
    }

    fn back_off_reason(&mut self, now: Instant, r: Reason) -> Option<Reason> {
        match self.back_off(now, r) {
            Verdict::BackoffNow(r) => Some(r),
            _ => None,
        }
    }

    fn back_off(&mut self, now: Instant, r: Reason) -> Verdict {
        self.until = Some(now + self.period());
        self.level = (self.level + 1).min(MAX_LEVEL);
        self.clean = 0;
        self.budget = Duration::ZERO;
        Verdict::BackoffNow(r)
    }

    /// The current back-off period.
    fn period(&self) -> Duration {
        BACKOFF_BASE * (1 << self.level.min(MAX_LEVEL))
    }

    /// Backed off at `now`.
    #[cfg(test)]
    pub fn backed_off(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }

    /// The budget of the last poll allowed (zero after a back-off or an
    /// idle verdict).
    #[cfg(test)]
    pub fn budget(&self) -> Duration {
        self.budget
    }
}

/// A moving average of a yes/no series, in 1/1024ths, by 1/8 per step.
fn avg(a: u32, yes: bool) -> u32 {
    (a * 7 + if yes { ONE } else { 0 }) / 8
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    fn clean(wall_us: u64) -> PollSample {
        PollSample {
            wall: US * wall_us as u32,
            cpu: US * wall_us as u32,
            preempted: false,
            found: true,
        }
    }

    #[test]
    fn budget_follows_the_wait_within_its_bounds() {
        let mut c = Controller::new();
        let t = Instant::now();
        assert_eq!(c.admit(t, US * 15, false), Verdict::Poll(US * 45));
        assert_eq!(c.admit(t, US * 2, false), Verdict::Poll(AUTO_MIN));
        assert_eq!(c.admit(t, US * 300, false), Verdict::Poll(US * 900));
        assert_eq!(c.admit(t, US * 450, false), Verdict::Poll(AUTO_MAX));
        assert_eq!(c.budget(), AUTO_MAX);
        // waits past half the longest budget: no poll, no back-off
        assert_eq!(c.admit(t, US * 600, false), Verdict::Idle);
        assert_eq!(c.budget(), Duration::ZERO);
        assert!(!c.backed_off(t));
        assert_eq!(c.admit(t, US * 15, false), Verdict::Poll(US * 45));
    }

    #[test]
    fn clean_polls_never_back_off() {
        let mut c = Controller::new();
        let mut t = Instant::now();
        for i in 0..10_000u64 {
            assert!(matches!(c.admit(t, US * 20, false), Verdict::Poll(_)));
            assert_eq!(c.observe(t, clean(5 + i % 40)), None);
            t += US * 50;
        }
    }

    #[test]
    fn descheduled_polls_back_off_and_the_period_grows() {
        let mut c = Controller::new();
        let t0 = Instant::now();
        let bad = PollSample {
            wall: US * 60,
            cpu: US * 5,
            preempted: false,
            found: true,
        };
        assert!(bad.descheduled());
        let preempted = PollSample {
            preempted: true,
            ..clean(30)
        };
        assert!(preempted.descheduled());
        assert!(!clean(30).descheduled());
        // one bad poll among clean ones is tolerated
        assert_eq!(c.observe(t0, bad), None);
        for _ in 0..20 {
            assert_eq!(c.observe(t0, clean(10)), None);
        }
        // a run of them is not: backs off after the third
        assert_eq!(c.observe(t0, preempted), None);
        assert_eq!(c.observe(t0, bad), None);
        assert_eq!(c.observe(t0, bad), Some(Reason::Descheduled));
        assert!(c.backed_off(t0));
        assert_eq!(c.budget(), Duration::ZERO);
        assert_eq!(c.admit(t0 + US * 9_999, US * 10, false), Verdict::Backoff);
        // the period (10 ms) ends on a quiet machine: polls again, and a
        // second back-off lasts twice as long
        let t1 = t0 + BACKOFF_BASE;
        assert!(matches!(c.admit(t1, US * 10, false), Verdict::Poll(_)));
        let mut r = None;
        for _ in 0..3 {
            r = r.or(c.observe(t1, bad));
        }
        assert_eq!(r, Some(Reason::Descheduled));
        assert_eq!(c.admit(t1 + BACKOFF_BASE, US * 10, false), Verdict::Backoff);
        assert!(matches!(
            c.admit(t1 + BACKOFF_BASE * 2, US * 10, false),
            Verdict::Poll(_)
        ));
    }

    #[test]
    fn a_busy_machine_backs_off_and_keeps_it_off_until_quiet() {
        let mut c = Controller::new();
        let t0 = Instant::now();
        assert_eq!(
            c.admit(t0, US * 10, true),
            Verdict::BackoffNow(Reason::Load)
        );
        // still busy when the period ends: another period, no poll
        let mut t = t0;
        for _ in 0..5 {
            t += AUTO_MAX * 1000 * 2;
            assert_eq!(c.admit(t, US * 10, true), Verdict::Backoff);
        }
        // quiet at the end of a period: polls again
        t += BACKOFF_BASE * (1 << MAX_LEVEL);
        assert_eq!(c.admit(t, US * 10, false), Verdict::Poll(US * 30));
    }

    #[test]
    fn polls_without_data_back_off() {
        let mut c = Controller::new();
        let t = Instant::now();
        let empty = PollSample {
            found: false,
            ..clean(45)
        };
        // alternating data and none stays below half
        for _ in 0..50 {
            assert_eq!(c.observe(t, empty), None);
            assert_eq!(c.observe(t, clean(10)), None);
        }
        let mut r = None;
        for _ in 0..10 {
            r = r.or(c.observe(t, empty));
        }
        assert_eq!(r, Some(Reason::Empty));
        assert!(c.backed_off(t));
    }

    #[test]
    fn the_period_is_bounded_and_shrinks_after_clean_runs() {
        let mut c = Controller::new();
        let mut t = Instant::now();
        let bad = PollSample {
            preempted: true,
            ..clean(10)
        };
        for _ in 0..20 {
            assert!(matches!(c.admit(t, US * 10, false), Verdict::Poll(_)));
            let mut r = None;
            for _ in 0..3 {
                r = r.or(c.observe(t, bad));
            }
            assert_eq!(r, Some(Reason::Descheduled));
            t += Duration::from_secs(2);
        }
        assert_eq!(c.level, MAX_LEVEL);
        assert_eq!(c.period(), BACKOFF_BASE * (1 << MAX_LEVEL));
        assert!(matches!(c.admit(t, US * 10, false), Verdict::Poll(_)));
        for _ in 0..CLEAN_RUN * 3 {
            assert_eq!(c.observe(t, clean(10)), None);
        }
        assert_eq!(c.level, MAX_LEVEL - 3);
    }
}
