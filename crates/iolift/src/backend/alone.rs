//! Whether a request is alone on its device (or on a qcow2 data path), so
//! that the thread that read it off the connection may run it itself
//! instead of handing it to another thread and being woken for the answer.
//!
//! At queue depth 1 that hand-off is a thread wake-up each way on top of
//! the device's own wait; running the request on the reading thread leaves
//! one sleep (in the device wait) per request. At depth it would serialize
//! requests the device could run together, so a request runs inline only
//! when it is alone: nothing else of the device in flight, and it did not
//! arrive right after the previous one was answered. The second half tells
//! a client at queue depth 1 (its next request comes a network round trip
//! after the reply) from requests that were already waiting in the
//! connection's buffer while the previous one ran (which would otherwise
//! each find the device idle, one after the other, and be served one at a
//! time). Such a request also keeps the device off the inline path for
//! [`DEPTH_HOLD`], so that a thread delayed between two requests (a busy
//! machine) does not make a client at depth look like one at depth 1.
//!
//! Used by the file backend (`file.rs`, engine=threads) and by the qcow2
//! backend's io_uring engine (`qcow2/uring.rs`, one gate per data path).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// After a request that found the device idle but came right after the
/// previous answer (so it had been waiting behind it), no request runs
/// inline for this long: the client is at depth.
pub const DEPTH_HOLD: Duration = Duration::from_millis(1);

/// The in-flight count and timing of one device or data path.
pub struct Alone {
    in_flight: AtomicUsize,
    /// When the last request was answered, in ns since `base`.
    last_done: AtomicU64,
    /// No inline request before this time (ns since `base`).
    hold_until: AtomicU64,
    base: Instant,
    /// How long the device must have been idle (None: never inline).
    gap: Option<Duration>,
}

impl Alone {
    /// `gap`: a request finding the device idle runs inline only if the
    /// device has been idle at least this long (None: never).
    pub fn new(gap: Option<Duration>) -> Self {
        Alone {
            in_flight: AtomicUsize::new(0),
            last_done: AtomicU64::new(0),
            hold_until: AtomicU64::new(0),
            base: Instant::now(),
            gap,
        }
    }

    /// Whether requests may run inline at all (a gap was given).
    pub fn enabled(&self) -> bool {
        self.gap.is_some()
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Counts a request in at `now`; true if it is alone (run it on this
    /// thread). Every `enter` must be followed by one [`Alone::leave`]
    /// once the request is answered.
    pub fn enter(&self, now: Instant) -> bool {
        let before = self.in_flight.fetch_add(1, Ordering::Acquire);
        let Some(g) = self.gap else {
            return false;
        };
        if before != 0 {
            return false;
        }
        let now = self.ns(now);
        if now.saturating_sub(self.last_done.load(Ordering::Relaxed)) < g.as_nanos() as u64 {
            self.hold_until
                .store(now + DEPTH_HOLD.as_nanos() as u64, Ordering::Relaxed);
            false
        } else {
            now >= self.hold_until.load(Ordering::Relaxed)
        }
    }

    /// Counts a request out, after its answer was given.
    pub fn leave(&self) {
        self.last_done
            .store(self.ns(Instant::now()), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// Counts a request out of its [`Alone`] when dropped: after it has run,
/// or when it never will (a future dropped before it was polled).
pub struct Leave(pub Arc<Alone>);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_only_when_idle_long_enough() {
        // a long gap, so that a descheduled test thread cannot turn
        // "right after the answer" into "idle long enough"
        let gap = Duration::from_secs(1);
        let a = Alone::new(Some(gap));
        let late = |d: Duration| Instant::now() + d;
        assert!(a.enter(late(2 * gap)), "first request on an idle device");
        assert!(!a.enter(late(2 * gap)), "a second one while the first runs");
        a.leave();
        a.leave();
        // right after an answer: at depth, and held off for DEPTH_HOLD
        assert!(!a.enter(Instant::now()));
        a.leave();
        assert!(
            a.enter(late(2 * gap + DEPTH_HOLD)),
            "idle again long enough"
        );
        a.leave();
        let never = Alone::new(None);
        assert!(!never.enter(late(2 * gap)));
        never.leave();
    }
}
