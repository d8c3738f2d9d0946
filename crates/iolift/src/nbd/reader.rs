//! Request intake during transmission: the reader.
//!
//! Owns [`transmission`], called by `conn::serve` once the handshake has
//! chosen an export; it runs on the connection's task until the client
//! sends `NBD_CMD_DISC` or leaves, breaks the protocol, or shutdown comes,
//! then waits for every request in flight to be answered (the writer task
//! ends when the last sender of completions is gone) and shuts the write
//! side down.
//!
//! For each request the reader
//! - reads the 28-byte header from the receive buffer ([`RecvBuf`],
//!   `nbd/recv.rs`: the socket read in 64 KiB chunks into one `BytesMut`)
//!   and judges it with `wire::parse_request` and `wire::decode_request`;
//! - takes the request's share of the connection's in-flight cap, a
//!   semaphore counted in bytes (4 KiB per request, plus a read's length,
//!   plus a write's length and, under 64 KiB, one receive chunk, which
//!   its payload may keep alive), so a client that never reads its replies stops being
//!   read; then the same share of the server-wide budget
//!   (`Server::budget`), so that many such clients together stop at it;
//! - for a write, takes the payload from the receive buffer as `Bytes`
//!   (split off it without a copy, or from 64 KiB up read into an
//!   allocation of its own, `recv::OWN_ALLOC`), having first written the replies in its batch if the payload
//!   has not all arrived; a rejected write's payload is skipped;
//! - submits to the device. With native callbacks (librbd) through
//!   `submit_cb`: the callback answers from the device's thread
//!   (`reply::reply_now`). Otherwise through `submit`, polling the future
//!   once: a request complete at once (memory, null backends) is encoded
//!   into the reader's own batch of replies; any other gets a task that
//!   awaits the future and sends the completion to the writer task.
//!
//! The reader writes its batch when it is about to wait for the socket (a
//! burst of requests gets one write; queue depth 1 needs no task switch),
//! when the batch passes 256 KiB, and with read data over 32 KiB, which
//! goes out from its own buffer in the same vectored write. Before waiting
//! for the socket it also makes the poll-mode and coalescing decisions: it
//! counts the requests parsed since it last ran out of input, and a burst
//! of more than two turns polling off for the next [`QUIET_READS`] reads;
//! while polling is off, having just written replies, it may pause
//! (`nbd/coalesce.rs`) so that the client's next requests come in a batch;
//! otherwise the next read may poll (`Polled::at_boundary`, `nbd/poll.rs`).
//!
//! Assumes the encoders and write paths of `nbd/reply.rs`, and a receive
//! buffer seeded with what the handshake's reader read past its end.

use super::coalesce::Coalesce;
use super::handshake::Negotiated;
use super::poll::{Polled, RawSocket};
use super::poll_stats::ConnPollMetrics;
use super::proto::*;
use super::recv::{self, RecvBuf};
use super::reply::{
    encode, out_write, reply_now, writer, Done, Out, ReplyWriter, Staged, BATCH_LIMIT, COPY_LIMIT,
};
use super::wire::{self, Action};
use super::Server;
use crate::block::{poll_once, Reply, Request};
use bytes::BytesMut;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch, Mutex, Semaphore};

/// Fixed cost charged per request against the in-flight cap, so that
/// payload-free requests are bounded too.
const REQUEST_COST: u32 = 4096;
/// Poll mode: reads without polling after a burst of requests.
const QUIET_READS: u32 = 256;

/// Runs transmission on an export the handshake chose (see the top).
pub(super) async fn transmission<R, W>(
    server: Arc<Server>,
    neg: Negotiated,
    rd: BufReader<Polled<R>>,
    wr: W,
    peer: String,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + RawSocket + Unpin + Send + 'static,
    W: ReplyWriter,
{
    let pending = rd.buffer().to_vec();
    let mut rd = RecvBuf::new(rd.into_inner(), &pending);
    let s = neg.session;
    let dev = neg.export.dev.clone();
    let (tx, rx) = mpsc::unbounded_channel::<Done>();
    let out = Arc::new(Mutex::new(Out {
        w: wr,
        failed: false,
    }));
    let writer = tokio::spawn(writer(out.clone(), rx, s.structured, peer.clone()));
    // Replies of requests that completed at once, written by this task
    // before it waits for the socket again.
    let mut local = BytesMut::with_capacity(BATCH_LIMIT + COPY_LIMIT + 64);
    let cap = server
        .cfg
        .inflight_bytes
        .max(s.max_request as u64 + REQUEST_COST as u64);
    let cap = cap.min(Semaphore::MAX_PERMITS as u64) as usize;
    let sem = Arc::new(Semaphore::new(cap));
    let mut hb = [0u8; REQUEST_LEN];
    // Requests that do not complete at once: answered from the device's
    // own completion thread if it has one, else by the writer task.
    let native = dev.native_callbacks();
    let staged = Staged::default();
    let rt = tokio::runtime::Handle::current();
    let peer_arc: Arc<str> = peer.as_str().into();
    // Requests parsed since the reader last ran out of buffered input. One
    // or two, time after time, means the client waits for each reply
    // before it sends more (low queue depth): there poll mode saves a
    // wake-up per request. A bigger burst means a client that keeps many
    // requests coming; polling would then answer them one by one as they
    // trickle in, and cost the client more than the wake-ups it saves, so
    // it stays off for the next QUIET_READS reads.
    let mut burst = 0u32;
    let mut quiet = 0u32;
    let mut co = Coalesce::new(server.cfg.coalesce);
    // This connection's poll state in the metrics, until it ends.
    let _metrics = ConnPollMetrics::register(&neg.export.name, rd.get_mut().stats());
    loop {
        // Only wait on shutdown when the next header is not buffered yet.
        let r = if rd.buffered() >= REQUEST_LEN {
            rd.read_exact(&mut hb).await
        } else {
            let replied = !local.is_empty();
            if replied && !flush_local(&out, &mut local, None, &peer, &mut co).await {
                break;
            }
            if burst > 2 {
                quiet = QUIET_READS;
            } else {
                quiet = quiet.saturating_sub(1);
            }
            if replied && quiet > 0 {
                co.pause(rd.get_mut().raw_fd(), &server.spin_gate);
            }
            rd.get_mut().at_boundary(quiet == 0);
            burst = 0;
            tokio::select! {
                r = rd.read_exact(&mut hb) => r,
                _ = super::stopped(&mut shutdown) => {
                    tracing::debug!(%peer, "shutdown: no more requests read");
                    break;
                }
            }
        };
        if let Err(e) = r {
            if e.kind() == std::io::ErrorKind::UnexpectedEof && rd.buffered() == 0 {
                tracing::info!(%peer, "client disconnected without NBD_CMD_DISC");
            } else {
                tracing::info!(%peer, "connection read failed: {e}");
            }
            break;
        }
        burst += 1;
        let h = match wire::parse_request(&hb) {
            Ok(h) => h,
            Err(e) => {
                tracing::info!(%peer, "protocol error, closing: {e}");
                break;
            }
        };
        let action = wire::decode_request(&h, &s);
        // A small write's payload may keep the receive chunk it arrived in
        // alive until the device drops it: charged too.
        let payload = match &action {
            Action::Write { len, .. } => *len as usize + recv::pinned_extra(*len as usize),
            Action::Submit(Request::Read { len, .. }) => *len as usize,
            _ => 0,
        };
        let cost = (REQUEST_COST as usize + payload).min(cap) as u32;
        let permit = match sem.clone().try_acquire_many_owned(cost) {
            Ok(p) => p,
            Err(_) => tokio::select! {
                p = sem.clone().acquire_many_owned(cost) => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = super::stopped(&mut shutdown) => break,
            },
        };
        // Then the same share of the server-wide budget; while waiting for
        // it the connection is not read (its replies so far go out first).
        let global = (cost as usize).min(server.budget_cap()) as u32;
        let global = match server.budget.clone().try_acquire_many_owned(global) {
            Ok(p) => p,
            Err(_) => {
                if !local.is_empty() && !flush_local(&out, &mut local, None, &peer, &mut co).await {
                    break;
                }
                tokio::select! {
                    p = server.budget.clone().acquire_many_owned(global) => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = super::stopped(&mut shutdown) => break,
                }
            }
        };
        let mut done = Done {
            cookie: h.cookie,
            offset: h.offset,
            len: h.len,
            kind: h.cmd,
            req_one: h.flags & CMD_FLAG_REQ_ONE != 0,
            result: Ok(Reply::Done(0)),
            _permit: Some((permit, global)),
        };
        let req = match action {
            Action::Disconnect => {
                tracing::debug!(%peer, "NBD_CMD_DISC");
                break;
            }
            Action::Reject { errno, skip } => {
                if skip > 0 && rd.skip(skip as u64).await.is_err() {
                    tracing::info!(%peer, "client left inside a rejected write payload");
                    break;
                }
                tracing::debug!(%peer, cmd = cmd_name(h.cmd), offset = h.offset, len = h.len, "rejected: {errno:?}");
                done.result = Err(errno);
                let at = local.len();
                encode(&mut local, done, s.structured);
                co.replied(local.len() - at);
                continue;
            }
            Action::Write { offset, len, flags } => {
                // The payload is not all here yet: send the replies waiting
                // in the batch before waiting for it, so that the client
                // can go on (and need not wake us twice for one batch).
                if rd.buffered() < len as usize
                    && !local.is_empty()
                    && !flush_local(&out, &mut local, None, &peer, &mut co).await
                {
                    break;
                }
                let Ok(data) = rd.payload(len as usize).await else {
                    tracing::info!(%peer, "client left inside a write payload");
                    break;
                };
                Request::Write {
                    offset,
                    data,
                    flags,
                }
            }
            Action::Submit(r) => r,
        };
        if native {
            let (out, tx, rt, peer) = (out.clone(), tx.clone(), rt.clone(), peer_arc.clone());
            let (structured, staged) = (s.structured, staged.clone());
            dev.submit_cb(
                req,
                Box::new(move |c| {
                    done.result = c;
                    reply_now(out, done, structured, tx, &rt, peer, &staged);
                }),
            );
            continue;
        }
        let mut fut = dev.submit(req);
        match poll_once(&mut fut) {
            Some(c) => {
                done.result = c;
                let at = local.len();
                let big = encode(&mut local, done, s.structured);
                co.replied(local.len() - at + big.as_ref().map_or(0, |b| b.len()));
                if (big.is_some() || local.len() >= BATCH_LIMIT)
                    && !flush_local(&out, &mut local, big.as_deref(), &peer, &mut co).await
                {
                    break;
                }
            }
            None => {
                let tx = tx.clone();
                tokio::spawn(async move {
                    done.result = fut.await;
                    let _ = tx.send(done);
                });
            }
        }
    }
    if !local.is_empty() {
        out_write(&out, &mut local, None, &peer).await;
    }
    if co.pauses > 0 {
        tracing::debug!(%peer, pauses = co.pauses, last_us = co.delay().as_micros() as u64, "coalescing");
    }
    drop(tx);
    // The writer ends once every in-flight request has been answered.
    let _ = writer.await;
    let mut o = out.lock().await;
    if !o.failed {
        let _ = o.w.shutdown().await;
    }
}

/// The reader writes its batch of replies, then remembers the write for
/// coalescing (which counts the replies the client has not read).
async fn flush_local<W: AsyncWrite + Unpin>(
    out: &Mutex<Out<W>>,
    local: &mut BytesMut,
    big: Option<&[u8]>,
    peer: &str,
    co: &mut Coalesce,
) -> bool {
    let ok = out_write(out, local, big, peer).await;
    if ok {
        co.wrote();
    }
    ok
}
