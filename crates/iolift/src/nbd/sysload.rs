//! What the adaptive poll controller (`nbd/adapt.rs`) observes of the
//! machine and of the polling thread.
//!
//! - [`ThreadUsage::now`]: the calling thread's CPU time
//!   (`CLOCK_THREAD_CPUTIME_ID`) and involuntary context switches
//!   (`getrusage(RUSAGE_THREAD)`'s `ru_nivcsw`), read before and after a
//!   poll. A switch counted as involuntary includes a `sched_yield` that
//!   let another thread run: both mean someone else wanted the core.
//! - [`LoadSampler`]: whether threads are kept waiting for a CPU, from
//!   the kernel's CPU pressure (`/proc/pressure/cpu`; `/proc/loadavg`'s
//!   running count where the kernel has none), read at most every
//!   [`LOAD_EVERY`] by whichever connection asks first and shared by the
//!   server's connections, averaged over the last two reads.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the kernel's figures are read at most (one open, read and close,
/// a few microseconds).
pub const LOAD_EVERY: Duration = Duration::from_millis(20);

/// A thread's CPU time and involuntary context switches at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadUsage {
    pub cpu: Duration,
    pub nivcsw: u64,
}

impl ThreadUsage {
    /// The calling thread's. Zeros where the kernel refuses (never on
    /// Linux): the controller then sees no switches and full CPU time.
    pub fn now() -> ThreadUsage {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: both calls only write the struct they are given.
        let cpu = if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
        } else {
            Duration::ZERO
        };
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let nivcsw = if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } == 0 {
            ru.ru_nivcsw as u64
        } else {
            0
        };
        ThreadUsage { cpu, nivcsw }
    }
}

/// Share of wall time, in 1/1024ths, during which some thread waited for
/// a CPU, past which the machine counts as busy (1/5).
pub const STALL_BUSY: u32 = 1024 / 5;

/// Whether the machine's CPUs are wanted by more threads than they can
/// run, sampled now and then and shared by a server's connections.
///
/// The signal is the kernel's CPU pressure (`/proc/pressure/cpu`, "some"
/// line, `total=`: microseconds during which at least one runnable thread
/// waited for a CPU). Its growth between two reads over the wall time
/// between them is the share of that time someone was kept waiting: close
/// to 0 while the server and its clients fit the cores (a polling thread
/// and a client at queue depth 1 on two cores), close to 1 under a CPU
/// hog per core. It counts only waiting, so the threads that run (the
/// polling reader itself, fio) do not count against the cores, which the
/// running count of `/proc/loadavg` did. Kernels without pressure
/// accounting fall back to that running count less the reader, against
/// the cores.
#[derive(Debug)]
pub struct LoadSampler {
    /// Cores this process may run on.
    cores: u32,
    /// Nanoseconds since `t0` of the last read.
    last: AtomicU64,
    /// Pressure total (us) at the last read; `u64::MAX`: none read yet.
    total: AtomicU64,
    /// Average stall share over the last reads, in 1/1024ths.
    stall: AtomicU32,
    /// The pressure file could not be read: the running count is used.
    fallback: AtomicBool,
    /// A read is under way (one reader at a time).
    reading: AtomicBool,
    t0: Instant,
}

impl LoadSampler {
    pub fn new() -> LoadSampler {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        LoadSampler::with_cores(cores)
    }

    pub fn with_cores(cores: u32) -> LoadSampler {
        LoadSampler {
            cores: cores.max(1),
            last: AtomicU64::new(0),
            total: AtomicU64::new(u64::MAX),
            stall: AtomicU32::new(0),
            fallback: AtomicBool::new(false),
            reading: AtomicBool::new(false),
            t0: Instant::now(),
        }
    }

    /// Threads kept waiting for a CPU more than [`STALL_BUSY`] of the
    /// time, on average over the last reads (rereading the kernel's
    /// figures if the last read is older than [`LOAD_EVERY`]).
    pub fn busy(&self, now: Instant) -> bool {
        let ns = now.saturating_duration_since(self.t0).as_nanos() as u64;
        let last = self.last.load(Ordering::Relaxed);
        if (last == 0 || ns.saturating_sub(last) >= LOAD_EVERY.as_nanos() as u64)
            && !self.reading.swap(true, Ordering::Acquire)
        {
            self.sample(ns);
            self.last.store(ns.max(1), Ordering::Relaxed);
            self.reading.store(false, Ordering::Release);
        }
        self.stall() > STALL_BUSY
    }

    /// One read of the kernel's figures at `ns` since `t0`.
    fn sample(&self, ns: u64) {
        if !self.fallback.load(Ordering::Relaxed) {
            match pressure_total() {
                Some(total) => return self.add_pressure(ns, total),
                None => self.fallback.store(true, Ordering::Relaxed),
            }
        }
        if let Some(n) = running_now() {
            self.add_share(running_share(n, self.cores));
        }
    }

    /// Folds a pressure total read at `ns` into the average.
    fn add_pressure(&self, ns: u64, total_us: u64) {
        let prev = self.total.swap(total_us, Ordering::Relaxed);
        let last = self.last.load(Ordering::Relaxed);
        if prev == u64::MAX || last == 0 || ns <= last {
            return;
        }
        self.add_share(stall_share(total_us.saturating_sub(prev), ns - last));
    }

    /// Folds one share into the average (1/2 old, 1/2 new: two reads in
    /// a row decide).
    fn add_share(&self, share: u32) {
        let old = self.stall.load(Ordering::Relaxed);
        self.stall.store((old + share) / 2, Ordering::Relaxed);
    }

    /// The average stall share, in 1/1024ths (for the metrics).
    pub fn stall(&self) -> u32 {
        self.stall.load(Ordering::Relaxed)
    }
}

impl Default for LoadSampler {
    fn default() -> Self {
        LoadSampler::new()
    }
}

/// The share of `wall_ns` that `stalled_us` of pressure is, in 1/1024ths
/// (at most 1024: on several cores the kernel counts the time at least one
/// thread waited, never more than the wall time).
fn stall_share(stalled_us: u64, wall_ns: u64) -> u32 {
    let share = stalled_us.saturating_mul(1000 * 1024) / wall_ns.max(1);
    share.min(1024) as u32
}

/// The fallback's share: runnable threads besides the reader beyond the
/// cores, as a stall share (each thread beyond them a half).
fn running_share(running: u32, cores: u32) -> u32 {
    let beyond = running.saturating_sub(1).saturating_sub(cores);
    (beyond * 512).min(1024)
}

/// `/proc/pressure/cpu`'s "some" total, in microseconds.
fn pressure_total() -> Option<u64> {
    let mut f = std::fs::File::open("/proc/pressure/cpu").ok()?;
    let mut buf = [0u8; 256];
    let n = f.read(&mut buf).ok()?;
    parse_pressure(&buf[..n])
}

/// "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull ...": 1234.
fn parse_pressure(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let some = text.lines().find(|l| l.starts_with("some "))?;
    let total = some
        .split_ascii_whitespace()
        .find_map(|f| f.strip_prefix("total="))?;
    total.parse().ok()
}

/// `/proc/loadavg`'s running count ("0.52 0.58 0.59 3/467 12345": 3).
fn running_now() -> Option<u32> {
    let mut f = std::fs::File::open("/proc/loadavg").ok()?;
    let mut buf = [0u8; 128];
    let n = f.read(&mut buf).ok()?;
    parse_running(&buf[..n])
}

fn parse_running(text: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(text).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_running_count() {
        assert_eq!(parse_running(b"0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(parse_running(b"0.52 0.58 0.59 x/467 12345\n"), None);
        assert_eq!(parse_running(b"0.52 0.58\n"), None);
        // this machine's own file parses, and counts at least the reader
        assert!(running_now().expect("/proc/loadavg") >= 1);
    }

    #[test]
    fn pressure_line_parses() {
        let text = b"some avg10=1.50 avg60=0.20 avg300=0.05 total=123456\n\
                     full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_pressure(text), Some(123456));
        assert_eq!(parse_pressure(b"full avg10=0.00 total=5\n"), None);
        assert_eq!(parse_pressure(b"some avg10=0.00 total=x\n"), None);
        assert_eq!(parse_pressure(b""), None);
        // this machine's own file, where the kernel has one
        if std::path::Path::new("/proc/pressure/cpu").exists() {
            assert!(pressure_total().is_some(), "/proc/pressure/cpu unreadable");
        }
    }

    #[test]
    fn stall_shares() {
        // 5 ms of stall in 20 ms: a quarter
        assert_eq!(stall_share(5_000, 20_000_000), 256);
        assert_eq!(stall_share(0, 20_000_000), 0);
        // never past the whole
        assert_eq!(stall_share(40_000, 20_000_000), 1024);
        assert_eq!(stall_share(1, 0), 1024);
        // the fallback: the reader and one thread per core is not busy
        assert_eq!(running_share(3, 2), 0);
        assert_eq!(running_share(1, 2), 0);
        assert_eq!(running_share(4, 2), 512);
        assert!(running_share(6, 2) > STALL_BUSY);
    }

    #[test]
    fn busy_means_threads_kept_waiting_in_two_reads() {
        let s = LoadSampler::with_cores(2);
        let ms = 1_000_000u64;
        // the first read only sets the origin
        s.add_pressure(ms, 1_000);
        s.last.store(ms, Ordering::Relaxed);
        assert_eq!(s.stall(), 0);
        // 1 ms waiting in 20: quiet
        s.add_pressure(21 * ms, 2_000);
        s.last.store(21 * ms, Ordering::Relaxed);
        assert!(s.stall() <= STALL_BUSY, "{}", s.stall());
        // all 20 ms, twice: busy
        s.add_pressure(41 * ms, 22_000);
        s.last.store(41 * ms, Ordering::Relaxed);
        s.add_pressure(61 * ms, 42_000);
        s.last.store(61 * ms, Ordering::Relaxed);
        assert!(s.stall() > STALL_BUSY, "{}", s.stall());
        // quiet again for two reads: not busy
        s.add_pressure(81 * ms, 42_000);
        s.last.store(81 * ms, Ordering::Relaxed);
        s.add_pressure(101 * ms, 42_100);
        assert!(s.stall() <= STALL_BUSY, "{}", s.stall());
    }

    /// The controller fed by the sampler: a client and a polling reader
    /// that fit the cores (a little pressure) poll; a CPU hog per core
    /// makes it back off for the load; quiet again, it polls again once
    /// the back-off period ends.
    #[test]
    fn the_controller_polls_on_a_quiet_machine_and_backs_off_under_hogs() {
        use super::super::adapt::{Controller, Reason, Verdict, MAX_LEVEL};
        let s = LoadSampler::with_cores(2);
        let mut c = Controller::new();
        let t0 = Instant::now();
        let gap = Duration::from_micros(15);
        let ms = 1_000_000u64;
        let mut total = 1_000u64;
        let mut read = |ns: u64, stalled_us: u64| {
            total += stalled_us;
            s.add_pressure(ns, total);
            s.last.store(ns, Ordering::Relaxed);
            s.stall() > STALL_BUSY
        };
        read(ms, 0);
        // quiet: 0.3 ms of stall per 20 ms read, a second of polls
        for k in 1..=50u64 {
            let busy = read(ms + k * 20 * ms, 300);
            let now = t0 + Duration::from_millis(k * 20);
            assert!(
                matches!(c.admit(now, gap, busy), Verdict::Poll(_)),
                "read {k}"
            );
        }
        // hogs: someone waits all the time; the second read decides
        let mut backed = None;
        for k in 51..=53u64 {
            let busy = read(ms + k * 20 * ms, 20_000);
            let now = t0 + Duration::from_millis(k * 20);
            if let Verdict::BackoffNow(r) = c.admit(now, gap, busy) {
                backed = backed.or(Some(r));
            }
        }
        assert_eq!(backed, Some(Reason::Load));
        // quiet again: polls again within the longest back-off period
        let mut polls = false;
        for k in 54..=54 + (10 << MAX_LEVEL) / 20 + 2 {
            let busy = read(ms + k * 20 * ms, 200);
            let now = t0 + Duration::from_millis(k * 20);
            polls |= matches!(c.admit(now, gap, busy), Verdict::Poll(_));
        }
        assert!(polls, "never polled again on a quiet machine");
    }

    /// On this machine, under a CPU hog per core, the sampler reads busy
    /// (where the kernel accounts pressure).
    #[test]
    fn cpu_hogs_read_busy() {
        if !std::path::Path::new("/proc/pressure/cpu").exists() {
            eprintln!("skipped: this kernel has no /proc/pressure/cpu");
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        // two hogs per core: someone always waits
        let hogs: Vec<_> = (0..cores * 2 + 1)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                })
            })
            .collect();
        let s = LoadSampler::new();
        let t0 = Instant::now();
        let mut busy = false;
        while !busy && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(LOAD_EVERY);
            busy = s.busy(Instant::now());
        }
        stop.store(true, Ordering::Relaxed);
        for h in hogs {
            h.join().unwrap();
        }
        assert!(busy, "stall share {} under hogs", s.stall());
    }

    #[test]
    fn thread_usage_counts_cpu_time() {
        let a = ThreadUsage::now();
        let t0 = Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = ThreadUsage::now();
        assert!(b.cpu > a.cpu, "{a:?} {b:?}");
        assert!(b.nivcsw >= a.nivcsw);
    }
}
