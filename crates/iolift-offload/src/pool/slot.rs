//! Completion slots and waiting: a slot is completed once by a processing
//! element and waited on by the submitter (blocking, or as a future). Both
//! waits in the pool spin briefly before they park (`IOLIFT_POOL_SPIN_US`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long a waiter spins (then yields) before it parks:
/// `IOLIFT_POOL_SPIN_US`, else 200 us on machines with 8 or more cores and
/// 0 (park at once) on smaller ones, where a spinning waiter would take the
/// core that the thread it waits for needs.
fn spin_budget() -> Duration {
    static S: OnceLock<Duration> = OnceLock::new();
    *S.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Duration::from_micros(
            std::env::var("IOLIFT_POOL_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if cores >= 8 { 200 } else { 0 }),
        )
    })
}

/// Spin (first busy, then yielding the CPU) until `ready()` or the spin
/// budget is used up; whether `ready()` became true.
pub(super) fn spin_until(ready: impl Fn() -> bool) -> bool {
    let budget = spin_budget();
    if budget.is_zero() {
        return ready();
    }
    let t0 = Instant::now();
    let mut i = 0u32;
    loop {
        if ready() {
            return true;
        }
        i = i.wrapping_add(1);
        if i < 512 {
            std::hint::spin_loop();
        } else {
            if i.is_multiple_of(16) && t0.elapsed() >= budget {
                return ready();
            }
            if i.is_multiple_of(4) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

struct SlotState<T> {
    result: Option<T>,
    waker: Option<Waker>,
    sleeping: bool,
}

pub(super) struct Slot<T> {
    done: AtomicBool,
    state: Mutex<SlotState<T>>,
    cv: Condvar,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            done: AtomicBool::new(false),
            state: Mutex::new(SlotState {
                result: None,
                waker: None,
                sleeping: false,
            }),
            cv: Condvar::new(),
        }
    }
}

impl<T> Slot<T> {
    pub(super) fn complete(&self, r: T) {
        let mut g = self.state.lock().expect("slot lock");
        g.result = Some(r);
        self.done.store(true, Ordering::Release);
        let waker = g.waker.take();
        let sleeping = g.sleeping;
        drop(g);
        if let Some(w) = waker {
            w.wake();
        }
        if sleeping {
            self.cv.notify_all();
        }
    }

    /// Block until completed (spins briefly, then parks).
    pub(super) fn wait(&self) -> T {
        spin_until(|| self.done.load(Ordering::Acquire));
        let mut g = self.state.lock().expect("slot lock");
        loop {
            if let Some(r) = g.result.take() {
                return r;
            }
            g.sleeping = true;
            g = self.cv.wait(g).expect("slot lock");
            g.sleeping = false;
        }
    }

    pub(super) fn poll(&self, cx: &mut Context<'_>) -> Poll<T> {
        let mut g = self.state.lock().expect("slot lock");
        if let Some(r) = g.result.take() {
            return Poll::Ready(r);
        }
        g.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
