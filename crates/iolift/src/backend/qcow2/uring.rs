//! `engine=uring`: cache hits go to the image file through io_uring,
//! started from the thread that took the request off the connection, with
//! no worker pool in between.
//!
//! Each data path has two [`Engine`]s (iolift-direct's io_uring engine,
//! each with the image opened once more with O_DIRECT as the ring's
//! registered file and registered buffers of [`BUF_SIZE`] bytes for
//! READ_FIXED / WRITE_FIXED):
//!
//! - the threaded one (a ring of 256 entries, `bufs` buffers, one
//!   completion thread): the request is queued, the engine's thread puts
//!   everything queued into the ring with one `io_uring_enter` (batching
//!   at depth), and on completion unpins, records the hit's latency and
//!   calls the front-end's callback, which writes the reply from that
//!   thread;
//! - the inline one (a ring of 8 entries, 2 buffers, no thread): used when
//!   the request is alone on its data path (`backend/alone.rs`) and
//!   `spin_us` is set; the submitting thread puts it into the ring,
//!   submits it and waits for its completion with one `io_uring_enter`
//!   (GETEVENTS, min_complete 1), spinning on the completion ring first,
//!   then answers it itself. At queue depth 1 that removes the hand-off
//!   to the ring's thread and back.
//!
//! "Alone" (`backend/alone.rs`, one gate per data path) also needs the
//! request's connection to have nothing else in flight
//! ([`ConnDepth`]): with placement=worker a connection's reader moves
//! between runtime threads and so between data paths.
//!
//! With `spin_us=0` (the default) a request alone on its path does not use
//! a ring at all: the submitting thread reads or writes the host range
//! with a blocking `pread` / `pwrite` on the inline engine's O_DIRECT
//! descriptor, into one of its registered buffers (plain aligned memory
//! here), and answers. That is what the raw file export does with a lone
//! request (`backend/file.rs`); on this VM it answers a QD 1 read about
//! 15 us sooner than submitting to a ring and waiting there (see
//! docs/measurements/qcow2.md). The mapping stays pinned until the call
//! returns, exactly as for a ring's I/O, so an invalidation waits for it.
//!
//! A read, or an in-place write without FUA, whose mapping
//! [`DataPath::try_hit`] finds in the path's cache goes to one of those
//! with its mapping pinned until it completes. A miss alone on its path
//! is translated on the submitting thread ([`DataPath::translate_hit`]:
//! the control plane's lock, the L2 entry, the mapping put in the path's
//! cache pinned) and then does its I/O as a lone hit would (pread /
//! pwrite, or the inline ring with `spin_us`), so a miss costs a
//! translation more than a hit and no more (no bounce buffer, no copy).
//! Everything else (misses at depth, allocating writes,
//! FUA, trim, flush, ...) is handed back to the caller (`mod.rs`), which
//! runs it on the submitting thread when it is alone on its path (the
//! same rule) and on the blocking pool otherwise, on the same data path,
//! so its translation warms the cache the next hit looks in. A miss at
//! depth is not translated on the submitting thread: the control plane's
//! lock can be held for a while (a compaction round, a snapshot), and
//! the reader would stop reading the connection meanwhile.
//!
//! Memory: per data path two rings (256 and 8 entries) and `bufs` + 2
//! 16 KiB registered (locked) buffers; requests larger than a buffer, or
//! when all are taken, use an aligned buffer of their own size for the
//! request's life.

use super::lat::Latency;
use super::place::ConnDepth;
use crate::backend::alone::Alone;
use crate::block::{Callback, Errno, Reply, Request};
use anyhow::{Context, Result};
use bytes::Bytes;
use iolift_direct::{Config, Direct, Done, Engine, Op, Open, Target};
use iolift_qcow2::{DataPath, Served};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size of each registered buffer (a 4 KiB request and up to 16 KiB).
pub const BUF_SIZE: usize = 16 << 10;
/// Registered buffers of each inline ring (it runs one request at a time).
const INLINE_BUFS: usize = 2;
/// How a request should run, as [`Uring::start`] decided.
pub enum Start {
    /// Started on a ring; the callback will be called.
    Started,
    /// Not a hit, alone on its path: run it on this thread.
    Here(Request, Callback),
    /// Not a hit, with others in flight: run it on the blocking pool.
    Pool(Request, Callback),
}

/// Counters of the rings of every path, summed.
#[derive(Debug, Default, Clone, Copy)]
pub struct UringStats {
    /// Requests completed by the rings (both kinds).
    pub ops: u64,
    /// `io_uring_enter` calls (both kinds).
    pub enters: u64,
    /// The largest batch one submission put into a threaded ring.
    pub max_batch: u64,
    /// Hits the submitting thread ran on its path's inline ring.
    pub inline_hits: u64,
    /// Misses alone on their path translated on the submitting thread,
    /// their I/O then on its inline ring.
    pub inline_misses: u64,
    /// Other requests (allocating writes, flushes, misses of clusters
    /// that are not data) run on the submitting thread because they were
    /// alone on their path.
    pub inline_other: u64,
    /// Lone hits and misses (counted above too) whose I/O was a blocking
    /// pread / pwrite on the submitting thread instead of the inline ring
    /// (`spin_us=0`).
    pub inline_sync: u64,
}

struct PathRing {
    eng: Engine,
    inline: Engine,
    /// Whether a request is alone on this path (`backend/alone.rs`).
    depth: Alone,
    inline_hits: AtomicU64,
    inline_misses: AtomicU64,
    inline_other: AtomicU64,
    inline_sync: AtomicU64,
    /// A lone hit's I/O is a blocking pread / pwrite on the submitting
    /// thread (`spin_us=0`) rather than a submission to the inline ring
    /// (which spins on its completion).
    sync: bool,
}

pub struct Uring {
    paths: Vec<Arc<PathRing>>,
    /// Requests in flight per connection: a request runs on the reading
    /// thread only if its connection has nothing else in flight, too.
    conns: Arc<ConnDepth>,
}

fn engine(path: &Path, read_only: bool, cfg: Config) -> Result<Engine> {
    let t = Target::open(
        path,
        &Open {
            read: true,
            write: !read_only,
            direct: Direct::On,
            create_size: None,
        },
    )
    .with_context(|| format!("engine=uring: cannot open {} with O_DIRECT", path.display()))?;
    Engine::new(t, cfg).context("engine=uring")
}

impl Uring {
    /// Two engines per data path on the image at `path`; `gap`: see
    /// [`Uring::gap`]; `spin_us`: how long the inline ring spins on its
    /// completion before sleeping (0: not at all).
    pub fn open(
        path: &Path,
        paths: usize,
        read_only: bool,
        bufs: usize,
        gap: Option<Duration>,
        spin_us: u32,
    ) -> Result<Uring> {
        let mut v = Vec::with_capacity(paths);
        for _ in 0..paths {
            let eng = engine(
                path,
                read_only,
                Config {
                    fixed_bufs: bufs,
                    fixed_buf_size: BUF_SIZE,
                    ..Config::default()
                },
            )?;
            let inline = engine(
                path,
                read_only,
                Config {
                    entries: 8,
                    fixed_bufs: INLINE_BUFS,
                    fixed_buf_size: BUF_SIZE,
                    inline: true,
                    spin_us,
                    ..Config::default()
                },
            )?;
            v.push(Arc::new(PathRing {
                eng,
                inline,
                depth: Alone::new(gap),
                inline_hits: AtomicU64::new(0),
                inline_misses: AtomicU64::new(0),
                inline_other: AtomicU64::new(0),
                inline_sync: AtomicU64::new(0),
                sync: spin_us == 0,
            }));
        }
        Ok(Uring {
            paths: v,
            conns: Arc::default(),
        })
    }

    pub fn stats(&self) -> UringStats {
        self.paths.iter().fold(UringStats::default(), |a, p| {
            let (s, i) = (p.eng.stats(), p.inline.stats());
            UringStats {
                ops: a.ops + s.ops + i.ops,
                enters: a.enters + s.enters + i.enters,
                max_batch: a.max_batch.max(s.max_batch),
                inline_hits: a.inline_hits + p.inline_hits.load(Ordering::Relaxed),
                inline_misses: a.inline_misses + p.inline_misses.load(Ordering::Relaxed),
                inline_other: a.inline_other + p.inline_other.load(Ordering::Relaxed),
                inline_sync: a.inline_sync + p.inline_sync.load(Ordering::Relaxed),
            }
        })
    }

    /// Starts `req` on data path `w` (see the top). The callback given
    /// back with [`Start::Here`] or [`Start::Pool`] must be called with the
    /// request's completion: it counts the request out of its path.
    pub fn start(
        self: &Arc<Self>,
        w: usize,
        dp: &DataPath,
        lat: &Arc<Latency>,
        req: Request,
        cb: Callback,
    ) -> Start {
        let p = self.paths[w % self.paths.len()].clone();
        let t0 = Instant::now();
        // Alone: nothing else in flight on the path, nor of the connection
        // (whose reader may have run on another path's thread before).
        let (conn, conn_idle) = self.conns.enter();
        let alone = p.depth.enter(t0) && conn_idle;
        // Counts the request out of its connection, answers, then counts
        // it out of its path.
        let (pr, conns) = (p.clone(), self.conns.clone());
        let cb: Callback = Box::new(move |r| {
            conns.leave(conn);
            cb(r);
            pr.depth.leave();
        });
        let eng = if alone { &p.inline } else { &p.eng };
        // The host range of a read or in-place write the cache can place
        // (a hit); for a request alone on its path, a miss is translated
        // here and does its I/O the same way.
        let io = match &req {
            Request::Read { offset, len } => Some((*offset, *len as usize, false)),
            Request::Write {
                offset,
                data,
                flags,
            } if !flags.fua => Some((*offset, data.len(), true)),
            _ => None,
        };
        let mut found = io.and_then(|(o, n, w)| dp.try_hit(o, n, w).map(|h| (h, Served::Hit)));
        if let (None, true, Some((o, n, w))) = (&found, alone, io) {
            match dp.translate_hit(o, n, w) {
                Ok(f) => found = f,
                Err(e) => {
                    cb(Err(super::errno(e)));
                    return Start::Started;
                }
            }
            if found.is_some() {
                p.inline_misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        let op = found.map(|(h, how)| match &req {
            Request::Write { data, .. } => {
                let mut buf = eng.alloc(data.len());
                buf.copy_from_slice(data);
                let offset = h.host;
                (h, how, Op::Write { offset, buf }, data.len(), false)
            }
            _ => {
                let len = io.map_or(0, |(_, n, _)| n);
                let (offset, buf) = (h.host, eng.alloc(len));
                (h, how, Op::Read { offset, buf }, len, true)
            }
        });
        let Some((hit, how, op, len, read)) = op else {
            return if alone {
                p.inline_other.fetch_add(1, Ordering::Relaxed);
                Start::Here(req, cb)
            } else {
                Start::Pool(req, cb)
            };
        };
        let lat = lat.clone();
        let done: iolift_direct::Callback = Box::new(move |d: Done| {
            drop(hit);
            let r = if read {
                read_reply(d, len)
            } else {
                match d.result() {
                    Ok(n) if n == len => Ok(Reply::Done(len as u64)),
                    Ok(_) => Err(Errno::EIO),
                    Err(e) => Err(Errno::from_io(&e)),
                }
            };
            lat.record(w, how, t0.elapsed());
            cb(r)
        });
        if alone && how == Served::Hit {
            p.inline_hits.fetch_add(1, Ordering::Relaxed);
        }
        if alone && p.sync {
            // Blocking pread / pwrite on this thread (no ring round trip);
            // the pin is held until it returns.
            p.inline_sync.fetch_add(1, Ordering::Relaxed);
            done(sync_io(p.inline.target().file(), op));
        } else {
            // Inline: submits, waits and calls `done` before returning.
            eng.submit(op, done);
        }
        Start::Started
    }
}

/// Runs `op` with a blocking pread / pwrite on the file (opened with
/// O_DIRECT; the buffer is aligned, as for the ring), with the result the
/// ring would give: a read stops at the end of the file (its result says
/// how many bytes came), a write writes everything or fails.
fn sync_io(f: &std::fs::File, op: Op) -> Done {
    use std::os::unix::fs::FileExt;
    let (res, buf) = match op {
        Op::Read { offset, mut buf } => {
            // One call, as one ring read: short only at the end of the
            // file (a retry there would be unaligned for O_DIRECT).
            let r = loop {
                match f.read_at(&mut buf, offset) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    r => break r,
                }
            };
            (r, Some(buf))
        }
        Op::Write { offset, buf } => {
            let r = f.write_all_at(&buf, offset).map(|_| buf.len());
            (r, Some(buf))
        }
        Op::Flush => (Err(std::io::Error::from_raw_os_error(libc::EINVAL)), None),
    };
    let res = match res {
        Ok(n) => n.min(i32::MAX as usize) as i32,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    };
    Done { res, buf }
}

/// The read's bytes; past a short read (a data cluster the file does not
/// fully hold), zeroes, as the synchronous path reads them.
fn read_reply(d: Done, len: usize) -> Result<Reply, Errno> {
    let n = d.result().map_err(|e| Errno::from_io(&e))?;
    let Some(mut buf) = d.buf else {
        return Err(Errno::EIO);
    };
    if n < len {
        buf[n..len].fill(0);
    }
    Ok(Reply::Data(Bytes::from_owner(buf)))
}
