//! Judging poll mode by its own result (`serve --poll-us auto`): per
//! connection, whether waiting for requests by polling makes the
//! connection's request cycle shorter than sleeping in epoll does.
//!
//! A request cycle is the time from one wait for a request to the next
//! (`Polled::at_boundary` to `Polled::at_boundary`): the wait for the
//! client, the request's service and the write of its reply. At queue
//! depth 1 it is the client's round trip, so it also shows what a
//! polling reader costs the client (on a 2-core machine the poller holds
//! the core the client could run on). Nothing else needs to be guessed:
//! polling pays exactly when it makes cycles shorter.
//!
//! The judge runs the connection in windows of [`WINDOW`] cycles, each
//! either polled or not, and keeps each window's typical cycle: the mean
//! of its cycles, leaving out only those longer than [`PAUSE_FACTOR`]
//! times the window's median (a client that pauses now and then does not
//! count; the longer cycles a poller causes, a client kept off its core
//! for a poll budget of a few typical cycles, do, all of them). A probe is [`PAIRS`] pairs of
//! windows, unpolled and polled alternately, so that drift in the
//! machine's load hits both modes alike; polling wins when the sum of its
//! windows' figures is below the unpolled sum by more than 1/[`MARGIN`]. The
//! winner then runs alone for a hold of [`HOLD_MIN`] windows, doubling
//! (up to [`HOLD_MAX`]) each time a probe confirms it, back to the
//! minimum when a probe overturns it; then it probes again. A connection
//! starts with a probe.
//!
//! A cycle the reader did not run in the window's mode (the controller of
//! `nbd/adapt.rs` refused to poll, a burst of requests, a full
//! `SpinGate`) is not counted: [`Judge::void`].
//!
//! Pure over the times it is given, so its decisions are unit-tested with
//! made-up cycles. State: fixed arrays, no allocation.

use std::time::{Duration, Instant};

/// Cycles per window.
pub const WINDOW: usize = 32;
/// Pairs of windows (unpolled, polled) per probe.
pub const PAIRS: usize = 3;
/// Polling must make cycles shorter by more than 1/MARGIN to win: a
/// clear win only, since a polling reader also spends a core and the
/// default must not be worse than not polling.
pub const MARGIN: u64 = 5;
/// Windows a winner runs alone after its first win.
pub const HOLD_MIN: u32 = 16;
/// Longest hold, in windows (with 32 cycles of 30 us, about half a second).
pub const HOLD_MAX: u32 = 512;
/// Cycles longer than this count as this long (an idle client).
const CYCLE_CAP: Duration = Duration::from_millis(10);
/// A cycle longer than this many times its window's median is a pause of
/// the client's, not a cost of the window's mode, and is left out.
pub const PAUSE_FACTOR: u64 = 8;

/// How a window waits for requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Unpolled,
    Polled,
}

impl Mode {
    fn other(self) -> Mode {
        match self {
            Mode::Unpolled => Mode::Polled,
            Mode::Polled => Mode::Unpolled,
        }
    }
}

/// What the last finished probe measured (for the metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeResult {
    /// Typical cycle of the probe's unpolled windows (their mean),
    /// nanoseconds.
    pub unpolled_ns: u64,
    /// The same for the polled windows.
    pub polled_ns: u64,
    /// Polling won.
    pub polled_wins: bool,
}

/// One connection's judge.
#[derive(Debug, Clone)]
pub struct Judge {
    /// The current window's mode.
    mode: Mode,
    /// Probing: the index of the current window in the probe.
    probe_at: Option<usize>,
    /// Windows left in the current hold.
    hold: u32,
    /// The next hold's length if the next probe confirms the winner.
    hold_len: u32,
    /// The last winner.
    winner: Mode,
    /// Cycle times of the current window, nanoseconds.
    win: [u32; WINDOW],
    n: usize,
    /// Typical cycles of the probe's windows, in order (even: unpolled).
    probe: [u32; 2 * PAIRS],
    /// Since when the current cycle runs, when it counts.
    since: Option<Instant>,
    /// The last probe's result.
    last: Option<ProbeResult>,
    /// Probes finished.
    probes: u64,
}

impl Default for Judge {
    fn default() -> Self {
        Self::new()
    }
}

impl Judge {
    pub fn new() -> Self {
        Judge {
            mode: Mode::Unpolled,
            probe_at: Some(0),
            hold: 0,
            hold_len: HOLD_MIN,
            winner: Mode::Unpolled,
            win: [0; WINDOW],
            n: 0,
            probe: [0; 2 * PAIRS],
            since: None,
            last: None,
            probes: 0,
        }
    }

    /// A new cycle starts at `now` (the reader waits for a request): the
    /// one before it, if it counted, is recorded. Returns how this cycle
    /// waits.
    pub fn start(&mut self, now: Instant) -> Mode {
        if let Some(t0) = self.since.take() {
            let d = now.saturating_duration_since(t0).min(CYCLE_CAP);
            self.win[self.n] = d.as_nanos() as u32;
            self.n += 1;
            if self.n == WINDOW {
                self.next_window();
            }
        }
        self.since = Some(now);
        self.mode
    }

    /// The current cycle did not run in its window's mode: not counted.
    pub fn void(&mut self) {
        self.since = None;
    }

    /// The current window's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The last finished probe, if any.
    pub fn last_probe(&self) -> Option<ProbeResult> {
        self.last
    }

    /// How many probes have finished.
    pub fn probes(&self) -> u64 {
        self.probes
    }

    fn next_window(&mut self) {
        let med = typical(&mut self.win);
        self.n = 0;
        match self.probe_at {
            Some(i) => {
                self.probe[i] = med;
                if i + 1 < self.probe.len() {
                    self.probe_at = Some(i + 1);
                    self.mode = self.mode.other();
                } else {
                    self.decide();
                }
            }
            None => {
                self.hold = self.hold.saturating_sub(1);
                if self.hold == 0 {
                    self.probe_at = Some(0);
                    self.mode = Mode::Unpolled;
                }
            }
        }
    }

    fn decide(&mut self) {
        let (mut u, mut p) = (0u64, 0u64);
        for (i, m) in self.probe.iter().enumerate() {
            if i % 2 == 0 {
                u += *m as u64;
            } else {
                p += *m as u64;
            }
        }
        let polled_wins = p * MARGIN < u * (MARGIN - 1);
        let winner = if polled_wins {
            Mode::Polled
        } else {
            Mode::Unpolled
        };
        if winner == self.winner && self.last.is_some() {
            self.hold_len = (self.hold_len * 2).min(HOLD_MAX);
        } else {
            self.hold_len = HOLD_MIN;
        }
        self.winner = winner;
        self.hold = self.hold_len;
        self.probe_at = None;
        self.mode = winner;
        self.probes += 1;
        self.last = Some(ProbeResult {
            unpolled_ns: u / PAIRS as u64,
            polled_ns: p / PAIRS as u64,
            polled_wins,
        });
    }
}

/// A window's typical cycle: the mean of its cycles up to
/// [`PAUSE_FACTOR`] times its median (sorts it). Until 2026-11-25 it was
/// the mean of the shortest 7/8, which dropped the four longest cycles of
/// every window: exactly where a poller that keeps the client off its core
/// shows, so polling won probes it lost in the client's IOPS.
fn typical(w: &mut [u32; WINDOW]) -> u32 {
    w.sort_unstable();
    let limit = w[WINDOW / 2] as u64 * PAUSE_FACTOR;
    let (sum, n) = w
        .iter()
        .map(|&x| x as u64)
        .take_while(|&x| x <= limit)
        .fold((0u64, 0u64), |(s, n), x| (s + x, n + 1));
    (sum / n.max(1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);
    const W: usize = WINDOW;
    const PROBE: usize = 2 * PAIRS * WINDOW;
    const HOLD: usize = HOLD_MIN as usize * WINDOW;

    /// A judge whose first cycle starts at `t`.
    fn judge(t: Instant) -> Judge {
        let mut j = Judge::new();
        assert_eq!(
            j.start(t),
            Mode::Unpolled,
            "a connection starts with a probe"
        );
        j
    }

    /// Runs `n` cycles of `unpolled` or `polled` microseconds, each in the
    /// mode the judge chose for it and ended by the next one's start, with
    /// a 5 ms pause every 8th cycle (an idle client, which the windows'
    /// figures must ignore). Returns each cycle's mode.
    fn cycles(j: &mut Judge, t: &mut Instant, n: usize, unpolled: u64, polled: u64) -> Vec<Mode> {
        let mut modes = Vec::with_capacity(n);
        for k in 0..n {
            let m = j.mode();
            modes.push(m);
            let us = match m {
                Mode::Unpolled => unpolled,
                Mode::Polled => polled,
            };
            *t += US * us as u32;
            if k % 8 == 7 {
                *t += US * 5000;
            }
            j.start(*t);
        }
        modes
    }

    fn all(m: &[Mode], want: Mode) -> bool {
        m.iter().all(|x| *x == want)
    }

    /// A probe: windows alternate, unpolled first, a mode per window.
    fn is_probe(m: &[Mode]) -> bool {
        m.chunks(W).enumerate().all(|(i, c)| {
            all(
                c,
                if i % 2 == 0 {
                    Mode::Unpolled
                } else {
                    Mode::Polled
                },
            )
        })
    }

    #[test]
    fn polling_that_wins_keeps_polling_and_the_hold_grows() {
        let mut t = Instant::now();
        let mut j = judge(t);
        assert!(is_probe(&cycles(&mut j, &mut t, PROBE, 40, 25)));
        let r = j.last_probe().expect("probe finished");
        assert!(r.polled_wins);
        assert_eq!((r.unpolled_ns, r.polled_ns), (40_000, 25_000));
        // held for HOLD_MIN windows, then probes again
        assert!(all(&cycles(&mut j, &mut t, HOLD, 40, 25), Mode::Polled));
        assert!(is_probe(&cycles(&mut j, &mut t, PROBE, 40, 25)));
        // confirmed: the hold doubles
        assert!(all(&cycles(&mut j, &mut t, 2 * HOLD, 40, 25), Mode::Polled));
        assert!(all(&cycles(&mut j, &mut t, W, 40, 25), Mode::Unpolled));
    }

    #[test]
    fn polling_that_does_not_win_by_the_margin_is_dropped() {
        // 15% shorter cycles are within the margin: unpolled wins
        let mut t = Instant::now();
        let mut j = judge(t);
        assert!(is_probe(&cycles(&mut j, &mut t, PROBE, 40, 34)));
        assert!(!j.last_probe().unwrap().polled_wins);
        assert!(all(&cycles(&mut j, &mut t, HOLD, 40, 34), Mode::Unpolled));
        // 25% shorter: polling wins
        let mut j = judge(t);
        cycles(&mut j, &mut t, PROBE, 40, 30);
        assert!(j.last_probe().unwrap().polled_wins);
        // slower polling: unpolled
        let mut j = judge(t);
        cycles(&mut j, &mut t, PROBE, 30, 45);
        assert!(!j.last_probe().unwrap().polled_wins);
        assert!(all(&cycles(&mut j, &mut t, HOLD, 30, 45), Mode::Unpolled));
    }

    #[test]
    fn a_pollers_long_cycles_count_in_full() {
        // Polled cycles are 25 us, but every 8th one 150 us (the client
        // kept off its core for a poll budget): a mean of 40.6 us against
        // 40 us unpolled, so polling must lose, though the shortest 7/8
        // of its cycles look much faster.
        let mut t = Instant::now();
        let mut j = judge(t);
        let mut k = 0u32;
        while j.probes() == 0 {
            let us = match j.mode() {
                Mode::Unpolled => 40,
                Mode::Polled => {
                    k += 1;
                    if k.is_multiple_of(8) {
                        150
                    } else {
                        25
                    }
                }
            };
            t += US * us;
            j.start(t);
        }
        let r = j.last_probe().unwrap();
        assert!(!r.polled_wins, "{r:?}");
        assert_eq!(r.polled_ns, 40_625);
        // a client's pause (far past 8 typical cycles) is still left out
        let mut w = [25_000u32; WINDOW];
        w[3] = 5_000_000;
        assert_eq!(typical(&mut w), 25_000);
    }

    #[test]
    fn a_change_of_winner_is_found_by_the_next_probe() {
        let mut t = Instant::now();
        let mut j = judge(t);
        cycles(&mut j, &mut t, PROBE, 40, 20);
        assert!(j.last_probe().unwrap().polled_wins);
        // two confirmations: the hold grows to 4x
        cycles(&mut j, &mut t, HOLD + PROBE + 2 * HOLD + PROBE, 40, 20);
        assert!(all(&cycles(&mut j, &mut t, 4 * HOLD, 40, 20), Mode::Polled));
        // the machine gets busy: polling now costs the client its core
        assert!(is_probe(&cycles(&mut j, &mut t, PROBE, 40, 90)));
        assert!(!j.last_probe().unwrap().polled_wins);
        // the hold is back at its minimum
        assert!(all(&cycles(&mut j, &mut t, HOLD, 40, 90), Mode::Unpolled));
        // and a change back is found by the next probe
        assert!(is_probe(&cycles(&mut j, &mut t, PROBE, 40, 20)));
        assert!(j.last_probe().unwrap().polled_wins);
    }

    #[test]
    fn void_cycles_are_not_counted() {
        let mut t = Instant::now();
        let mut j = judge(t);
        assert!(all(&cycles(&mut j, &mut t, W, 40, 20), Mode::Unpolled));
        // polled cycles that did not poll (the controller said no) are
        // long; voided, they must not make polling look slow
        let mut n = 0;
        while j.mode() == Mode::Polled {
            n += 1;
            assert!(n < 10 * W, "the polled window never ended");
            if n % 2 == 0 {
                t += US * 500;
                j.void();
            } else {
                t += US * 20;
            }
            j.start(t);
        }
        assert_eq!(n, 2 * W - 1, "voided cycles counted");
        // the unpolled window has begun: finish the probe
        cycles(&mut j, &mut t, PROBE - 2 * W, 40, 20);
        let r = j.last_probe().expect("probe finished");
        assert_eq!(r.polled_ns, 20_000);
        assert!(r.polled_wins);
    }
}
