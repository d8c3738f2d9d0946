//! Replies: encoding and the three paths by which they reach the socket.
//!
//! A completed request travels as a [`Done`] (cookie, what to answer, the
//! result, and the in-flight permit, released once it is encoded). [`encode`]
//! turns it into a simple or structured reply; read data up to 32 KiB is
//! copied into the reply buffer, larger data is returned to be written from
//! its own buffer. Every write goes through one `tokio::sync::Mutex`
//! around the socket's write half ([`Out`]) and sends headers and large
//! data together in one vectored write ([`write_pair`]): a header written
//! alone would wake the client, which would then wait again for the data.
//! The first failed write marks the connection failed; later replies are
//! dropped.
//!
//! The three paths, and who calls them:
//! - the reader's own replies (`nbd/reader.rs`): requests complete on the
//!   first poll are encoded into the reader's batch, which it writes with
//!   [`out_write`] before it waits for the socket again;
//! - the writer task ([`writer`], spawned by the reader): completions of
//!   requests that had to wait, sent over an unbounded channel, batched the
//!   same way: it drains the channel into one buffer, then writes;
//! - the completion callback ([`reply_now`]), on the device's own thread
//!   (librbd's, through `BlockDev::submit_cb`): a non-blocking vectored
//!   write ([`ReplyWriter::try_write_now`]) if the socket is free, a task
//!   to finish what the socket did not take, or, when another reply is
//!   being written, a hop to the writer task. This saves a wake-up of a
//!   runtime worker per request. On an io_uring engine's thread (qcow2
//!   hits at depth) the replies of one reaped batch of completions are
//!   staged per connection and written together after the batch
//!   ([`Staged`]).
//!
//! Assumes each reply is written whole under the lock, so replies never
//! interleave on the wire.

use super::proto::*;
use super::wire;
use crate::block::{Completion, Errno, Reply};
use bytes::{Bytes, BytesMut};
use iolift_direct::engine::batch;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Mutex, OwnedSemaphorePermit};

/// Read data up to this size is copied into the reply batch buffer; larger
/// data is written from its own buffer.
pub(super) const COPY_LIMIT: usize = 32 * 1024;
/// Write the reply batch once it grows past this.
pub(super) const BATCH_LIMIT: usize = 256 * 1024;

/// A completed request on its way to the writer.
pub(super) struct Done {
    pub(super) cookie: u64,
    /// READ: offset of the data; BLOCK_STATUS: requested length.
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) kind: u16,
    pub(super) req_one: bool,
    pub(super) result: Completion,
    /// The request's shares of the connection's and the server's
    /// in-flight caps, given back when the reply is encoded.
    pub(super) _permit: Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
}

/// The write half of a connection. Sockets can also be written without
/// awaiting, from any thread: a device that completes requests on threads
/// of its own (librbd) then sends the reply from there, with no hop
/// through the runtime.
pub trait ReplyWriter: AsyncWrite + Unpin + Send + 'static {
    /// Writes what the socket takes now of `bufs`, in order, in one system
    /// call; `WouldBlock` if nothing.
    fn try_write_now(&self, _bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::WouldBlock.into())
    }
}

impl ReplyWriter for tokio::net::unix::OwnedWriteHalf {
    fn try_write_now(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.try_write_vectored(bufs)
    }
}

impl ReplyWriter for tokio::net::tcp::OwnedWriteHalf {
    fn try_write_now(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.try_write_vectored(bufs)
    }
}

/// The unwritten rest of a reply: `a` (headers, small data), then `b`
/// (large read data, written from its own buffer). Both go out in one
/// system call where the socket takes them: a header written alone would
/// wake the client, which would then wait again for the data.
struct Pair<'x> {
    a: &'x [u8],
    b: &'x [u8],
}

impl<'x> Pair<'x> {
    fn is_empty(&self) -> bool {
        self.a.is_empty() && self.b.is_empty()
    }

    fn slices(&self) -> [IoSlice<'x>; 2] {
        [IoSlice::new(self.a), IoSlice::new(self.b)]
    }

    /// Drops the first `n` bytes, which were written.
    fn advance(&mut self, n: usize) {
        let k = n.min(self.a.len());
        self.a = &self.a[k..];
        self.b = &self.b[(n - k).min(self.b.len())..];
    }
}

/// Writes `a` then `b` (vectored, so usually in one system call).
async fn write_pair<W: AsyncWrite + Unpin>(w: &mut W, a: &[u8], b: &[u8]) -> std::io::Result<()> {
    let mut p = Pair { a, b };
    while !p.is_empty() {
        let n = w.write_vectored(&p.slices()).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        p.advance(n);
    }
    Ok(())
}

/// The socket's write half, shared by the reader (replies of requests that
/// completed at once), the writer task and the completion callbacks (the
/// others).
pub(super) struct Out<W> {
    pub(super) w: W,
    /// A write failed: the client is gone, further replies are dropped.
    pub(super) failed: bool,
}

/// Writes `buf` (then clears it) and `big`, and flushes. False if the
/// connection can no longer be written.
pub(super) async fn out_write<W: AsyncWrite + Unpin>(
    out: &Mutex<Out<W>>,
    buf: &mut BytesMut,
    big: Option<&[u8]>,
    peer: &str,
) -> bool {
    let mut o = out.lock().await;
    let ok = !o.failed && o.send(buf, big.unwrap_or_default(), peer).await;
    buf.clear();
    ok
}

impl<W: AsyncWrite + Unpin> Out<W> {
    /// Writes `a` then `b` and flushes; on failure marks the connection
    /// failed. False if the connection can no longer be written.
    async fn send(&mut self, a: &[u8], b: &[u8], peer: &str) -> bool {
        let mut r = write_pair(&mut self.w, a, b).await;
        if r.is_ok() {
            r = self.w.flush().await;
        }
        match r {
            Ok(()) => true,
            Err(e) => {
                self.fail(&e, peer);
                false
            }
        }
    }

    fn fail(&mut self, e: &std::io::Error, peer: &str) {
        tracing::info!(%peer, "reply write failed, dropping further replies: {e}");
        self.failed = true;
    }
}

/// Replies encoded by completion callbacks that run inside one batch of
/// an io_uring engine's thread (`iolift_direct::engine::batch`), waiting
/// to be written together when the batch's callbacks are done: one per
/// connection. Never holds more than one batch's replies (at most a ring's
/// worth, each at most [`COPY_LIMIT`] of data and its header).
pub(super) type Staged = Arc<std::sync::Mutex<BytesMut>>;

/// Sends one reply from the calling thread (any thread) if the socket is
/// free and takes it; a reply the socket only partly takes is finished by
/// a task that keeps the socket locked meanwhile. If another reply is
/// being written, this one goes to the writer task instead.
///
/// On an engine thread answering a batch of completions, a reply without
/// large data is encoded into the connection's `staged` buffer instead,
/// and the first such reply of the batch has the buffer written when the
/// batch's callbacks are done ([`flush_staged`]): one system call for every
/// reply of the batch to this connection, and one wake-up of the client.
pub(super) fn reply_now<W: ReplyWriter>(
    out: Arc<Mutex<Out<W>>>,
    d: Done,
    structured: bool,
    tx: mpsc::UnboundedSender<Done>,
    rt: &tokio::runtime::Handle,
    peer: Arc<str>,
    staged: &Staged,
) {
    if batch::active() && batching() && !(d.kind == CMD_READ && d.len as usize > COPY_LIMIT) {
        let first = {
            let mut b = staged.lock().unwrap_or_else(|p| p.into_inner());
            let first = b.is_empty();
            let big = encode(&mut b, d, structured);
            debug_assert!(big.is_none(), "small replies only");
            first
        };
        if first {
            // `tx` goes with the write: the writer task, and with it the
            // connection, ends only once every sender is gone, so the
            // socket is not shut down before the staged replies are out.
            let (staged, rt) = (staged.clone(), rt.clone());
            let flush: batch::Later = Box::new(move || flush_staged(out, &staged, &rt, peer, tx));
            if let Err(flush) = batch::defer(flush) {
                flush();
            }
        }
        return;
    }
    let g = match out.try_lock_owned() {
        Ok(g) => g,
        Err(_) => {
            let _ = tx.send(d);
            return;
        }
    };
    if g.failed {
        return;
    }
    let mut buf = BytesMut::with_capacity(64 + (d.len as usize).min(COPY_LIMIT));
    let big = encode(&mut buf, d, structured).unwrap_or_default();
    write_locked(g, buf, big, rt, peer);
}

/// Whether replies of one engine batch are staged and written together
/// (see [`reply_now`]); `IOLIFT_REPLY_BATCH=0` in the server's environment
/// writes each on its own instead, as before 2026-11-25 15:00 (for A/B
/// runs of `bench/qcow2.sh` with one binary).
fn batching() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("IOLIFT_REPLY_BATCH").map_or(true, |v| v != "0"))
}

/// Writes the replies staged for a connection during a batch (see
/// [`reply_now`]), from this thread if the socket is free, else from a task
/// that waits for it.
fn flush_staged<W: ReplyWriter>(
    out: Arc<Mutex<Out<W>>>,
    staged: &Staged,
    rt: &tokio::runtime::Handle,
    peer: Arc<str>,
    tx: mpsc::UnboundedSender<Done>,
) {
    let buf = staged.lock().unwrap_or_else(|p| p.into_inner()).split();
    if buf.is_empty() {
        return;
    }
    match out.clone().try_lock_owned() {
        Ok(g) if g.failed => {}
        Ok(g) => write_locked(g, buf, Bytes::new(), rt, peer),
        Err(_) => {
            // Another reply is being written: wait for the socket on a
            // task (the rare case; each reply stays whole under the lock).
            rt.spawn(async move {
                let mut g = out.lock_owned().await;
                if !g.failed {
                    g.send(&buf, &[], &peer).await;
                }
                drop(tx);
            });
        }
    }
}

/// Writes `buf` then `big` with the socket locked: as much as the socket
/// takes now from this thread, the rest from a task that keeps it locked.
fn write_locked<W: ReplyWriter>(
    mut g: tokio::sync::OwnedMutexGuard<Out<W>>,
    mut buf: BytesMut,
    mut big: Bytes,
    rt: &tokio::runtime::Handle,
    peer: Arc<str>,
) {
    let mut p = Pair { a: &buf, b: &big };
    while !p.is_empty() {
        match g.w.try_write_now(&p.slices()) {
            Ok(0) => break,
            Ok(n) => p.advance(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return g.fail(&e, &peer),
        }
    }
    if p.is_empty() {
        return;
    }
    // The socket is full: a task finishes the rest, holding the lock.
    let (a_left, b_left) = (p.a.len(), p.b.len());
    let _ = buf.split_to(buf.len() - a_left);
    let _ = big.split_to(big.len() - b_left);
    rt.spawn(async move { g.send(&buf, &big, &peer).await });
}

/// Encodes one reply into `out`; returns large read data to be written
/// after `out` instead of copied into it.
pub(super) fn encode(out: &mut BytesMut, d: Done, structured: bool) -> Option<Bytes> {
    match d.result {
        Ok(Reply::Data(data)) if d.kind == CMD_READ => {
            // A device returning the wrong length would corrupt the stream.
            if data.len() != d.len as usize {
                encode_error(out, d.cookie, Errno::EIO, structured, true);
                return None;
            }
            if structured {
                wire::put_offset_data_header(out, d.cookie, d.offset, d.len);
            } else {
                wire::put_simple_reply(out, d.cookie, 0);
            }
            if data.len() <= COPY_LIMIT {
                out.extend_from_slice(&data);
                None
            } else {
                Some(data)
            }
        }
        Ok(Reply::Extents(ext)) if d.kind == CMD_BLOCK_STATUS => {
            wire::put_block_status(out, d.cookie, BASE_ALLOCATION_ID, &ext, d.len, d.req_one);
            None
        }
        Ok(_) if d.kind == CMD_BLOCK_STATUS => {
            // A device without block status: everything is data.
            wire::put_block_status(out, d.cookie, BASE_ALLOCATION_ID, &[], d.len, d.req_one);
            None
        }
        Ok(_) if d.kind == CMD_READ => {
            encode_error(out, d.cookie, Errno::EIO, structured, true);
            None
        }
        Ok(_) => {
            wire::put_simple_reply(out, d.cookie, 0);
            None
        }
        Err(e) => {
            let chunk = d.kind == CMD_READ || d.kind == CMD_BLOCK_STATUS;
            encode_error(out, d.cookie, e, structured, chunk);
            None
        }
    }
}

fn encode_error(out: &mut BytesMut, cookie: u64, e: Errno, structured: bool, chunk: bool) {
    if structured && chunk {
        wire::put_error_chunk(out, cookie, wire::nbd_errno(e), "");
    } else {
        wire::put_simple_reply(out, cookie, wire::nbd_errno(e));
    }
}

/// The writer task: answers the requests that did not complete at once.
pub(super) async fn writer<W: AsyncWrite + Unpin>(
    out: Arc<Mutex<Out<W>>>,
    mut rx: mpsc::UnboundedReceiver<Done>,
    structured: bool,
    peer: String,
) {
    let mut buf = BytesMut::with_capacity(BATCH_LIMIT + COPY_LIMIT + 64);
    let mut ok = true;
    while let Some(d) = rx.recv().await {
        if !ok {
            continue;
        }
        let mut next = Some(d);
        while let Some(d) = next.take() {
            let big = encode(&mut buf, d, structured);
            if big.is_some() || buf.len() >= BATCH_LIMIT {
                ok = out_write(&out, &mut buf, big.as_deref(), &peer).await;
                if !ok {
                    break;
                }
            }
            next = rx.try_recv().ok();
        }
        if ok && !buf.is_empty() {
            ok = out_write(&out, &mut buf, None, &peer).await;
        }
        buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_advances_across_both_parts() {
        let (a, b) = (b"hdr".as_slice(), b"payload".as_slice());
        let mut p = Pair { a, b };
        p.advance(0);
        assert_eq!((p.a, p.b), (a, b));
        p.advance(2);
        assert_eq!((p.a, p.b), (&b"r"[..], b));
        p.advance(4);
        assert_eq!((p.a, p.b), (&b""[..], &b"load"[..]));
        assert!(!p.is_empty());
        p.advance(4);
        assert!(p.is_empty());
        let mut q = Pair { a: b"", b };
        q.advance(7);
        assert!(q.is_empty());
    }

    /// A writer that takes at most 5 bytes per call, vectored or not: the
    /// pair still arrives whole and in order.
    #[tokio::test]
    async fn write_pair_survives_short_writes() {
        struct Short(Vec<u8>);
        impl AsyncWrite for Short {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                let n = buf.len().min(5);
                self.0.extend_from_slice(&buf[..n]);
                std::task::Poll::Ready(Ok(n))
            }
            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
                bufs: &[IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                let mut n = 0;
                for b in bufs {
                    let k = b.len().min(5 - n);
                    self.0.extend_from_slice(&b[..k]);
                    n += k;
                }
                std::task::Poll::Ready(Ok(n))
            }
            fn is_write_vectored(&self) -> bool {
                true
            }
            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }
            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Ok(()))
            }
        }
        let mut w = Short(Vec::new());
        write_pair(&mut w, b"abc", b"defghijklm").await.unwrap();
        assert_eq!(w.0, b"abcdefghijklm");
        let mut w = Short(Vec::new());
        write_pair(&mut w, b"", b"xyz").await.unwrap();
        write_pair(&mut w, b"12", b"").await.unwrap();
        assert_eq!(w.0, b"xyz12");
    }
}
