//! A connection's receive buffer during transmission.
//!
//! Requests are read from the socket in chunks into one `BytesMut`. Headers
//! are copied out (28 bytes); a write's payload is split off the buffer
//! and handed to the device as `Bytes`, without a copy (a
//! `tokio::io::BufReader` would copy every payload once more, from its
//! buffer into the request's). A payload that has not all arrived gets
//! room for its whole length first, so that it ends up in one piece; a
//! large one (over half a chunk) a chunk more, so that the reads that
//! bring it in are not cut at its end and can bring the next requests
//! too (cut reads cost a wake-up more per request at 128 KiB).
//!
//! A payload shorter than [`OWN_ALLOC`] shares its buffer: until the
//! device drops it, it keeps up to [`CHUNK`] bytes more than its own alive.
//! The reader charges each such write one chunk more against the
//! connection's in-flight cap for that ([`pinned_extra`]).
//!
//! A payload of [`OWN_ALLOC`] bytes or more gets an allocation of its own,
//! exactly its length: the part already received is copied into it (at
//! most one chunk) and the rest is read from the socket straight into it.
//! Such a `Bytes` is the only handle to its allocation, which lets a
//! device keep it as it is instead of copying it (the memory backend
//! adopts a write of exactly one aligned page), and it pins nothing beyond
//! itself.
//! The cost: the next request's header then needs a receive of its own.
//!
//! Used by the reader (`reader.rs`), which owns one per connection, seeded
//! with the bytes the handshake's `BufReader` had read past its end.

use bytes::{Buf, Bytes, BytesMut};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Size of the chunks the socket is read in.
pub const CHUNK: usize = 64 * 1024;
/// Read into a fresh chunk once less than this is left of the current one.
const LOW: usize = 8 * 1024;
/// Payloads larger than this get room for a chunk more (see the top).
const OWN_BUFFER: usize = CHUNK / 2;
/// Payloads of at least this many bytes get an exactly sized allocation of
/// their own (see the top). One memory-backend page.
pub const OWN_ALLOC: usize = CHUNK;

/// Bytes a write payload of `len` bytes may keep alive beyond its own, to
/// be charged against the connection's in-flight cap.
pub fn pinned_extra(len: usize) -> usize {
    if len >= OWN_ALLOC {
        0
    } else {
        CHUNK
    }
}

pub struct RecvBuf<R> {
    inner: R,
    buf: BytesMut,
}

impl<R: AsyncRead + Unpin> RecvBuf<R> {
    /// `pending`: bytes the handshake's reader had read past its end (a
    /// client may send its first requests right behind NBD_OPT_GO).
    pub fn new(inner: R, pending: &[u8]) -> Self {
        let mut buf = BytesMut::with_capacity(CHUNK.max(pending.len()));
        buf.extend_from_slice(pending);
        RecvBuf { inner, buf }
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Bytes received and not consumed yet.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Reads until at least `n` bytes are buffered. `UnexpectedEof` if the
    /// client closes first.
    async fn need(&mut self, n: usize) -> io::Result<()> {
        while self.buf.len() < n {
            let want = n - self.buf.len();
            if self.buf.capacity() - self.buf.len() < want.max(LOW) {
                // In place if no payload still shares the chunk, else a
                // new one (moving the few unconsumed bytes).
                self.buf.reserve(want.max(CHUNK));
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// Reads exactly `out.len()` bytes into `out` (a request header).
    pub async fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        self.need(out.len()).await?;
        self.buf.copy_to_slice(out);
        Ok(())
    }

    /// The next `n` bytes, in one piece, split off the receive buffer
    /// without a copy.
    pub async fn payload(&mut self, n: usize) -> io::Result<Bytes> {
        if n >= OWN_ALLOC {
            return self.own_payload(n).await;
        }
        let want = n.saturating_sub(self.buf.len());
        if want > 0 && self.buf.capacity() - self.buf.len() < want {
            // Room for the whole payload; a large one gets a chunk more,
            // so that the reads that bring it in can bring the next
            // requests' headers too.
            let extra = if n > OWN_BUFFER { CHUNK } else { 0 };
            self.buf.reserve(want + extra);
        }
        self.need(n).await?;
        Ok(self.buf.split_to(n).freeze())
    }

    /// The next `n` bytes in an allocation of exactly `n` bytes that
    /// nothing else shares.
    async fn own_payload(&mut self, n: usize) -> io::Result<Bytes> {
        let mut out = BytesMut::with_capacity(n);
        let have = self.buf.len().min(n);
        out.extend_from_slice(&self.buf[..have]);
        self.buf.advance(have);
        while out.len() < n {
            // `read_buf` reads into the spare capacity, n - len here, so
            // it never reads past the payload nor grows the allocation.
            if self.inner.read_buf(&mut out).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(out.freeze())
    }

    /// Reads and drops `n` bytes (a rejected write's payload), without
    /// holding them all at once.
    pub async fn skip(&mut self, mut n: u64) -> io::Result<()> {
        while n > 0 {
            if self.buf.is_empty() {
                self.need(1).await?;
            }
            let k = (self.buf.len() as u64).min(n) as usize;
            self.buf.advance(k);
            n -= k as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::ReadBuf;

    /// Hands out its data at most `step` bytes per read.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self
                .step
                .min(buf.remaining())
                .min(self.data.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[tokio::test]
    async fn headers_payloads_and_skips_come_out_in_order() {
        // pending bytes, then a header, a small payload, a skipped run,
        // a payload bigger than a chunk, and a last header.
        let data = pattern(5 + 28 + 4096 + 70_000 + 3 * CHUNK + 28);
        for step in [1, 7, 4096, CHUNK, 10 * CHUNK] {
            let mut r = RecvBuf::new(
                Trickle {
                    data: data[5..].to_vec(),
                    at: 0,
                    step,
                },
                &data[..5],
            );
            let mut at = 0;
            let mut pre = [0u8; 5];
            r.read_exact(&mut pre).await.unwrap();
            assert_eq!(pre, data[at..at + 5]);
            at += 5;
            let mut h = [0u8; 28];
            r.read_exact(&mut h).await.unwrap();
            assert_eq!(h, data[at..at + 28]);
            at += 28;
            let p = r.payload(4096).await.unwrap();
            assert_eq!(&p[..], &data[at..at + 4096], "step {step}");
            at += 4096;
            r.skip(70_000).await.unwrap();
            at += 70_000;
            let big = r.payload(3 * CHUNK).await.unwrap();
            assert_eq!(&big[..], &data[at..at + 3 * CHUNK], "step {step}");
            at += 3 * CHUNK;
            r.read_exact(&mut h).await.unwrap();
            assert_eq!(h, data[at..at + 28]);
            assert_eq!(r.buffered(), 0);
            // the small payload is still intact after later reads reused
            // or replaced its chunk
            assert_eq!(&p[..], &data[33..33 + 4096]);
            let e = r.read_exact(&mut h).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        }
    }

    #[tokio::test]
    async fn large_payloads_own_an_exact_allocation() {
        // header, a payload of exactly OWN_ALLOC, one just under it, one
        // of two chunks and a bit, then a header: for every read size the
        // large payloads are unique and exactly sized, the small one not.
        let sizes = [OWN_ALLOC, OWN_ALLOC - 1, 2 * CHUNK + 3];
        let total = 28 + sizes.iter().sum::<usize>() + 28;
        let data = pattern(total);
        for step in [1, 100, 4096, CHUNK, 3 * CHUNK] {
            let mut r = RecvBuf::new(
                Trickle {
                    data: data.clone(),
                    at: 0,
                    step,
                },
                &[],
            );
            let mut h = [0u8; 28];
            r.read_exact(&mut h).await.unwrap();
            let mut at = 28;
            for &n in &sizes {
                let p = r.payload(n).await.unwrap();
                assert_eq!(&p[..], &data[at..at + n], "step {step} len {n}");
                if n >= OWN_ALLOC {
                    assert!(p.is_unique(), "step {step} len {n}: shared");
                    let v = Vec::from(p);
                    assert_eq!(v.capacity(), n, "step {step} len {n}: not exact");
                    assert_eq!(pinned_extra(n), 0);
                } else {
                    assert_eq!(pinned_extra(n), CHUNK);
                }
                at += n;
            }
            r.read_exact(&mut h).await.unwrap();
            assert_eq!(h, data[at..at + 28], "step {step}");
            assert_eq!(r.buffered(), 0);
        }
    }

    #[tokio::test]
    async fn a_large_payload_cut_short_is_an_eof() {
        let mut r = RecvBuf::new(
            Trickle {
                data: pattern(OWN_ALLOC - 10),
                at: 0,
                step: 4096,
            },
            &[],
        );
        let e = r.payload(OWN_ALLOC).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_payload_cut_short_is_an_eof() {
        let mut r = RecvBuf::new(
            Trickle {
                data: pattern(100),
                at: 0,
                step: 30,
            },
            &[],
        );
        let e = r.payload(4096).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
