//! `engine=uring`: cache hits go to the image file through io_uring,
//! started from the thread that took the request off the connection and
//! answered from the ring's completion thread, with no worker pool in
//! between.
//!
//! Each data path has its own [`Engine`] (iolift-direct's io_uring engine:
//! one ring, one completion thread, the image opened once more with
//! O_DIRECT as the ring's registered file, and `bufs` registered buffers
//! of [`BUF_SIZE`] bytes for READ_FIXED / WRITE_FIXED). A read, or an
//! in-place write without FUA, whose mapping [`DataPath::try_hit`] finds
//! in the path's cache is queued on that engine with its mapping pinned;
//! the engine's thread puts everything queued into the ring with one
//! `io_uring_enter` (batching at depth), and on completion unpins,
//! records the hit's latency and calls the front-end's callback, which
//! writes the reply from that thread. Everything else (misses, allocating
//! writes, FUA, trim, flush, ...) is handed back to the blocking-pool path
//! on the same data path, so its translation warms the cache the next hit
//! looks in.
//!
//! Memory: per data path one ring (256 entries) and `bufs` x 16 KiB of
//! registered (locked) buffers; requests larger than a buffer, or when all
//! are taken, use an aligned buffer of their own size for the request's
//! life.

use super::lat::Latency;
use crate::block::{Callback, Errno, Reply, Request};
use anyhow::{Context, Result};
use bytes::Bytes;
use iolift_direct::{Config, Direct, Done, Engine, Op, Open, Target};
use iolift_qcow2::{DataPath, Served};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Size of each registered buffer (a 4 KiB request and up to 16 KiB).
pub const BUF_SIZE: usize = 16 << 10;

pub struct Uring {
    engines: Vec<Engine>,
}

impl Uring {
    /// One engine per data path on the image at `path`.
    pub fn open(path: &Path, paths: usize, read_only: bool, bufs: usize) -> Result<Uring> {
        let mut engines = Vec::with_capacity(paths);
        for _ in 0..paths {
            let t = Target::open(
                path,
                &Open {
                    read: true,
                    write: !read_only,
                    direct: Direct::On,
                    create_size: None,
                },
            )
            .with_context(|| {
                format!("engine=uring: cannot open {} with O_DIRECT", path.display())
            })?;
            let cfg = Config {
                fixed_bufs: bufs,
                fixed_buf_size: BUF_SIZE,
                ..Config::default()
            };
            engines.push(Engine::new(t, cfg).context("engine=uring")?);
        }
        Ok(Uring { engines })
    }

    /// Requests completed, `io_uring_enter` calls and the largest batch,
    /// summed (batch: the largest) over the paths' engines.
    pub fn stats(&self) -> (u64, u64, u64) {
        self.engines.iter().fold((0, 0, 0), |(o, e, b), g| {
            let s = g.stats();
            (o + s.ops, e + s.enters, b.max(s.max_batch))
        })
    }

    /// Starts `req` on data path `w`'s engine when `dp`'s cache places it
    /// (see the top); otherwise gives `req` and `cb` back.
    pub fn try_submit(
        &self,
        w: usize,
        dp: &DataPath,
        lat: &Arc<Latency>,
        req: Request,
        cb: Callback,
    ) -> Option<(Request, Callback)> {
        let eng = &self.engines[w % self.engines.len()];
        let t0 = Instant::now();
        match req {
            Request::Read { offset, len } => {
                let Some(hit) = dp.try_hit(offset, len as usize, false) else {
                    return Some((req, cb));
                };
                let len = len as usize;
                let buf = eng.alloc(len);
                let lat = lat.clone();
                eng.submit(
                    Op::Read {
                        offset: hit.host,
                        buf,
                    },
                    Box::new(move |d: Done| {
                        drop(hit);
                        let r = read_reply(d, len);
                        lat.record(w, Served::Hit, t0.elapsed());
                        cb(r)
                    }),
                );
                None
            }
            Request::Write {
                offset,
                ref data,
                flags,
            } if !flags.fua => {
                let Some(hit) = dp.try_hit(offset, data.len(), true) else {
                    return Some((req, cb));
                };
                let len = data.len();
                let mut buf = eng.alloc(len);
                buf.copy_from_slice(data);
                let lat = lat.clone();
                eng.submit(
                    Op::Write {
                        offset: hit.host,
                        buf,
                    },
                    Box::new(move |d: Done| {
                        drop(hit);
                        let r = match d.result() {
                            Ok(n) if n == len => Ok(Reply::Done(len as u64)),
                            Ok(_) => Err(Errno::EIO),
                            Err(e) => Err(Errno::from_io(&e)),
                        };
                        lat.record(w, Served::Hit, t0.elapsed());
                        cb(r)
                    }),
                );
                None
            }
            other => Some((other, cb)),
        }
    }
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
