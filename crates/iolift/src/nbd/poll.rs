//! Poll mode for a connection's read side (`serve --poll-us auto|N`:
//! adaptive by default, a fixed budget of N us, 0 turns it off).
//!
//! Normally a connection's reader sleeps in epoll when the socket is empty
//! and the kernel wakes it when the client sends: one scheduler wake-up per
//! request at queue depth 1, which on a busy machine costs tens of
//! microseconds. In poll mode the reader first retries a non-blocking
//! `recv` on the socket for up to N microseconds, and sleeps only when
//! nothing came in that time: the SPDK way, trading a core for latency.
//! The receive goes straight to the socket (tokio's readiness flag is only
//! refreshed by the epoll driver, so `try_read` would not see new data);
//! when the budget runs out the read falls back to the runtime's normal
//! path, which clears a stale readiness flag on its own.
//!
//! It only polls where that pays (see [`Polled`] and [`SpinGate`]): at a
//! request boundary, while recent waits fit half the budget, while the
//! connection does not see bursts of requests, and while a runtime worker
//! is left for the other connections. In adaptive mode the budget follows
//! the waits and a per-connection controller (`nbd/adapt.rs`) backs off
//! while polling costs more than it saves; each poll is measured for it
//! (`nbd/sysload.rs`), and the state shows in the metrics
//! (`nbd/poll_stats.rs`).
//!
//! While the last wait for a request was allowed to poll, the reads of
//! the rest of that request (a write's payload, which clients such as
//! libnbd send apart from its header) poll too, for at most
//! [`FOLLOW_MAX`]: otherwise a polled header is followed by a sleep in
//! epoll for its payload, and a QD1 write pays the wake-up that polling
//! saved.
//!
//! Used by `conn.rs`, which wraps each connection's read half in a
//! [`Polled`], and by the reader (`reader.rs`), which calls
//! [`Polled::at_boundary`] before each wait for a new request. The
//! [`SpinGate`] is the server's (`Server::spin_gate`), shared by every
//! connection.

use super::adapt::{Controller, PollSample, Verdict};
use super::judge::{Judge, Mode};
use super::poll_stats::{PollState, PollStats};
use super::sysload::{LoadSampler, ThreadUsage};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, ReadBuf};

/// A socket read half whose file descriptor can be read directly.
pub trait RawSocket {
    fn raw_fd(&self) -> RawFd;
}

impl RawSocket for tokio::net::unix::OwnedReadHalf {
    fn raw_fd(&self) -> RawFd {
        self.as_ref().as_raw_fd()
    }
}

impl RawSocket for tokio::net::tcp::OwnedReadHalf {
    fn raw_fd(&self) -> RawFd {
        self.as_ref().as_raw_fd()
    }
}

/// How many connections may poll at the same time. A poll holds a runtime
/// worker thread; were every worker polling for its own quiet client, a
/// request on any other connection would wait for a budget to run out.
/// The server allows one fewer than its worker threads (at least one).
#[derive(Debug)]
pub struct SpinGate {
    busy: AtomicUsize,
    max: usize,
}

impl SpinGate {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(SpinGate {
            busy: AtomicUsize::new(0),
            max,
        })
    }

    /// A place to poll in, if one is free.
    pub(crate) fn enter(&self) -> Option<SpinTicket<'_>> {
        self.busy
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b < self.max).then_some(b + 1)
            })
            .ok()
            .map(|_| SpinTicket(self))
    }
}

pub(crate) struct SpinTicket<'a>(&'a SpinGate);

impl Drop for SpinTicket<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Longest poll budget accepted: past this, sleeping is cheaper.
pub const MAX_POLL: Duration = Duration::from_millis(10);
/// Longest poll for the rest of a request whose header came in (see
/// `Polled::follow`): a client sends a write's payload right behind its
/// header, so it comes within microseconds or the client was descheduled.
pub const FOLLOW_MAX: Duration = Duration::from_micros(50);

/// How a server's connections poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Never (`--poll-us 0`).
    Off,
    /// Up to this long (`--poll-us N`).
    Fixed(Duration),
    /// A budget and a back-off of its own per connection (`nbd/adapt.rs`).
    Auto,
}

/// A read half that polls its socket for up to `budget` before sleeping,
/// while polling pays: the read waits for a new request, its owner allows
/// it (`at_boundary`) and such waits have lately averaged at most half the
/// budget. A zero budget is a plain pass-through.
pub struct Polled<R> {
    inner: R,
    /// The fixed budget (zero: off); unused in adaptive mode.
    budget: Duration,
    /// Adaptive mode's controller, and the machine's load it reads.
    auto: Option<(Controller, Arc<LoadSampler>)>,
    /// Adaptive mode: whether polling shortens this connection's request
    /// cycles (`nbd/judge.rs`); the controller is asked only in its
    /// polled windows.
    judge: Option<Judge>,
    /// Probes of the judge already shown in the metrics.
    probes_seen: u64,
    /// What the metrics show of this connection's polling.
    stats: Arc<PollStats>,
    spin: bool,
    /// Moving average of how long reads waited for data. Past half the
    /// budget, a poll would often run out and the core it burns is taken from
    /// whoever produces the data (a Ceph OSD on the same machine), so the
    /// reader sleeps at once; the average keeps being measured, so polling
    /// comes back when the gaps shrink.
    gap: Duration,
    /// Since when the current read has found nothing, and whether it
    /// polled already (a wake-up without data does not poll again).
    waiting: Option<(Instant, bool)>,
    /// The next read waits for a new request (`at_boundary`). Only those
    /// reads poll and are measured: the short waits between the pieces of
    /// a large write payload say nothing about the gap between requests.
    boundary: bool,
    /// The last boundary decision's budget, while polling pays: the reads
    /// of the rest of a request (a write's payload, which a client often
    /// sends apart from its header) then poll too, for up to
    /// [`FOLLOW_MAX`], unmeasured; else they sleep until the payload comes,
    /// a wake-up more per write. `None`: they go to the runtime at once.
    follow: Option<Duration>,
    /// Shared by the server's connections: who may poll now.
    gate: Arc<SpinGate>,
    /// Polls started (read by the tests).
    polls: u64,
    /// Polls for the rest of a request started (read by the tests).
    follows: u64,
}

impl<R> Polled<R> {
    /// `load`: the server's sampler, read in adaptive mode.
    pub fn new(inner: R, mode: PollMode, gate: Arc<SpinGate>, load: Arc<LoadSampler>) -> Self {
        let (budget, auto) = match mode {
            PollMode::Off => (Duration::ZERO, None),
            PollMode::Fixed(b) => (b.min(MAX_POLL), None),
            PollMode::Auto => (Duration::ZERO, Some((Controller::new(), load))),
        };
        let judge = auto.is_some().then(Judge::new);
        let stats = Arc::new(PollStats::default());
        stats.set(initial_state(mode), budget.as_micros() as u64);
        Polled {
            inner,
            budget,
            auto,
            judge,
            probes_seen: 0,
            stats,
            spin: true,
            gap: Duration::ZERO,
            waiting: None,
            boundary: true,
            follow: None,
            gate,
            polls: 0,
            follows: 0,
        }
    }

    /// A boundary read got data (or an error): fold its wait into the
    /// average; reads are mid-request until the next `at_boundary`.
    fn arrived(&mut self) {
        let waited = match self.waiting.take() {
            Some((t0, _)) => t0.elapsed(),
            None => Duration::ZERO,
        };
        self.gap = (self.gap * 7 + waited) / 8;
        self.boundary = false;
    }

    /// This connection's poll counters (for the metrics).
    pub fn stats(&self) -> Arc<PollStats> {
        self.stats.clone()
    }

    /// Whether this wait may poll, and for how long; records the state.
    fn decide(&mut self, now: Instant) -> Option<Duration> {
        let budget = self.decide_budget(now);
        self.follow = budget;
        budget
    }

    fn decide_budget(&mut self, now: Instant) -> Option<Duration> {
        let Some((ctl, load)) = &mut self.auto else {
            return (self.gap * 2 <= self.budget).then_some(self.budget);
        };
        let busy = load.busy(now);
        self.stats.set_stall(load.stall());
        let (state, budget) = match ctl.admit(now, self.gap, busy) {
            Verdict::Poll(b) => (PollState::Polling, Some(b)),
            Verdict::Idle => (PollState::Idle, None),
            Verdict::Backoff => (PollState::Backoff, None),
            Verdict::BackoffNow(r) => {
                self.stats.backed_off(r);
                (PollState::Backoff, None)
            }
        };
        if budget.is_none() {
            // A polled window's cycle that does not poll: not counted.
            if let Some(j) = &mut self.judge {
                j.void();
            }
        }
        self.stats
            .set(state, budget.map_or(0, |b| b.as_micros() as u64));
        budget
    }

    /// Polls for up to `budget` (measured for the controller in adaptive
    /// mode); `None`: nothing came.
    fn poll_for(
        &mut self,
        fd: RawFd,
        buf: &mut ReadBuf<'_>,
        budget: Duration,
    ) -> Option<io::Result<()>> {
        let gate = self.gate.clone();
        let Some(_ticket) = gate.enter() else {
            if let Some(j) = &mut self.judge {
                j.void();
            }
            return None;
        };
        self.polls += 1;
        let u0 = self.auto.is_some().then(ThreadUsage::now);
        let t0 = Instant::now();
        let got = spin(fd, buf, t0 + budget);
        self.stats.polled(got.is_some());
        if let (Some((ctl, _)), Some(u0)) = (&mut self.auto, u0) {
            let u1 = ThreadUsage::now();
            let now = Instant::now();
            let s = PollSample {
                wall: now - t0,
                cpu: u1.cpu.saturating_sub(u0.cpu),
                preempted: u1.nivcsw > u0.nivcsw,
                found: got.is_some(),
            };
            if let Some(r) = ctl.observe(now, s) {
                self.stats.backed_off(r);
                self.stats.set(PollState::Backoff, 0);
                self.follow = None;
            }
        }
        got
    }

    /// A read of the rest of a request while polling pays: a receive,
    /// then (once per wait) a poll of up to `budget`, then the runtime's
    /// path. Not measured for the controller: these waits are the
    /// client's, not the gap between requests.
    fn read_rest(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        budget: Duration,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + RawSocket + Unpin,
    {
        let fd = self.inner.raw_fd();
        if let Some(r) = try_recv(fd, buf) {
            self.waiting = None;
            return Poll::Ready(r);
        }
        let now = Instant::now();
        let (_, polled) = self.waiting.get_or_insert((now, false));
        if !*polled {
            *polled = true;
            let gate = self.gate.clone();
            let got = gate.enter().and_then(|_ticket| {
                self.follows += 1;
                spin(fd, buf, now + budget)
            });
            if let Some(r) = got {
                self.waiting = None;
                return Poll::Ready(r);
            }
        }
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_ready() {
            self.waiting = None;
        }
        r
    }

    /// The socket's file descriptor.
    pub fn raw_fd(&self) -> RawFd
    where
        R: RawSocket,
    {
        self.inner.raw_fd()
    }

    /// The next read waits for a new request; `spin`: whether it may
    /// poll. The connection says no while the client keeps many requests
    /// coming (each read finds a batch): then the reader seldom sleeps
    /// anyway, and a polling core only takes CPU and socket locks from the
    /// client.
    pub fn at_boundary(&mut self, spin: bool) {
        self.spin = spin;
        self.boundary = true;
        self.waiting = None;
        if let Some(j) = &mut self.judge {
            if spin {
                let m = j.start(Instant::now());
                if j.probes() != self.probes_seen {
                    self.probes_seen = j.probes();
                    if let Some(r) = j.last_probe() {
                        self.stats.probed(r);
                    }
                }
                if m == Mode::Unpolled {
                    // Waits as with `--poll-us 0`, receive for receive.
                    self.follow = None;
                    self.stats.set(PollState::Unpolled, 0);
                }
            } else {
                j.void();
            }
        }
        if !spin {
            self.follow = None;
        }
        if !spin && self.auto.is_some() {
            self.stats.set(PollState::Idle, 0);
        }
    }
}

fn initial_state(mode: PollMode) -> PollState {
    match mode {
        PollMode::Off => PollState::Off,
        PollMode::Fixed(_) => PollState::Fixed,
        PollMode::Auto => PollState::Idle,
    }
}

/// One non-blocking receive into the unfilled part of `buf`. `None`: the
/// socket is empty.
fn try_recv(fd: RawFd, buf: &mut ReadBuf<'_>) -> Option<io::Result<()>> {
    loop {
        // SAFETY: recv writes at most `un.len()` bytes into the unfilled,
        // possibly uninitialised, part of the buffer; exactly the `n` it
        // reports are then marked initialised and filled.
        let un = unsafe { buf.unfilled_mut() };
        let n = unsafe {
            libc::recv(
                fd,
                un.as_mut_ptr() as *mut libc::c_void,
                un.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            let n = n as usize;
            unsafe { buf.assume_init(n) };
            buf.advance(n);
            return Some(Ok(()));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return None,
            _ => return Some(Err(e)),
        }
    }
}

/// Receives until data comes or `deadline` passes (`None`).
fn spin(fd: RawFd, buf: &mut ReadBuf<'_>, deadline: Instant) -> Option<io::Result<()>> {
    while Instant::now() < deadline {
        // Let a thread that is runnable on this CPU go first.
        unsafe { libc::sched_yield() };
        if let Some(r) = try_recv(fd, buf) {
            return Some(r);
        }
    }
    None
}

impl<R: AsyncRead + RawSocket + Unpin> AsyncRead for Polled<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        // Off: `--poll-us 0`, or an unpolled window of the judge's.
        let off =
            me.budget.is_zero() && me.judge.as_ref().is_none_or(|j| j.mode() == Mode::Unpolled);
        if !me.boundary && buf.remaining() > 0 {
            if let Some(b) = me.follow {
                return me.read_rest(cx, buf, b.min(FOLLOW_MAX));
            }
        }
        if !me.boundary || !me.spin || off || buf.remaining() == 0 {
            me.waiting = None;
            return Pin::new(&mut me.inner).poll_read(cx, buf);
        }
        let fd = me.inner.raw_fd();
        if let Some(r) = try_recv(fd, buf) {
            me.arrived();
            return Poll::Ready(r);
        }
        let now = Instant::now();
        let (_, polled) = me.waiting.get_or_insert((now, false));
        if !*polled {
            // Whether or not it polls now, this wait polls no more: a
            // wake-up means data (or a spurious one), not a new wait.
            *polled = true;
            if let Some(budget) = me.decide(now) {
                if let Some(r) = me.poll_for(fd, buf, budget) {
                    me.arrived();
                    return Poll::Ready(r);
                }
            }
        }
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        if r.is_ready() {
            me.arrived();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A read half that never becomes ready by itself: whatever a `Polled`
    /// around it returns came from its own polling.
    struct Never(UnixStream);

    impl AsyncRead for Never {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            _buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl RawSocket for Never {
        fn raw_fd(&self) -> RawFd {
            self.0.as_raw_fd()
        }
    }

    fn fixed(a: UnixStream, budget: Duration, gate: Arc<SpinGate>) -> Polled<Never> {
        let load = Arc::new(LoadSampler::new());
        Polled::new(Never(a), PollMode::Fixed(budget), gate, load)
    }

    fn poll_once(p: &mut Polled<Never>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut rb = ReadBuf::new(out);
        match Pin::new(p).poll_read(&mut cx, &mut rb) {
            Poll::Ready(r) => Poll::Ready(r.map(|_| rb.filled().len())),
            Poll::Pending => Poll::Pending,
        }
    }

    #[test]
    fn polling_finds_data_sent_within_the_budget_and_gives_up_after_it() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut p = fixed(a, Duration::from_millis(500), SpinGate::new(1));
        // A budget far past the writer's delay (and past MAX_POLL, which
        // `new` clamps to), so that a writer thread scheduled late on a
        // loaded machine cannot fail the test.
        p.budget = Duration::from_secs(20);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            b.write_all(b"hello").unwrap();
            b
        });
        let mut buf = [0u8; 16];
        match poll_once(&mut p, &mut buf) {
            Poll::Ready(Ok(5)) => assert_eq!(&buf[..5], b"hello"),
            other => panic!("expected the 5 bytes sent while polling, got {other:?}"),
        }
        let mut b = t.join().unwrap();
        // mid-request (no new boundary): no boundary poll, only a short
        // one for the rest of the request (at most FOLLOW_MAX), then the
        // runtime's path
        p.budget = Duration::from_millis(2);
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!((p.polls, p.follows), (1, 1));
        // the same wait does not poll twice
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!((p.polls, p.follows), (1, 1));
        // at a boundary, nothing more comes: the budget runs out, the read
        // waits (the first wait's length, which a writer thread scheduled
        // late makes long, is forgotten: it would keep this one from polling)
        p.gap = Duration::ZERO;
        p.at_boundary(true);
        let t0 = Instant::now();
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert!(t0.elapsed() >= Duration::from_millis(2));
        assert_eq!(p.polls, 2);
        // polling off: data in the socket is left to the runtime's path
        b.write_all(b"x").unwrap();
        p.at_boundary(false);
        assert!(poll_once(&mut p, &mut buf).is_pending());
        p.at_boundary(true);
        assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(1))));
        // EOF is a zero-length read, not an error
        drop(b);
        p.at_boundary(true);
        assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(0))));
    }

    /// When reads have lately waited longer than the budget, the reader
    /// does not poll (it would mostly run out); the average follows the
    /// waits, so short waits bring polling back.
    #[test]
    fn long_gaps_turn_polling_off_short_ones_back_on() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut p = fixed(a, Duration::from_millis(2), SpinGate::new(1));
        let mut buf = [0u8; 16];
        p.gap = Duration::from_secs(1);
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!(p.polls, 0, "polled although the gaps are past the budget");
        // data now: found by the first receive, the wait was short
        for _ in 0..80 {
            b.write_all(b"y").unwrap();
            p.at_boundary(true);
            assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(1))));
        }
        assert!(p.gap * 2 <= p.budget, "gap {:?}", p.gap);
        p.at_boundary(true);
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!(p.polls, 1, "did not poll once the gaps were short");
        // a wake-up without data does not poll a second time
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!(p.polls, 1);
    }

    /// Through the runtime: data sent during the budget, data sent after
    /// it (the reader sleeps in epoll then) and EOF all arrive.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polled_reads_see_data_sent_during_and_after_the_budget() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (r, _w) = a.into_split();
        let mut r = Polled::new(
            r,
            PollMode::Fixed(Duration::from_millis(2)),
            SpinGate::new(1),
            Arc::new(LoadSampler::new()),
        );
        let (_br, mut bw) = b.into_split();
        let t = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(200)).await;
            bw.write_all(b"early").await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            bw.write_all(b"late").await.unwrap();
            drop(bw);
        });
        let mut got = [0u8; 5];
        r.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"early");
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"late");
        t.await.unwrap();
    }

    /// With every place taken, a reader does not poll; once one is free,
    /// the next wait polls again.
    #[test]
    fn a_full_gate_stops_polling() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let gate = SpinGate::new(1);
        let mut p = fixed(a, Duration::from_millis(200), gate.clone());
        // Past MAX_POLL (which `new` clamps to): a poll through the full
        // gate would take this long, and a writer thread scheduled late on
        // a loaded machine still lands within it.
        p.budget = Duration::from_secs(20);
        let mut buf = [0u8; 16];
        let held = gate.enter().expect("a free place");
        assert!(gate.enter().is_none(), "two places in a gate of one");
        let t0 = Instant::now();
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "polled through a full gate"
        );
        assert_eq!(p.polls, 0);
        drop(held);
        b.write_all(b"z").unwrap();
        p.at_boundary(true);
        assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(1))));
        // the place is given back after each poll
        p.at_boundary(true);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            b.write_all(b"w").unwrap();
            b
        });
        assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(1))));
        assert_eq!(p.polls, 1);
        assert!(gate.enter().is_some(), "the place was not given back");
    }

    /// The rest of a request (a write's payload sent apart from its
    /// header) is received by the reader itself while polling pays, and
    /// left to the runtime once polling is off.
    #[test]
    fn the_rest_of_a_request_is_polled_only_while_polling_pays() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut p = fixed(a, Duration::from_millis(2), SpinGate::new(1));
        let mut buf = [0u8; 16];
        b.write_all(b"head").unwrap();
        assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(4))));
        // the header was found at once: no decision yet, nothing to follow
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!(p.follows, 0);
        // a boundary wait that decides to poll allows following
        p.at_boundary(true);
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!(p.polls, 1);
        b.write_all(b"h").unwrap();
        assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(1))));
        // the rest of that request: received by the reader itself (the
        // runtime's path never returns data here)
        b.write_all(b"payload").unwrap();
        assert!(matches!(poll_once(&mut p, &mut buf), Poll::Ready(Ok(7))));
        assert_eq!(&buf[..7], b"payload");
        // polling turned off (a burst): the rest goes to the runtime
        p.at_boundary(false);
        p.boundary = false;
        b.write_all(b"late").unwrap();
        assert!(poll_once(&mut p, &mut buf).is_pending());
        assert_eq!(p.follow, None);
    }

    #[test]
    fn budget_is_capped() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(
            fixed(a, Duration::from_secs(5), SpinGate::new(1)).budget,
            MAX_POLL
        );
    }
}
