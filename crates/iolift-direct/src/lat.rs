//! Latency in a single-threaded tight loop (HAYAGUI's Figure 5): one
//! request at a time at random offsets aligned to the request size, each
//! timed, over
//! - [`Path::Uring`]: the io_uring engine in inline mode (the caller
//!   submits and reaps on its own ring: one `io_uring_enter` per request,
//!   no thread hand-off) on a file or block device, with one registered
//!   buffer and the registered file; write+sync = a write then a flush;
//! - [`Path::Posix`]: pread(2) / pwrite(2) / fdatasync(2) on the same;
//! - [`Path::Accelfs`]: a file of AccelFS on the engine in inline mode
//!   (write+sync = hard sync).
//!
//! A raw file or device should be filled by the caller first (reads of a
//! hole cost no I/O); the AccelFS file is written in full here first.

use crate::buf::AlignedBuf;
use crate::engine::{Config, Engine, Op};
use crate::fs::Fs;
use crate::target::{Direct, Open, Target};
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Uring,
    Posix,
    Accelfs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatOp {
    Read,
    Write,
    WriteSync,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct LatSpec {
    pub path: Path,
    pub op: LatOp,
    /// Request size.
    pub bs: usize,
    pub count: usize,
    /// Bytes the offsets range over (for AccelFS: the file's size).
    pub span: u64,
    pub direct: Direct,
    pub seed: u64,
    /// Engine and AccelFS paths: a kernel thread polls the submission
    /// queue, sleeping after this many idle milliseconds.
    pub sqpoll: Option<u32>,
    /// Engine and AccelFS paths: spin on the completion ring this many
    /// microseconds before sleeping ([`Config::spin_us`]).
    pub spin_us: u32,
    /// Engine and AccelFS paths, without SQPOLL and spinning: completions
    /// are posted when the caller waits ([`Config::defer_taskrun`]).
    pub defer_taskrun: bool,
}

/// Latencies in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatResult {
    pub ops: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// CPU time (user + system, every thread of the process) per request,
    /// in microseconds: the cost of issuing and completing it, which a
    /// loaded machine does not inflate the way it inflates wall time.
    pub cpu_us: f64,
}

/// CPU time of the whole process (every thread) so far, in microseconds.
fn cpu_now_us() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

fn summary(mut ns: Vec<u64>, cpu_us: f64) -> LatResult {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    LatResult {
        ops: ns.len(),
        mean_us: ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0,
        p50_us: at(0.5),
        p99_us: at(0.99),
        cpu_us: cpu_us / ns.len() as f64,
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Runs `spec` on `target` (a file or block device; for [`Path::Accelfs`]
/// an AccelFS image, where the file `/lat` is made or replaced).
pub fn measure(target: &std::path::Path, spec: &LatSpec) -> io::Result<LatResult> {
    let bs = spec.bs;
    if bs == 0 || !bs.is_multiple_of(4096) || bs > 16 << 20 {
        return Err(bad(format!(
            "request size {bs}: a multiple of 4096, at most 16 MiB"
        )));
    }
    if spec.count == 0 {
        return Err(bad("count 0".into()));
    }
    let t = Target::open(
        target,
        &Open {
            direct: spec.direct,
            ..Open::default()
        },
    )?;
    let span = match spec.path {
        Path::Accelfs => spec.span,
        _ => spec.span.min(t.size()),
    } / bs as u64;
    if span == 0 {
        return Err(bad(format!("span smaller than one request of {bs} bytes")));
    }
    let mut x = spec.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut offset = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % span) * bs as u64
    };
    let mut pattern = AlignedBuf::new(bs);
    pattern
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let mut buf = AlignedBuf::new(bs);
    buf.copy_from_slice(&pattern);
    let writes = spec.op != LatOp::Read;
    let mut ns = Vec::with_capacity(spec.count);
    // CPU time of the timed requests only (setup and filling excluded).
    let mut cpu = 0.0;
    match spec.path {
        Path::Posix => {
            let f = t.file();
            for _ in 0..spec.count {
                let off = offset();
                if writes {
                    buf.copy_from_slice(&pattern);
                }
                let c0 = cpu_now_us();
                let t0 = Instant::now();
                match spec.op {
                    LatOp::Read => {
                        f.read_at(&mut buf, off)?;
                    }
                    LatOp::Write => f.write_all_at(&buf, off)?,
                    LatOp::WriteSync => {
                        f.write_all_at(&buf, off)?;
                        f.sync_data()?;
                    }
                }
                ns.push(t0.elapsed().as_nanos() as u64);
                cpu += cpu_now_us() - c0;
            }
        }
        Path::Uring => {
            let eng = Engine::new(
                t,
                Config {
                    fixed_bufs: 1,
                    fixed_buf_size: bs,
                    inline: true,
                    sqpoll: spec.sqpoll,
                    spin_us: spec.spin_us,
                    defer_taskrun: spec.defer_taskrun,
                    ..Config::default()
                },
            )?;
            let mut b = eng.alloc(bs);
            for _ in 0..spec.count {
                let off = offset();
                if writes {
                    b.copy_from_slice(&pattern);
                }
                let c0 = cpu_now_us();
                let t0 = Instant::now();
                let op = match spec.op {
                    LatOp::Read => Op::Read {
                        offset: off,
                        buf: b,
                    },
                    _ => Op::Write {
                        offset: off,
                        buf: b,
                    },
                };
                let d = eng.run(op).wait();
                d.result()?;
                if spec.op == LatOp::WriteSync {
                    eng.flush().wait().result()?;
                }
                ns.push(t0.elapsed().as_nanos() as u64);
                cpu += cpu_now_us() - c0;
                b = d.buf.expect("the engine gives the buffer back");
            }
        }
        Path::Accelfs => {
            let cfg = Config {
                inline: true,
                sqpoll: spec.sqpoll,
                spin_us: spec.spin_us,
                defer_taskrun: spec.defer_taskrun,
                ..Config::default()
            };
            let mut fs = Fs::mount(Engine::new(t, cfg)?)?;
            if fs.stat("/lat").is_ok() {
                fs.remove("/lat")?;
            }
            fs.create("/lat")?;
            let mut f = fs.open("/lat")?;
            for i in 0..span {
                fs.write(&mut f, i * bs as u64, &buf)?;
            }
            fs.sync_hard(&mut f)?;
            for _ in 0..spec.count {
                let off = offset();
                if writes {
                    buf.copy_from_slice(&pattern);
                }
                let c0 = cpu_now_us();
                let t0 = Instant::now();
                match spec.op {
                    LatOp::Read => {
                        fs.read(&mut f, off, &mut buf)?;
                    }
                    LatOp::Write => fs.write(&mut f, off, &buf)?,
                    LatOp::WriteSync => {
                        fs.write(&mut f, off, &buf)?;
                        fs.sync_hard(&mut f)?;
                    }
                }
                ns.push(t0.elapsed().as_nanos() as u64);
                cpu += cpu_now_us() - c0;
            }
            fs.close(f)?;
            fs.unmount()?;
        }
    }
    Ok(summary(ns, cpu))
}
