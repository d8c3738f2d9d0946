//! The inline mode of the engine ([`super::Config::inline`]): no engine
//! thread; the caller that submits puts its requests into the ring, enters
//! the kernel once to submit them and wait for all their completions, and
//! reaps them itself. One system call per request or batch and no thread
//! hand-off, which is what a single-threaded caller at queue depth 1 (a
//! latency loop, AccelFS, the key-value store) wants. Callers on several
//! threads take turns: the ring is behind a mutex held for a whole batch,
//! so the engine does not overlap requests of different callers.
//!
//! With [`super::Config::spin_us`] the caller first spins on the
//! completion ring for up to that long before it sleeps in the kernel:
//! it submits without waiting (under SQPOLL, while the kernel's polling
//! thread is awake, that is no system call at all), then reads the
//! completion ring in a loop, and only when the time is up with requests
//! still out does it enter the kernel to wait for them. That trades a
//! busy CPU for the wake-up (and, under SQPOLL, the system call) a
//! sleeping waiter pays per request. The spin adapts: it lasts as long
//! as recent requests took to complete, plus a margin (a half and
//! 5 us), at most `spin_us`; when recent requests took longer than
//! `spin_us` (a slow device, large requests) the caller sleeps at once.
//! Its CPU cost is about the request's latency: the caller's CPU is busy
//! until the completion arrives.
//!
//! [`InlineRing::start`] submits requests without waiting for them (a
//! write-back that goes on while the caller works): they stay in the ring,
//! their completions are reaped by whichever later call finds them, and
//! [`InlineRing::wait_started`] waits for all of them. Their callbacks run
//! when a call returns them, after it released the ring.

use super::{build, sync_now, Callback, Done, Op, Shared};
use crate::buf::{Buf, FixedPool};
use crate::target::Target;
use io_uring::IoUring;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The ring, owned by whichever caller holds the engine's mutex.
pub(super) struct InlineRing {
    pub ring: IoUring,
    pub target: Arc<Target>,
    /// Keeps the registered memory alive as long as the ring (dropped
    /// after it: fields drop in order).
    pub _pool: Option<Arc<FixedPool>>,
    pub iopoll: bool,
    /// Spin on the completion ring this long before sleeping (None: sleep
    /// in `io_uring_enter` at once).
    pub spin: Option<Duration>,
    pub sqpoll: bool,
    /// Recent time from submitting a group to reaping its last
    /// completion, with spinning on (a moving average, 1/8 weight to the
    /// newest; zero before the first).
    pub spin_est: Duration,
    /// Requests started and not yet completed, by slot (their user data
    /// is `STARTED | slot`).
    pub started: Vec<Option<(Callback, Option<Buf>)>>,
    /// How many of `started` are out.
    pub started_out: usize,
    /// Started requests completed, their callbacks not yet run.
    pub finished: Vec<(Callback, Done)>,
}

/// User-data bit of a started request's completion.
const STARTED: u64 = 1 << 63;

impl InlineRing {
    /// Runs `ops` to completion: as many as the submission queue holds at
    /// a time, one `io_uring_enter` per such group. Returns each request's
    /// callback with its completion, in the order given; the caller runs
    /// them once it released the ring.
    pub fn run(&mut self, shared: &Shared, ops: Vec<(Op, Callback)>) -> Vec<(Callback, Done)> {
        let mut out: Vec<Option<(Callback, Done)>> = Vec::with_capacity(ops.len());
        let cap = self.ring.params().sq_entries() as usize;
        // (index in `out`, callback, buffer) of the requests in the ring.
        let mut in_ring: Vec<(usize, Option<Callback>, Option<Buf>)> = Vec::new();
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            in_ring.clear();
            for (op, cb) in ops.by_ref() {
                let i = out.len();
                out.push(None);
                match build(op, self.iopoll) {
                    Ok((sqe, buf)) => {
                        let sqe = sqe.user_data(in_ring.len() as u64);
                        // SAFETY: the entry's buffer stays in `in_ring`
                        // until its completion is reaped below.
                        let pushed = unsafe { self.ring.submission().push(&sqe) };
                        debug_assert!(pushed.is_ok(), "at most sq_entries per group");
                        in_ring.push((i, Some(cb), buf));
                    }
                    Err((res, buf, flush)) => {
                        // Not for the ring: an invalid request, or a flush
                        // on an IOPOLL ring (fdatasync after the writes
                        // already in the ring complete).
                        if flush && !in_ring.is_empty() {
                            submit_and_reap(self, shared, &mut in_ring, &mut out);
                        }
                        let res = if flush { sync_now(&self.target) } else { res };
                        out[i] = Some((cb, Done { res, buf }));
                    }
                }
                if in_ring.len() == cap {
                    break;
                }
            }
            if !in_ring.is_empty() {
                shared
                    .count
                    .max_batch
                    .fetch_max(in_ring.len() as u64, Ordering::Relaxed);
                submit_and_reap(self, shared, &mut in_ring, &mut out);
            }
        }
        let mut done: Vec<(Callback, Done)> = out
            .into_iter()
            .map(|x| x.expect("every request completed"))
            .collect();
        done.append(&mut self.finished);
        done
    }

    /// Submits `ops` without waiting for them; returns the callbacks of
    /// requests that completed meanwhile (started ones included), to run
    /// once the ring is released. At most half the completion queue's
    /// worth is out at a time: past that, this waits for earlier ones.
    pub fn start(&mut self, shared: &Shared, ops: Vec<(Op, Callback)>) -> Vec<(Callback, Done)> {
        let cap = self.ring.params().sq_entries() as usize;
        for (op, cb) in ops {
            while self.started_out >= cap / 2 {
                self.wait_some(shared);
            }
            match build(op, self.iopoll) {
                Ok((sqe, buf)) => {
                    let slot = match self.started.iter().position(Option::is_none) {
                        Some(i) => i,
                        None => {
                            self.started.push(None);
                            self.started.len() - 1
                        }
                    };
                    let sqe = sqe.user_data(STARTED | slot as u64);
                    // SAFETY: the entry's buffer stays in `started` until
                    // its completion is reaped.
                    while unsafe { self.ring.submission().push(&sqe) }.is_err() {
                        self.enter(shared, 0);
                    }
                    self.started[slot] = Some((cb, buf));
                    self.started_out += 1;
                }
                Err((res, buf, flush)) => {
                    let res = if flush {
                        self.wait_all(shared);
                        sync_now(&self.target)
                    } else {
                        res
                    };
                    self.finished.push((cb, Done { res, buf }));
                }
            }
        }
        // Submits without waiting (under SQPOLL the crate enters only to
        // wake the polling thread).
        self.enter(shared, 0);
        std::mem::take(&mut self.finished)
    }

    /// Waits until every started request completed; returns the callbacks
    /// to run.
    pub fn wait_started(&mut self, shared: &Shared) -> Vec<(Callback, Done)> {
        self.wait_all(shared);
        std::mem::take(&mut self.finished)
    }

    fn wait_all(&mut self, shared: &Shared) {
        while self.started_out > 0 {
            self.wait_some(shared);
        }
    }

    /// Enters the kernel to wait for at least one completion and reaps.
    fn wait_some(&mut self, shared: &Shared) {
        reap_started_only(self);
        if self.started_out > 0 {
            self.enter(shared, 1);
            reap_started_only(self);
        }
    }

    /// One `io_uring_enter` that submits what is queued and waits for
    /// `want` completions.
    fn enter(&mut self, shared: &Shared, want: usize) {
        shared.count.enters.fetch_add(1, Ordering::Relaxed);
        match self.ring.submit_and_wait(want) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {}
            Err(e) => panic!("io_uring_enter on {}: {e}", self.target.path().display()),
        }
    }
}

impl Drop for InlineRing {
    /// Waits for started requests: the kernel may still be using their
    /// buffers.
    fn drop(&mut self) {
        while self.started_out > 0 {
            let _ = self.ring.submit_and_wait(1);
            reap_started_only(self);
        }
    }
}

/// Reaps completions when no request of a group is in the ring (only
/// started ones can complete).
fn reap_started_only(r: &mut InlineRing) {
    let n = reap(r, &mut [], &mut []);
    debug_assert_eq!(n, 0, "no group in the ring");
}

/// Submits the requests in the ring, waits for all of them and moves their
/// completions into `out`.
fn submit_and_reap(
    r: &mut InlineRing,
    shared: &Shared,
    in_ring: &mut Vec<(usize, Option<Callback>, Option<Buf>)>,
    out: &mut [Option<(Callback, Done)>],
) {
    let mut left = in_ring.len();
    let submitted = Instant::now();
    // No spin (none asked for, or recent requests took longer than the
    // cap): one enter below submits and waits.
    let spin = r
        .spin
        .map_or(Duration::ZERO, |cap| spin_window(r.spin_est, cap));
    if !spin.is_zero() {
        // Submit without waiting: no system call under SQPOLL while its
        // thread is awake (the io_uring crate enters only to wake it).
        if !r.sqpoll || r.ring.submission().need_wakeup() {
            shared.count.enters.fetch_add(1, Ordering::Relaxed);
        }
        loop {
            match r.ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // Busy: the wait below submits what is left.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
                    break
                }
                Err(e) => panic!("io_uring_enter on {}: {e}", r.target.path().display()),
            }
        }
        let t0 = Instant::now();
        let mut polls = 0u32;
        while left > 0 {
            left -= reap(r, in_ring, out);
            polls = polls.wrapping_add(1);
            // Reading the clock costs more than reading the ring.
            if left > 0 && polls.is_multiple_of(32) && t0.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
    }
    while left > 0 {
        shared.count.enters.fetch_add(1, Ordering::Relaxed);
        match r.ring.submit_and_wait(left) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            // The completion queue is full: the reap below makes room.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {}
            // As on the engine's thread: the ring itself failed (a bug,
            // not bad input), and the kernel may still own the buffers.
            Err(e) => panic!("io_uring_enter on {}: {e}", r.target.path().display()),
        }
        left -= reap(r, in_ring, out);
    }
    if r.spin.is_some() {
        let took = submitted.elapsed();
        r.spin_est = match r.spin_est.is_zero() {
            true => took,
            false => (r.spin_est * 7 + took) / 8,
        };
    }
    in_ring.clear();
}

/// How long to spin for a group, given the recent completion time `est`
/// and the most the caller allows, `cap`: all of `cap` before anything
/// is known, nothing when recent groups took longer than `cap`, else
/// `est` and a margin, at most `cap`.
fn spin_window(est: Duration, cap: Duration) -> Duration {
    if est.is_zero() {
        cap
    } else if est > cap {
        Duration::ZERO
    } else {
        (est + est / 2 + Duration::from_micros(5)).min(cap)
    }
}

/// Moves the completions in the ring into `out`; returns how many.
fn reap(
    r: &mut InlineRing,
    in_ring: &mut [(usize, Option<Callback>, Option<Buf>)],
    out: &mut [Option<(Callback, Done)>],
) -> usize {
    let mut n = 0;
    for c in r.ring.completion() {
        if c.user_data() & STARTED != 0 {
            let slot = (c.user_data() & !STARTED) as usize;
            let (cb, buf) = r.started[slot]
                .take()
                .expect("one completion per started request");
            r.started_out -= 1;
            r.finished.push((
                cb,
                Done {
                    res: c.result(),
                    buf,
                },
            ));
            continue;
        }
        let (i, cb, buf) = &mut in_ring[c.user_data() as usize];
        let cb = cb.take().expect("one completion per request");
        out[*i] = Some((
            cb,
            Done {
                res: c.result(),
                buf: buf.take(),
            },
        ));
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::spin_window;
    use std::time::Duration;

    #[test]
    fn spin_follows_recent_completions_within_the_cap() {
        let us = Duration::from_micros;
        // Nothing known yet: the whole cap.
        assert_eq!(spin_window(Duration::ZERO, us(200)), us(200));
        // Recent requests took 40 us: 40 + 20 + 5.
        assert_eq!(spin_window(us(40), us(200)), us(65));
        // Near the cap: the cap.
        assert_eq!(spin_window(us(180), us(200)), us(200));
        // Slower than the cap: sleep at once.
        assert_eq!(spin_window(us(250), us(200)), Duration::ZERO);
    }
}
