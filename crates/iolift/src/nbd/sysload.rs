//! What the adaptive poll controller (`nbd/adapt.rs`) observes of the
//! machine and of the polling thread.
//!
//! - [`ThreadUsage::now`]: the calling thread's CPU time
//!   (`CLOCK_THREAD_CPUTIME_ID`) and involuntary context switches
//!   (`getrusage(RUSAGE_THREAD)`'s `ru_nivcsw`), read before and after a
//!   poll. A switch counted as involuntary includes a `sched_yield` that
//!   let another thread run: both mean someone else wanted the core.
//! - [`LoadSampler`]: whether more threads are runnable than there are
//!   cores, from `/proc/loadavg`'s running count (the kernel's count of
//!   runnable threads at the moment it is read, the reader included),
//!   read at most every [`LOAD_EVERY`] by whichever connection asks first
//!   and shared by the server's connections, averaged over the last few
//!   reads.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often `/proc/loadavg` is read at most (one open, read and close,
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

/// The machine's runnable threads against its cores, sampled now and then.
#[derive(Debug)]
pub struct LoadSampler {
    /// Cores this process may run on.
    cores: u32,
    /// Nanoseconds since `t0` of the last read.
    last: AtomicU64,
    /// Average running count over the last reads, in 1/16ths.
    running16: AtomicU32,
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
            running16: AtomicU32::new(0),
            reading: AtomicBool::new(false),
            t0: Instant::now(),
        }
    }

    /// More runnable threads than cores, on average over the last reads
    /// (rereading `/proc/loadavg` if the last read is older than
    /// [`LOAD_EVERY`]). The caller, which is running, counts as one.
    pub fn busy(&self, now: Instant) -> bool {
        let ns = now.saturating_duration_since(self.t0).as_nanos() as u64;
        let last = self.last.load(Ordering::Relaxed);
        if (last == 0 || ns.saturating_sub(last) >= LOAD_EVERY.as_nanos() as u64)
            && !self.reading.swap(true, Ordering::Acquire)
        {
            if let Some(n) = running_now() {
                self.add(n);
            }
            self.last.store(ns.max(1), Ordering::Relaxed);
            self.reading.store(false, Ordering::Release);
        }
        over(self.running16.load(Ordering::Relaxed), self.cores)
    }

    /// Folds one running count into the average (1/2 old, 1/2 new: two
    /// reads in a row decide).
    fn add(&self, running: u32) {
        let old = self.running16.load(Ordering::Relaxed);
        let new = if self.last.load(Ordering::Relaxed) == 0 {
            running * 16
        } else {
            (old + running * 16) / 2
        };
        self.running16.store(new, Ordering::Relaxed);
    }

    /// The average running count (for the metrics), in 1/16ths.
    pub fn running16(&self) -> u32 {
        self.running16.load(Ordering::Relaxed)
    }
}

impl Default for LoadSampler {
    fn default() -> Self {
        LoadSampler::new()
    }
}

/// Runnable threads beyond the cores: an average above cores + 1/2.
fn over(running16: u32, cores: u32) -> bool {
    running16 > cores * 16 + 8
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
    fn busy_means_more_runnable_than_cores_in_two_reads() {
        let s = LoadSampler::with_cores(2);
        s.add(2);
        s.last.store(1, Ordering::Relaxed);
        assert!(!over(s.running16(), 2), "2 running on 2 cores is not busy");
        s.add(4);
        assert!(over(s.running16(), 2), "{}", s.running16());
        s.add(1);
        s.add(2);
        assert!(!over(s.running16(), 2), "{}", s.running16());
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
