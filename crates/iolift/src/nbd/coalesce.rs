//! Request coalescing at deep queue depths (`serve --coalesce-us N`, 50 us
//! by default, 0 turns it off).
//!
//! A client that keeps many requests in flight (fio at iodepth 32) sends
//! them one by one as it reads our replies. Reading each as it comes costs
//! the server a receive, a reply write and an epoll wait per one or two
//! requests, and costs the client a wake-up of the server for most sends.
//! While the client still has many of our replies to read, nothing is lost
//! by reading its next requests a little later: it is busy anyway. So,
//! having written a burst's replies, the reader looks at how many replies
//! the client has not read yet, and with at least [`MIN_BACKLOG`] unread
//! it sleeps a moment before reading again, and then finds a larger batch
//! of requests waiting.
//!
//! Counting unread replies: `SIOCOUTQ` on a unix socket gives the memory
//! of the buffers the peer has not finished reading, each write's bytes
//! plus some 600-1200 bytes of overhead per buffer (measured on this
//! kernel: 16 bytes count as 768). The reader remembers its last writes
//! (bytes, replies) and, newest first, counts the replies of those whose
//! bytes plus a generous overhead (`est_mem`) fit in that figure. The
//! count errs low: the oldest, partly read write is left out.
//!
//! The pause tunes itself, in the spirit of DeLiBA's scheduler, which holds
//! a request for at most half the observed latency: it grows by [`STEP`]
//! (up to the maximum) after a pause that left the client at least half of
//! [`MIN_BACKLOG`] replies still to read, and halves after one that left it
//! fewer, so the client never runs dry while the server sleeps. At low
//! queue depth the backlog is never reached and nothing changes.
//!
//! The pause is a sleep on the worker thread (timer slack lowered to 1 us
//! on that thread, or a 5 us sleep would last 55): it holds the worker like
//! a poll does, so it takes a place in the [`SpinGate`] and is skipped when
//! none is free. On TCP `SIOCOUTQ` counts bytes not yet acknowledged, which
//! on loopback is nearly always zero: coalescing then stays off by itself.
//!
//! Used by the reader (`reader.rs`), one [`Coalesce`] per connection: it
//! reports each reply it encodes ([`Coalesce::replied`]) and each batch it
//! writes ([`Coalesce::wrote`]), and calls [`Coalesce::pause`] before it
//! waits for the socket after a burst. Replies written by the writer task
//! or from a device's threads are not counted.

use super::poll::SpinGate;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::Duration;

/// Unread replies needed before a pause.
pub const MIN_BACKLOG: usize = 12;
/// Growth of the pause per pause that left the client busy.
pub const STEP: Duration = Duration::from_micros(5);
/// Longest pause accepted for `--coalesce-us`.
pub const MAX_PAUSE: Duration = Duration::from_millis(1);

/// Writes remembered for counting unread replies.
const WRITES: usize = 64;

/// An upper estimate of the socket memory a write of `bytes` takes until
/// the peer has read it all: the bytes plus 1 KiB per 32 KiB started.
fn est_mem(bytes: usize) -> usize {
    bytes + 1024 * (1 + bytes / 32768)
}

/// Socket memory held by what was written to `fd` and not yet read.
fn unread_bytes(fd: RawFd) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    (r == 0 && n >= 0).then_some(n as usize)
}

fn precise_sleep(d: Duration) {
    thread_local!(static SLACK_SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    SLACK_SET.with(|s| {
        if !s.get() {
            // SAFETY: PR_SET_TIMERSLACK takes a value in nanoseconds and
            // only affects this thread's timers.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
            s.set(true);
        }
    });
    std::thread::sleep(d);
}

/// One connection's coalescing state.
pub struct Coalesce {
    max: Duration,
    delay: Duration,
    /// Replies encoded since the last write: (bytes, count).
    pending: (usize, usize),
    /// The last writes, newest at the back: (est_mem, replies).
    writes: VecDeque<(usize, usize)>,
    /// Pauses taken (read by the tests).
    pub pauses: u64,
}

impl Coalesce {
    pub fn new(max: Duration) -> Self {
        Coalesce {
            max: max.min(MAX_PAUSE),
            delay: Duration::ZERO,
            pending: (0, 0),
            writes: VecDeque::with_capacity(WRITES),
            pauses: 0,
        }
    }

    /// The reader encoded a reply of `bytes` (header and data).
    pub fn replied(&mut self, bytes: usize) {
        self.pending.0 += bytes;
        self.pending.1 += 1;
    }

    /// The reader wrote the replies encoded since the last call.
    pub fn wrote(&mut self) {
        if self.pending.1 == 0 {
            return;
        }
        if self.writes.len() == WRITES {
            self.writes.pop_front();
        }
        self.writes
            .push_back((est_mem(self.pending.0), self.pending.1));
        self.pending = (0, 0);
    }

    /// Replies the client has surely not read, given `unread` socket
    /// memory.
    fn backlog(&self, unread: Option<usize>) -> usize {
        let Some(mut left) = unread else {
            return 0;
        };
        let mut n = 0;
        for &(mem, replies) in self.writes.iter().rev() {
            if mem > left {
                break;
            }
            left -= mem;
            n += replies;
        }
        n
    }

    /// How long to pause, given the bytes the client has not read;
    /// `None`: read at once.
    fn plan(&mut self, unread: Option<usize>) -> Option<Duration> {
        if self.max.is_zero() {
            return None;
        }
        if self.backlog(unread) < MIN_BACKLOG {
            self.shrink();
            return None;
        }
        if self.delay.is_zero() {
            self.delay = STEP.min(self.max);
        }
        Some(self.delay)
    }

    /// After a pause: the bytes the client had still not read.
    fn judge(&mut self, unread: Option<usize>) {
        if self.backlog(unread) >= MIN_BACKLOG / 2 {
            self.delay = (self.delay + STEP).min(self.max);
        } else {
            self.shrink();
        }
    }

    fn shrink(&mut self) {
        self.delay /= 2;
        if self.delay < STEP {
            self.delay = Duration::ZERO;
        }
    }

    /// Called by the reader after it wrote a burst's replies and before it
    /// waits for the socket `fd` again: pauses if the client is busy with
    /// enough of our replies.
    pub fn pause(&mut self, fd: RawFd, gate: &SpinGate) {
        if self.max.is_zero() {
            return;
        }
        let Some(d) = self.plan(unread_bytes(fd)) else {
            return;
        };
        let Some(_ticket) = gate.enter() else {
            return;
        };
        precise_sleep(d);
        self.pauses += 1;
        self.judge(unread_bytes(fd));
    }

    pub fn delay(&self) -> Duration {
        self.delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn grows_while_the_client_stays_busy_and_halves_when_it_runs_dry() {
        let mut c = Coalesce::new(Duration::from_micros(50));
        // 40 writes of one 100-byte reply each
        for _ in 0..40 {
            c.replied(100);
            c.wrote();
        }
        let m = est_mem(100);
        // fewer unread replies than the backlog needs: no pause
        assert_eq!(c.plan(Some(m * (MIN_BACKLOG - 1))), None);
        assert_eq!(c.plan(None), None);
        // a deep backlog: pauses, growing while the client stays busy
        for i in 1..=20u32 {
            let d = c.plan(Some(m * 30)).expect("pauses");
            assert_eq!(d, (STEP * i).min(Duration::from_micros(50)));
            c.judge(Some(m * 20));
        }
        assert_eq!(c.delay(), Duration::from_micros(50));
        // the client ran (nearly) dry during a pause: halve
        c.plan(Some(m * 30)).unwrap();
        c.judge(Some(m * (MIN_BACKLOG / 2) - 1));
        assert_eq!(c.delay(), Duration::from_micros(25));
        // the backlog is gone: halve again, then off
        assert_eq!(c.plan(Some(0)), None);
        assert_eq!(c.delay(), Duration::from_nanos(12_500));
        assert_eq!(c.plan(Some(0)), None);
        assert_eq!(c.plan(Some(0)), None);
        assert_eq!(c.delay(), Duration::ZERO);
        // off: never pauses
        let mut off = Coalesce::new(Duration::ZERO);
        off.replied(100);
        off.wrote();
        assert_eq!(off.plan(Some(1 << 20)), None);
    }

    #[test]
    fn counts_the_replies_of_the_newest_writes_that_fit() {
        let mut c = Coalesce::new(Duration::from_micros(50));
        for replies in [5, 1, 3] {
            for _ in 0..replies {
                c.replied(16);
            }
            c.wrote();
        }
        c.wrote(); // nothing new: no write remembered
        assert_eq!(c.writes.len(), 3);
        let (a, b, d) = (est_mem(80), est_mem(16), est_mem(48));
        assert_eq!(c.backlog(Some(0)), 0);
        assert_eq!(c.backlog(Some(d - 1)), 0);
        assert_eq!(c.backlog(Some(d)), 3);
        assert_eq!(c.backlog(Some(d + b)), 4);
        // the oldest write only partly unread: left out
        assert_eq!(c.backlog(Some(d + b + a - 1)), 4);
        assert_eq!(c.backlog(Some(d + b + a)), 9);
        assert_eq!(c.backlog(Some(1 << 30)), 9);
        // what the kernel reports is never less than the estimate's bytes:
        // a real socket's figure for these writes counts them all
        let (mut x, _y) = UnixStream::pair().unwrap();
        for n in [80usize, 16, 48] {
            x.write_all(&vec![1u8; n]).unwrap();
        }
        let got = unread_bytes(x.as_raw_fd()).unwrap();
        assert!(got >= 80 + 16 + 48, "{got}");
    }

    #[test]
    fn pauses_only_while_the_peer_has_unread_replies() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let gate = SpinGate::new(1);
        let mut c = Coalesce::new(Duration::from_micros(50));
        for _ in 0..MIN_BACKLOG * 2 {
            a.write_all(&[7u8; 4096]).unwrap();
            c.replied(4096);
            c.wrote();
        }
        assert!(c.backlog(unread_bytes(a.as_raw_fd())) >= MIN_BACKLOG);
        c.pause(a.as_raw_fd(), &gate);
        assert_eq!(c.pauses, 1);
        assert!(c.delay() > STEP, "the peer read nothing: the pause grows");
        // the peer reads everything: no pause, and the pause shrinks
        let mut buf = vec![0u8; 4096 * MIN_BACKLOG * 2];
        b.read_exact(&mut buf).unwrap();
        assert_eq!(unread_bytes(a.as_raw_fd()), Some(0));
        let before = c.delay();
        c.pause(a.as_raw_fd(), &gate);
        assert_eq!(c.pauses, 1);
        assert!(c.delay() < before);
        // a full gate: no pause either
        for _ in 0..MIN_BACKLOG * 2 {
            a.write_all(&[7u8; 4096]).unwrap();
            c.replied(4096);
            c.wrote();
        }
        let busy = SpinGate::new(0);
        c.pause(a.as_raw_fd(), &busy);
        assert_eq!(c.pauses, 1);
    }
}
