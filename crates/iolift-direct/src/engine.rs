//! The direct I/O engine: one io_uring driven by one thread, or by its
//! callers (inline mode).
//!
//! Inline mode ([`Config::inline`]): no thread, no queue, no eventfd; the
//! caller of [`Engine::submit_batch`] puts its requests into the ring and
//! submits them and waits for their completions with one `io_uring_enter`,
//! on its own thread (module [`inline`]). That is the path for queue
//! depth 1 and for synchronous batches: a request costs one system call
//! and no thread hand-off. The rest of this text is about the threaded
//! mode, for callers that keep many requests in flight from other threads.
//!
//! Callers hand requests ([`Op`]) to [`Engine::submit`] from any thread;
//! they go into a queue, and the engine's thread moves everything queued
//! into the submission ring and submits it with one `io_uring_enter`
//! (batching: a queue of 32 requests costs one system call, not 32).
//! Completions are reported as the block layer reports them: the number of
//! bytes transferred, 0, or a negative errno ([`Done::res`]); a read at the
//! end of the target returns fewer bytes than asked, or 0.
//!
//! The target's file is registered with the ring (fixed file 0), and with
//! [`Config::fixed_bufs`] a pool of buffers is registered too
//! ([`crate::buf::FixedPool`]): requests whose buffer comes from it use
//! READ_FIXED / WRITE_FIXED, which skip mapping the pages on every request.
//!
//! How the thread waits:
//! - normally it sleeps in `io_uring_enter` for one completion, with a poll
//!   request on an eventfd in the ring, so that a caller who queues a
//!   request while it sleeps wakes it (callers signal the eventfd only when
//!   they put the first request into an empty queue);
//! - with [`Config::sqpoll`] a kernel thread takes submissions off the ring
//!   by itself (no system call to submit while it is awake); the engine's
//!   thread still waits for completions in `io_uring_enter`;
//! - with [`Config::iopoll`] (O_DIRECT on a device with poll queues) the
//!   kernel polls the device for completions instead of taking interrupts.
//!   Such a ring takes only reads and writes, so the eventfd is waited on
//!   with poll(2) when nothing is in flight, and a flush runs as fdatasync(2)
//!   on the engine's thread (after the writes that completed before it).
//!
//! The thread reaps every completion the ring holds, then runs their
//! callbacks inside [`batch::run`]: a callback may put work off until the
//! batch's last callback has run (a caller answering requests over a
//! socket writes all of one batch's replies to a client in one call).
//!
//! A flush completes after every write that completed before it was
//! submitted is on stable storage (IORING_OP_FSYNC with DATASYNC): callers
//! that need a write ordered before a flush wait for the write first.

pub mod batch;
mod inline;
mod stats;

pub use stats::Stats;

use crate::buf::{AlignedBuf, Buf, FixedPool, PinHook};
use crate::slot::{pair, Pending};
use crate::target::Target;
use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Engine settings.
#[derive(Clone)]
pub struct Config {
    /// Submission queue entries (a power of two; the kernel rounds up).
    pub entries: u32,
    /// Start a kernel submission-polling thread that sleeps after this many
    /// idle milliseconds.
    pub sqpoll: Option<u32>,
    /// Poll the device for completions (needs O_DIRECT and a device with
    /// poll queues, which [`Engine::new`] checks in sysfs).
    pub iopoll: bool,
    /// Registered buffers to allocate (0: none).
    pub fixed_bufs: usize,
    /// Size of each registered buffer.
    pub fixed_buf_size: usize,
    /// Called on the registered buffers' memory (page-locking for a GPU).
    pub pin: Option<Arc<dyn PinHook>>,
    /// No engine thread: the submitting caller drives the ring itself and
    /// waits for its requests there (see [`inline`]). Suits one caller
    /// thread at queue depth 1 or with synchronous batches; callbacks run
    /// on the caller's thread before `submit` returns.
    pub inline: bool,
    /// Inline mode only: after submitting, spin on the completion ring for
    /// up to this many microseconds before sleeping in the kernel (0: no
    /// spinning); less when recent requests completed sooner, not at all
    /// when they took longer (see [`inline`]). With [`Self::sqpoll`] a request then needs no system
    /// call at all while both sides are awake; the price is a CPU kept
    /// busy for up to this long per request (and, with SQPOLL, the
    /// kernel's polling thread busy until its idle time passes).
    pub spin_us: u32,
    /// Inline mode only, without SQPOLL and spinning: the ring is used
    /// only by the thread that creates the engine
    /// (IORING_SETUP_SINGLE_ISSUER), and the kernel posts completions
    /// when that thread waits for them in `io_uring_enter` instead of
    /// interrupting it with task work (IORING_SETUP_DEFER_TASKRUN): the
    /// waiter is woken once, straight into reaping. Another thread's
    /// request then fails with EEXIST, so this is for single-threaded
    /// callers (a latency loop, AccelFS under the key-value store).
    pub defer_taskrun: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            entries: 256,
            sqpoll: None,
            iopoll: false,
            fixed_bufs: 0,
            fixed_buf_size: 128 << 10,
            pin: None,
            inline: false,
            spin_us: 0,
            defer_taskrun: false,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("entries", &self.entries)
            .field("sqpoll", &self.sqpoll)
            .field("iopoll", &self.iopoll)
            .field("fixed_bufs", &self.fixed_bufs)
            .field("fixed_buf_size", &self.fixed_buf_size)
            .field("pin", &self.pin.is_some())
            .field("inline", &self.inline)
            .field("spin_us", &self.spin_us)
            .field("defer_taskrun", &self.defer_taskrun)
            .finish()
    }
}

/// One request.
pub enum Op {
    /// Read `buf.len()` bytes at `offset` into `buf`.
    Read { offset: u64, buf: Buf },
    /// Write `buf` at `offset`.
    Write { offset: u64, buf: Buf },
    /// Make every write completed before this was submitted stable.
    Flush,
}

/// A completed request: the result as the block layer gives it (bytes, 0
/// or -errno) and the request's buffer back.
pub struct Done {
    pub res: i32,
    pub buf: Option<Buf>,
}

impl Done {
    /// The result as a `Result`: bytes transferred or the OS error.
    pub fn result(&self) -> io::Result<usize> {
        if self.res < 0 {
            Err(io::Error::from_raw_os_error(-self.res))
        } else {
            Ok(self.res as usize)
        }
    }
}

/// Called once with a request's completion, on the engine's thread.
pub type Callback = Box<dyn FnOnce(Done) + Send>;

struct Shared {
    queue: Mutex<Vec<(Op, Callback)>>,
    efd: OwnedFd,
    stop: AtomicBool,
    /// The engine's counters ([`Engine::stats`]).
    count: stats::Counters,
}

impl Shared {
    fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.efd.as_raw_fd(), &one as *const u64 as *const _, 8) };
    }

    fn drain_efd(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a local from our non-blocking eventfd.
        unsafe { libc::read(self.efd.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
    }
}

/// An io_uring engine over one [`Target`]; see the module docs.
pub struct Engine {
    shared: Arc<Shared>,
    target: Arc<Target>,
    pool: Option<Arc<FixedPool>>,
    thread: Option<JoinHandle<()>>,
    /// The ring, in inline mode (no thread then).
    inline: Option<Mutex<inline::InlineRing>>,
    cfg: Config,
}

/// user_data of the eventfd poll.
const WAKE: u64 = u64::MAX;

impl Engine {
    /// Sets up the ring, registers the file (and buffers) and starts the
    /// engine's thread.
    pub fn new(target: Target, cfg: Config) -> io::Result<Engine> {
        let path = target.path().to_path_buf();
        let err = |what: &str, e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("io_uring on {}: {what}: {e}", path.display()),
            )
        };
        if cfg.iopoll && !target.is_direct() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "io_uring on {}: IOPOLL needs O_DIRECT{}",
                    target.path().display(),
                    target
                        .fallback()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                ),
            ));
        }
        if cfg.iopoll {
            match io_poll_queues(&target) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "io_uring on {}: IOPOLL is not supported here: its device has no poll queues (queue/io_poll is 0)",
                            path.display()
                        ),
                    ))
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "io_uring on {}: IOPOLL is not supported here: cannot tell whether its device polls ({e})",
                            path.display()
                        ),
                    ))
                }
            }
        }
        let mut b = IoUring::builder();
        if let Some(idle) = cfg.sqpoll {
            b.setup_sqpoll(idle);
        }
        if cfg.iopoll {
            b.setup_iopoll();
        }
        if cfg.defer_taskrun {
            if !cfg.inline || cfg.sqpoll.is_some() || cfg.spin_us > 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "io_uring on {}: defer_taskrun needs inline mode without SQPOLL and without spinning",
                        path.display()
                    ),
                ));
            }
            b.setup_single_issuer();
            b.setup_defer_taskrun();
        }
        let ring = b.build(cfg.entries).map_err(|e| err("setup", e))?;
        ring.submitter()
            .register_files(&[target.file().as_raw_fd()])
            .map_err(|e| err("register file", e))?;
        let pool = if cfg.fixed_bufs > 0 {
            let p = Arc::new(FixedPool::new(
                cfg.fixed_bufs,
                cfg.fixed_buf_size,
                cfg.pin.clone(),
            )?);
            let iov = p.iovecs();
            // SAFETY: the iovecs point into the pool's allocation, which
            // the engine keeps alive (self.pool and the thread's clone)
            // until the ring is dropped at the end of the thread.
            unsafe { ring.submitter().register_buffers(&iov) }
                .map_err(|e| err("register buffers (RLIMIT_MEMLOCK?)", e))?;
            Some(p)
        } else {
            None
        };
        // SAFETY: eventfd returns a new descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(err("eventfd", io::Error::last_os_error()));
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Vec::new()),
            // SAFETY: efd is a new descriptor that nothing else owns.
            efd: unsafe { OwnedFd::from_raw_fd(efd) },
            stop: AtomicBool::new(false),
            count: Default::default(),
        });
        let target = Arc::new(target);
        if cfg.inline {
            let r = inline::InlineRing {
                ring,
                target: target.clone(),
                _pool: pool.clone(),
                iopoll: cfg.iopoll,
                // An IOPOLL ring without SQPOLL completes nothing unless
                // someone enters the kernel to poll: no spinning there.
                spin: (cfg.spin_us > 0 && !(cfg.iopoll && cfg.sqpoll.is_none()))
                    .then(|| std::time::Duration::from_micros(cfg.spin_us.into())),
                sqpoll: cfg.sqpoll.is_some(),
                spin_est: std::time::Duration::ZERO,
                started: Vec::new(),
                started_out: 0,
                finished: Vec::new(),
            };
            return Ok(Engine {
                shared,
                target,
                pool,
                thread: None,
                inline: Some(Mutex::new(r)),
                cfg,
            });
        }
        let t = Worker {
            ring,
            shared: shared.clone(),
            target: target.clone(),
            _pool: pool.clone(),
            iopoll: cfg.iopoll,
        };
        let thread = std::thread::Builder::new()
            .name("iolift-uring".into())
            .spawn(move || t.run())
            .map_err(|e| err("thread", e))?;
        let eng = Engine {
            shared,
            target,
            pool,
            thread: Some(thread),
            inline: None,
            cfg,
        };
        Ok(eng)
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The registered buffer pool, when there is one.
    pub fn pool(&self) -> Option<&Arc<FixedPool>> {
        self.pool.as_ref()
    }

    /// A buffer of `len` bytes suited to the target: a registered one when
    /// one is free and big enough, an aligned one otherwise.
    pub fn alloc(&self, len: usize) -> Buf {
        if let Some(b) = self.pool.as_ref().and_then(|p| p.take(len)) {
            return Buf::Fixed(b);
        }
        Buf::Aligned(AlignedBuf::new(len))
    }

    pub fn stats(&self) -> Stats {
        self.shared.count.snapshot()
    }

    /// Queues one request; `cb` runs on the engine's thread when it
    /// completes (inline: on this thread, before this returns).
    pub fn submit(&self, op: Op, cb: Callback) {
        self.submit_batch(vec![(op, cb)]);
    }

    /// Queues several requests at once (they reach the ring together).
    pub fn submit_batch(&self, ops: Vec<(Op, Callback)>) {
        if self.shared.stop.load(Ordering::Acquire) {
            for (op, cb) in ops {
                cb(Done {
                    res: -libc::ESHUTDOWN,
                    buf: op_buf(op),
                });
            }
            return;
        }
        self.shared.count.submitted(&ops);
        if let Some(r) = &self.inline {
            let n = ops.len() as u64;
            let done = r
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .run(&self.shared, ops);
            self.shared.count.ops.fetch_add(n, Ordering::Relaxed);
            for (cb, d) in done {
                cb(d);
            }
            return;
        }
        let was_empty = {
            let mut q = self.shared.queue.lock().unwrap();
            let e = q.is_empty();
            q.extend(ops);
            e
        };
        if was_empty {
            self.shared.kick();
        }
    }

    /// Starts requests without waiting for them. Inline mode: they are
    /// submitted now and their callbacks run on whichever later call of
    /// this engine reaps their completions ([`Self::wait_started`] waits
    /// for all of them); at most half the completion queue's worth is out
    /// at a time. With an engine thread: [`Self::submit_batch`].
    pub fn start_batch(&self, ops: Vec<(Op, Callback)>) {
        let Some(r) = &self.inline else {
            return self.submit_batch(ops);
        };
        if self.shared.stop.load(Ordering::Acquire) {
            return self.submit_batch(ops);
        }
        self.shared.count.submitted(&ops);
        let n = ops.len() as u64;
        let done = r
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .start(&self.shared, ops);
        self.shared.count.ops.fetch_add(n, Ordering::Relaxed);
        for (cb, d) in done {
            cb(d);
        }
    }

    /// Inline mode: waits until every request of [`Self::start_batch`]
    /// completed and runs their callbacks. With an engine thread: nothing
    /// (their callbacks run there).
    pub fn wait_started(&self) {
        if let Some(r) = &self.inline {
            let done = r
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .wait_started(&self.shared);
            for (cb, d) in done {
                cb(d);
            }
        }
    }

    /// Submits `op`; the result as a future (or [`Pending::wait`]).
    pub fn run(&self, op: Op) -> Pending<Done> {
        let (tx, rx) = pair();
        self.submit(op, Box::new(move |d| tx.set(d)));
        rx
    }

    /// Reads `len` bytes at `offset` into a buffer from [`Self::alloc`].
    pub fn read(&self, offset: u64, len: usize) -> Pending<Done> {
        let buf = self.alloc(len);
        self.run(Op::Read { offset, buf })
    }

    /// Writes `buf` at `offset`.
    pub fn write(&self, offset: u64, buf: Buf) -> Pending<Done> {
        self.run(Op::Write { offset, buf })
    }

    pub fn flush(&self) -> Pending<Done> {
        self.shared.count.flushes.fetch_add(1, Ordering::Relaxed);
        self.run(Op::Flush)
    }
}

impl Drop for Engine {
    /// Lets every queued request complete, then stops the thread. Dropped
    /// on the engine's own thread (the last reference held by a
    /// completion callback), it only tells the thread to stop after its
    /// requests complete, without waiting for it.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.kick();
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// Whether the block device under `t` (itself, or the one holding its file)
/// has poll queues: sysfs `queue/io_poll` of the device or, for a
/// partition, of its disk.
fn io_poll_queues(t: &Target) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let m = t.file().metadata()?;
    let dev = if t.is_block() { m.rdev() } else { m.dev() };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    let text = std::fs::read_to_string(format!("{base}/queue/io_poll"))
        .or_else(|_| std::fs::read_to_string(format!("{base}/../queue/io_poll")))
        .map_err(|e| io::Error::new(e.kind(), format!("{base}/queue/io_poll: {e}")))?;
    Ok(text.trim() == "1")
}

fn op_buf(op: Op) -> Option<Buf> {
    match op {
        Op::Read { buf, .. } | Op::Write { buf, .. } => Some(buf),
        Op::Flush => None,
    }
}

/// The ring entry for `op`, or (a result, the buffer, is a flush to run
/// here) when the op does not go into the ring.
#[allow(clippy::type_complexity)]
pub(crate) fn build(
    op: Op,
    iopoll: bool,
) -> Result<(io_uring::squeue::Entry, Option<Buf>), (i32, Option<Buf>, bool)> {
    let fd = types::Fixed(0);
    match op {
        Op::Flush if iopoll => Err((0, None, true)),
        Op::Flush => Ok((
            opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            None,
        )),
        Op::Read { offset, buf } | Op::Write { offset, buf }
            if buf.len() > u32::MAX as usize || offset > i64::MAX as u64 =>
        {
            Err((-libc::EINVAL, Some(buf), false))
        }
        Op::Read { offset, mut buf } => {
            let len = buf.len() as u32;
            let Some(ptr) = buf.ptr_mut() else {
                return Err((-libc::EINVAL, Some(buf), false));
            };
            let e = match buf.fixed_index() {
                Some(i) => opcode::ReadFixed::new(fd, ptr, len, i)
                    .offset(offset)
                    .build(),
                None => opcode::Read::new(fd, ptr, len).offset(offset).build(),
            };
            Ok((e, Some(buf)))
        }
        Op::Write { offset, buf } => {
            let len = buf.len() as u32;
            let e = match buf.fixed_index() {
                Some(i) => opcode::WriteFixed::new(fd, buf.ptr(), len, i)
                    .offset(offset)
                    .build(),
                None => opcode::Write::new(fd, buf.ptr(), len)
                    .offset(offset)
                    .build(),
            };
            Ok((e, Some(buf)))
        }
    }
}

/// fdatasync(2) on the target's descriptor: 0 or -errno.
pub(crate) fn sync_now(t: &Target) -> i32 {
    // SAFETY: fdatasync on the target's open descriptor.
    let r = unsafe { libc::fdatasync(t.file().as_raw_fd()) };
    if r == 0 {
        0
    } else {
        -io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    }
}

/// The engine's thread: owns the ring.
struct Worker {
    ring: IoUring,
    shared: Arc<Shared>,
    target: Arc<Target>,
    /// Keeps the registered memory alive as long as the ring.
    _pool: Option<Arc<FixedPool>>,
    iopoll: bool,
}

struct InFlight {
    buf: Option<Buf>,
    cb: Callback,
}

impl Worker {
    fn run(mut self) {
        let mut slots: Vec<Option<InFlight>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut in_flight = 0usize;
        let mut wake_armed = false;
        let mut cqes: Vec<(u64, i32)> = Vec::new();
        loop {
            let batch = std::mem::take(&mut *self.shared.queue.lock().unwrap());
            let mut pushed = 0u64;
            for (op, cb) in batch {
                let (sqe, buf) = match build(op, self.iopoll) {
                    Ok(x) => x,
                    Err((res, buf, flush)) => {
                        let res = if flush { self.sync_now() } else { res };
                        self.complete(cb, res, buf);
                        continue;
                    }
                };
                let idx = free.pop().unwrap_or_else(|| {
                    slots.push(None);
                    slots.len() - 1
                });
                slots[idx] = Some(InFlight { buf, cb });
                let sqe = sqe.user_data(idx as u64);
                // SAFETY: the buffer the entry points to is kept in
                // slots[idx] until its completion is reaped.
                while unsafe { self.ring.submission().push(&sqe) }.is_err() {
                    self.enter(0);
                }
                in_flight += 1;
                pushed += 1;
            }
            self.shared
                .count
                .max_batch
                .fetch_max(pushed, Ordering::Relaxed);
            let stopping = self.shared.stop.load(Ordering::Acquire);
            if stopping && in_flight == 0 && self.shared.queue.lock().unwrap().is_empty() {
                break;
            }
            if self.iopoll {
                if in_flight > 0 {
                    self.enter(1);
                } else {
                    if pushed > 0 {
                        self.enter(0);
                    }
                    self.wait_efd();
                }
            } else {
                if !wake_armed {
                    let e = opcode::PollAdd::new(
                        types::Fd(self.shared.efd.as_raw_fd()),
                        libc::POLLIN as u32,
                    )
                    .build()
                    .user_data(WAKE);
                    // SAFETY: a poll entry points to no memory.
                    while unsafe { self.ring.submission().push(&e) }.is_err() {
                        self.enter(0);
                    }
                    wake_armed = true;
                }
                self.enter(1);
            }
            cqes.clear();
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            // Callbacks may put work off until the whole batch is answered
            // (`batch`: one socket write for several replies).
            batch::run(|| {
                for &(ud, res) in &cqes {
                    if ud == WAKE {
                        wake_armed = false;
                        self.shared.drain_efd();
                        continue;
                    }
                    let f = slots[ud as usize]
                        .take()
                        .expect("completion of a free slot");
                    free.push(ud as usize);
                    in_flight -= 1;
                    self.complete(f.cb, res, f.buf);
                }
            });
        }
    }

    fn complete(&self, cb: Callback, res: i32, buf: Option<Buf>) {
        self.shared.count.ops.fetch_add(1, Ordering::Relaxed);
        cb(Done { res, buf });
    }

    /// fdatasync(2) on this thread (IOPOLL rings take no fsync).
    fn sync_now(&self) -> i32 {
        sync_now(&self.target)
    }

    /// Submits what is in the ring and waits for `want` completions,
    /// retrying on EINTR (and on EBUSY/EAGAIN: the completion queue is
    /// full, which the reap after this call resolves).
    fn enter(&mut self, want: usize) {
        self.shared.count.enters.fetch_add(1, Ordering::Relaxed);
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
                    return
                }
                Err(e) => panic!("io_uring_enter on {}: {e}", self.target.path().display()),
            }
        }
    }

    /// Sleeps in poll(2) until a caller signals the eventfd.
    fn wait_efd(&self) {
        let fd: RawFd = self.shared.efd.as_raw_fd();
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack.
        unsafe { libc::poll(&mut p, 1, -1) };
        self.shared.drain_efd();
    }
}
