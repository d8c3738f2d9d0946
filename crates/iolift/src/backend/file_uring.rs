//! The file backend's io_uring engine:
//! `file:PATH,engine=uring[,sqpoll][,rings=N]`.
//!
//! Reads, writes and flushes go through one [`iolift_direct::Engine`] (its
//! own descriptor of the same file, with O_DIRECT when the backend has
//! `direct`); trims, write-zeroes, cache hints, block status and, with
//! `direct`, requests not aligned to the device's block size go to the
//! file backend's thread-pool path as before ([`UringFile::try_submit`]
//! hands them back). Completions call back from the engine's thread, so
//! the NBD front-end can write a reply from there (native callbacks).
//!
//! - A read's buffer becomes the reply's `Bytes` without a copy. A short
//!   read (the file ends before the device's size) leaves the rest zero,
//!   as the thread-pool path does.
//! - A write's payload is written from the received `Bytes` as it is; with
//!   O_DIRECT it is copied into an aligned buffer first when its memory is
//!   not aligned. A short write fails with EIO. A FUA write is followed by
//!   a flush before it completes.
//! - A flush is IORING_OP_FSYNC with DATASYNC on the same file, so it
//!   covers the writes of both paths (and of every ring) that completed
//!   before it.
//! - `rings=N` starts N engines (N rings, N threads) and hands requests to
//!   them in turn. io_uring runs a write it cannot issue without blocking
//!   on a worker thread of the submitting ring, and one ring's workers run
//!   the writes to one file one at a time; N rings have N sets of workers.

use crate::block::{Callback, Errno, Reply, Request};
use anyhow::{Context, Result};
use bytes::Bytes;
use iolift_direct::{AlignedBuf, Buf, Config, Direct, Done, Engine, Op, Open, Target};
use std::path::Path;
use std::sync::Arc;

/// The io_uring path of one file backend.
pub struct UringFile {
    engines: Vec<Arc<Engine>>,
    next: std::sync::atomic::AtomicUsize,
    /// The alignment O_DIRECT needs (1 without it).
    align: u64,
}

impl UringFile {
    /// Opens `path` (which the file backend has created or checked) for the
    /// engine. `sqpoll`: a kernel thread polls the submission queue.
    /// `rings` (>= 1): engines to spread requests over.
    pub fn open(
        path: &Path,
        direct: bool,
        read_only: bool,
        sqpoll: bool,
        rings: usize,
    ) -> Result<UringFile> {
        let mut engines = Vec::new();
        let mut align = 1;
        for _ in 0..rings.max(1) {
            let t = Target::open(
                path,
                &Open {
                    read: true,
                    write: !read_only,
                    direct: if direct { Direct::On } else { Direct::Off },
                    create_size: None,
                },
            )
            .with_context(|| {
                format!("file backend: engine=uring: cannot open {}", path.display())
            })?;
            align = t.align() as u64;
            let cfg = Config {
                sqpoll: sqpoll.then_some(1000),
                ..Config::default()
            };
            let eng = Engine::new(t, cfg).context("file backend: engine=uring")?;
            engines.push(Arc::new(eng));
        }
        Ok(UringFile {
            engines,
            next: 0.into(),
            align,
        })
    }

    /// The next engine in turn.
    fn eng(&self) -> &Arc<Engine> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.engines[i % self.engines.len()]
    }

    /// Starts `req` on the ring and calls `cb` with its completion, or gives
    /// both back when this path does not take the request. The range and
    /// the read-only check have been done by the caller.
    pub fn try_submit(&self, req: Request, cb: Callback) -> Option<(Request, Callback)> {
        let aligned =
            |off: u64, len: u64| off.is_multiple_of(self.align) && len.is_multiple_of(self.align);
        match req {
            Request::Read { offset, len } if aligned(offset, len as u64) => {
                let len = len as usize;
                let buf = Buf::Aligned(AlignedBuf::new(len));
                self.eng().submit(
                    Op::Read { offset, buf },
                    Box::new(move |d: Done| cb(read_reply(d, len))),
                );
                None
            }
            Request::Write {
                offset,
                data,
                flags,
            } if aligned(offset, data.len() as u64) => {
                let len = data.len();
                let buf = if self.align > 1
                    && !(data.as_ptr() as usize).is_multiple_of(iolift_direct::ALIGN)
                {
                    let mut b = AlignedBuf::new(len);
                    b.copy_from_slice(&data);
                    Buf::Aligned(b)
                } else {
                    Buf::Shared(Box::new(data))
                };
                let eng = self.eng();
                let fua = flags.fua.then(|| eng.clone());
                eng.submit(
                    Op::Write { offset, buf },
                    Box::new(move |d: Done| match (write_reply(d, len), fua) {
                        (Ok(r), Some(eng)) => eng.submit(
                            Op::Flush,
                            Box::new(move |f: Done| cb(status(f.res).map(|_| r))),
                        ),
                        (r, _) => cb(r),
                    }),
                );
                None
            }
            Request::Flush => {
                self.eng().submit(
                    Op::Flush,
                    Box::new(move |d: Done| cb(status(d.res).map(|_| Reply::Done(0)))),
                );
                None
            }
            other => Some((other, cb)),
        }
    }
}

fn status(res: i32) -> Result<u32, Errno> {
    if res < 0 {
        Err(Errno(-res))
    } else {
        Ok(res as u32)
    }
}

fn read_reply(d: Done, len: usize) -> Result<Reply, Errno> {
    status(d.res)?;
    match d.buf {
        Some(Buf::Aligned(mut b)) => {
            // The bytes past a short read are still the allocation's zeroes.
            b.set_len(len);
            Ok(Reply::Data(Bytes::from_owner(b)))
        }
        _ => Err(Errno::EIO),
    }
}

fn write_reply(d: Done, len: usize) -> Result<Reply, Errno> {
    let n = status(d.res)? as usize;
    if n != len {
        return Err(Errno::EIO);
    }
    Ok(Reply::Done(len as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::Flags;

    fn spec(path: &Path, extra: &str) -> String {
        format!("file:{},size=1M,engine=uring{extra}", path.display())
    }

    #[test]
    fn options_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.img");
        let f = p.display();
        for (s, want) in [
            (format!("file:{f},size=1M,sqpoll"), "needs engine=uring"),
            (format!("file:{f},size=1M,engine=ring"), "engine"),
            (
                format!("file:{f},size=1M,engine=threads,sqpoll"),
                "needs engine=uring",
            ),
        ] {
            let e = format!("{:#}", crate::backend::check_spec(&s).unwrap_err());
            assert!(e.contains(want), "{s}: {e}");
        }
        crate::backend::check_spec(&spec(&p, ",sqpoll,direct")).unwrap();
    }

    #[test]
    fn the_ring_takes_reads_writes_flushes_and_hands_back_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.img");
        std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
        for direct in [false, true] {
            let u = UringFile::open(&p, direct, false, false, 1).unwrap();
            let cb = || -> Callback { Box::new(|_| ()) };
            assert!(u
                .try_submit(
                    Request::Read {
                        offset: 0,
                        len: 4096
                    },
                    cb()
                )
                .is_none());
            assert!(u.try_submit(Request::Flush, cb()).is_none());
            let trim = Request::Trim {
                offset: 0,
                len: 4096,
                flags: Flags::default(),
            };
            assert!(u.try_submit(trim, cb()).is_some(), "trim taken by the ring");
            let odd = Request::Read {
                offset: 512,
                len: 512,
            };
            assert_eq!(
                u.try_submit(odd, cb()).is_some(),
                direct,
                "an unaligned read with direct={direct}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_through_the_device() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.img");
        for extra in ["", ",direct", ",sqpoll", ",rings=3", ",direct,rings=2"] {
            let dev = crate::backend::open(&spec(&p, extra)).unwrap();
            assert!(
                dev.native_callbacks(),
                "{extra}: engine=uring calls back natively"
            );
            let data = Bytes::from((0..8192u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
            for (off, fua) in [(4096u64, false), (65536, true)] {
                let w = dev
                    .submit(Request::Write {
                        offset: off,
                        data: data.clone(),
                        flags: Flags {
                            fua,
                            ..Flags::default()
                        },
                    })
                    .await;
                assert!(matches!(w, Ok(Reply::Done(8192))), "{extra}: write {w:?}");
            }
            // An unaligned write (the thread-pool path with direct).
            let w = dev
                .submit(Request::Write {
                    offset: 100,
                    data: Bytes::from_static(b"hello"),
                    flags: Flags::default(),
                })
                .await;
            assert!(w.is_ok(), "{extra}: {w:?}");
            assert!(matches!(
                dev.submit(Request::Flush).await,
                Ok(Reply::Done(0))
            ));
            let (tx, rx) = tokio::sync::oneshot::channel();
            dev.submit_cb(
                Request::Read {
                    offset: 4096,
                    len: 8192,
                },
                Box::new(move |c| drop(tx.send(c))),
            );
            match rx.await.unwrap() {
                Ok(Reply::Data(b)) => assert!(b == data, "{extra}: read back differs"),
                r => panic!("{extra}: read {r:?}"),
            }
            match dev
                .submit(Request::Read {
                    offset: 0,
                    len: 4096,
                })
                .await
            {
                Ok(Reply::Data(b)) => assert_eq!(&b[100..105], b"hello", "{extra}"),
                r => panic!("{extra}: read {r:?}"),
            }
            let f = std::fs::read(&p).unwrap();
            assert!(f[65536..65536 + 8192] == data[..], "{extra}: file contents");
            // Out of range: refused before the ring.
            let r = dev
                .submit(Request::Read {
                    offset: 1 << 20,
                    len: 4096,
                })
                .await;
            assert!(r.is_err(), "{extra}: read past the end: {r:?}");
        }
        let ro = crate::backend::open(&format!("file:{},engine=uring,ro", p.display())).unwrap();
        let w = ro
            .submit(Request::Write {
                offset: 0,
                data: Bytes::from_static(b"x"),
                flags: Flags::default(),
            })
            .await;
        assert_eq!(w.unwrap_err(), Errno::EPERM);
    }
}
