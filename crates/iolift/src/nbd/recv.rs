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
//! A payload shares its buffer: until the device drops it, it keeps up to
//! [`CHUNK`] bytes more than its own alive. The reader charges each write
//! one chunk more against the connection's in-flight cap for that.
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
