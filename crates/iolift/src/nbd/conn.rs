//! One NBD connection: handshake, then transmission.
//!
//! Transmission runs two tasks per connection. The reader reads request
//! headers through a large `BufReader`, judges them with
//! [`wire::decode_request`], reads write payloads straight into a
//! `BytesMut` and submits to the device. A request whose future is already
//! complete on the first poll (the memory and null backends) is answered
//! by the reader itself: its reply is encoded into the reader's batch
//! buffer, written just before the reader would wait for the socket again
//! (so a burst of 32 requests gets one write, and queue depth 1 needs no
//! task switch). On a device with native callbacks (librbd's completion
//! thread, [`BlockDev::submit_cb`](crate::block::BlockDev::submit_cb)) the
//! reply is sent from the completing thread itself if the socket is free
//! (a non-blocking write; a task finishes what the socket did not take),
//! which saves a wake-up of a runtime worker per request. Other requests
//! get a task; their completions (and callbacks that found the socket
//! busy) go through an unbounded channel to the writer task, which batches
//! the same way. All write through one `tokio::sync::Mutex` around the
//! write half.
//! In-flight memory is capped per connection by a semaphore counted in
//! bytes, so a client that never reads its replies stops being read.

use super::coalesce::Coalesce;
use super::poll::{Polled, RawSocket};
use super::proto::*;
use super::recv::{self, RecvBuf};
use super::wire::{self, Action, Fatal, Opt, Session};
use super::Server;
use crate::block::{poll_once, Completion, Errno, Reply, Request};
use bytes::{Bytes, BytesMut};
use std::io::IoSlice;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch, Mutex, OwnedSemaphorePermit, Semaphore};

/// Fixed cost charged per request against the in-flight cap, so that
/// payload-free requests are bounded too.
const REQUEST_COST: u32 = 4096;
/// Read data up to this size is copied into the reply batch buffer; larger
/// data is written from its own buffer.
const COPY_LIMIT: usize = 32 * 1024;
/// Write the reply batch once it grows past this.
const BATCH_LIMIT: usize = 256 * 1024;
/// Handshake reader buffer size (transmission reads through
/// [`RecvBuf`]).
const HANDSHAKE_BUF: usize = 16 * 1024;
/// Poll mode: reads without polling after a burst of requests.
const QUIET_READS: u32 = 256;

/// The export and session a successful handshake leads to.
pub(crate) struct Negotiated {
    pub export: Arc<super::Export>,
    pub session: Session,
}

/// Serves one connection until the client leaves, a fatal protocol error,
/// or shutdown. Never panics on client input; logs one line on abnormal
/// ends.
pub async fn serve<R, W>(
    server: Arc<Server>,
    rd: R,
    mut wr: W,
    peer: String,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + RawSocket + Unpin + Send + 'static,
    W: ReplyWriter,
{
    let rd = Polled::new(rd, server.cfg.poll, server.spin_gate.clone());
    let mut rd = BufReader::with_capacity(HANDSHAKE_BUF, rd);
    let hs = handshake(&server, &mut rd, &mut wr);
    let neg = tokio::select! {
        r = tokio::time::timeout(server.cfg.handshake_timeout, hs) => match r {
            Ok(Ok(Some(n))) => n,
            Ok(Ok(None)) => {
                tracing::debug!(%peer, "client ended the handshake");
                return;
            }
            Ok(Err(e)) => {
                tracing::info!(%peer, "handshake failed: {e}");
                return;
            }
            Err(_) => {
                tracing::info!(%peer, "handshake timed out");
                return;
            }
        },
        _ = super::stopped(&mut shutdown) => return,
    };
    tracing::debug!(%peer, export = %neg.export.name, "transmission starts");
    transmission(server, neg, rd, wr, peer, shutdown).await;
}

#[derive(Debug)]
enum HsError {
    Io(std::io::Error),
    Fatal(Fatal),
}

impl std::fmt::Display for HsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HsError::Io(e) => write!(f, "{e}"),
            HsError::Fatal(e) => write!(f, "protocol error: {e}"),
        }
    }
}

impl From<std::io::Error> for HsError {
    fn from(e: std::io::Error) -> Self {
        HsError::Io(e)
    }
}
impl From<Fatal> for HsError {
    fn from(e: Fatal) -> Self {
        HsError::Fatal(e)
    }
}

/// EOF at a message boundary is a normal end; inside one it is an error.
fn eof_is_none<T>(r: std::io::Result<T>) -> Result<Option<T>, HsError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Runs the fixed newstyle handshake. `Ok(None)`: the client aborted or
/// left cleanly.
async fn handshake<R, W>(
    server: &Server,
    rd: &mut BufReader<R>,
    wr: &mut W,
) -> Result<Option<Negotiated>, HsError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = BytesMut::with_capacity(256);
    wire::put_greeting(&mut out);
    wr.write_all(&out).await?;
    wr.flush().await?;
    let mut fb = [0u8; 4];
    if eof_is_none(rd.read_exact(&mut fb).await)?.is_none() {
        return Ok(None);
    }
    let cf = wire::parse_client_flags(&fb)?;
    let mut structured = false;
    // (export name, base:allocation selected) from SET_META_CONTEXT.
    let mut meta: Option<(String, bool)> = None;
    loop {
        let mut hb = [0u8; OPTION_HEADER_LEN];
        if eof_is_none(rd.read_exact(&mut hb).await)?.is_none() {
            return Ok(None);
        }
        let oh = wire::parse_option_header(&hb)?;
        out.clear();
        if oh.len > MAX_OPTION_LEN {
            if oh.opt == OPT_EXPORT_NAME {
                return Err(Fatal(format!("EXPORT_NAME of {} bytes", oh.len)).into());
            }
            let n = tokio::io::copy(&mut (&mut *rd).take(oh.len as u64), &mut tokio::io::sink())
                .await?;
            if n < oh.len as u64 {
                return Ok(None);
            }
            wire::put_opt_reply(&mut out, oh.opt, REP_ERR_TOO_BIG, b"option too long");
            wr.write_all(&out).await?;
            continue;
        }
        let mut data = vec![0u8; oh.len as usize];
        rd.read_exact(&mut data).await?;
        let opt = match wire::parse_option(oh.opt, &data) {
            Ok(o) => o,
            Err(e) => {
                if oh.opt == OPT_EXPORT_NAME {
                    return Err(Fatal(format!("EXPORT_NAME: {}", e.msg)).into());
                }
                tracing::debug!("option {}: {}", opt_name(oh.opt), e.msg);
                wire::put_opt_reply(&mut out, oh.opt, e.code, e.msg.as_bytes());
                wr.write_all(&out).await?;
                continue;
            }
        };
        match opt {
            Opt::Abort => {
                wire::put_opt_reply(&mut out, oh.opt, REP_ACK, &[]);
                // The client may already have gone; that is fine.
                let _ = wr.write_all(&out).await;
                let _ = wr.flush().await;
                return Ok(None);
            }
            Opt::List => {
                for e in &server.exports {
                    wire::put_rep_server(&mut out, &e.name);
                }
                wire::put_opt_reply(&mut out, oh.opt, REP_ACK, &[]);
            }
            Opt::StructuredReply => {
                structured = true;
                wire::put_opt_reply(&mut out, oh.opt, REP_ACK, &[]);
            }
            Opt::MetaContext {
                set,
                export,
                queries,
            } => {
                if set && !structured {
                    wire::put_opt_reply(
                        &mut out,
                        oh.opt,
                        REP_ERR_INVALID,
                        b"SET_META_CONTEXT needs STRUCTURED_REPLY first",
                    );
                } else if server.find(&export).is_none() {
                    wire::put_opt_reply(&mut out, oh.opt, REP_ERR_UNKNOWN, b"no such export");
                } else {
                    let hit = wire::match_contexts(set, &queries);
                    if hit {
                        wire::put_rep_meta(&mut out, oh.opt, BASE_ALLOCATION_ID, BASE_ALLOCATION);
                    }
                    if set {
                        meta = Some((export, hit));
                    }
                    wire::put_opt_reply(&mut out, oh.opt, REP_ACK, &[]);
                }
            }
            Opt::ExportName(name) => {
                let Some(export) = server.find(&name) else {
                    return Err(Fatal(format!("EXPORT_NAME: no export {name:?}")).into());
                };
                let info = export.dev.info();
                let tflags = wire::transmission_flags(&info, export.read_only);
                wire::put_export_name_reply(&mut out, info.size, tflags, cf.no_zeroes);
                wr.write_all(&out).await?;
                wr.flush().await?;
                let session = server.session(&info, tflags, structured, &meta, &name);
                return Ok(Some(Negotiated { export, session }));
            }
            Opt::Info { go, name, requests } => {
                let Some(export) = server.find(&name) else {
                    wire::put_opt_reply(&mut out, oh.opt, REP_ERR_UNKNOWN, b"no such export");
                    wr.write_all(&out).await?;
                    continue;
                };
                let info = export.dev.info();
                let tflags = wire::transmission_flags(&info, export.read_only);
                wire::put_info_export(&mut out, oh.opt, info.size, tflags);
                if requests.contains(&INFO_NAME) {
                    wire::put_info_string(&mut out, oh.opt, INFO_NAME, &export.name);
                }
                if requests.contains(&INFO_DESCRIPTION) {
                    wire::put_info_string(&mut out, oh.opt, INFO_DESCRIPTION, &export.description);
                }
                // Sent whether asked or not, as the spec allows.
                let (min, pref, max) = server.block_sizes(&info);
                wire::put_info_block_size(&mut out, oh.opt, min, pref, max);
                wire::put_opt_reply(&mut out, oh.opt, REP_ACK, &[]);
                if go {
                    wr.write_all(&out).await?;
                    wr.flush().await?;
                    let session = server.session(&info, tflags, structured, &meta, &name);
                    return Ok(Some(Negotiated { export, session }));
                }
            }
            Opt::Unsupported(o) => {
                wire::put_opt_reply(&mut out, o, REP_ERR_UNSUP, b"option not supported");
            }
        }
        wr.write_all(&out).await?;
        wr.flush().await?;
    }
}

/// A completed request on its way to the writer.
struct Done {
    cookie: u64,
    /// READ: offset of the data; BLOCK_STATUS: requested length.
    offset: u64,
    len: u32,
    kind: u16,
    req_one: bool,
    result: Completion,
    _permit: Option<OwnedSemaphorePermit>,
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

async fn transmission<R, W>(
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
        // A write's payload may keep the receive chunk it arrived in alive
        // until the device drops it: charged too.
        let payload = match &action {
            Action::Write { len, .. } => *len as usize + recv::CHUNK,
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
        let mut done = Done {
            cookie: h.cookie,
            offset: h.offset,
            len: h.len,
            kind: h.cmd,
            req_one: h.flags & CMD_FLAG_REQ_ONE != 0,
            result: Ok(Reply::Done(0)),
            _permit: Some(permit),
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
            let structured = s.structured;
            dev.submit_cb(
                req,
                Box::new(move |c| {
                    done.result = c;
                    reply_now(out, done, structured, tx, &rt, peer);
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

/// The socket's write half, shared by the reader (replies of requests that
/// completed at once) and the writer task (the others).
struct Out<W> {
    w: W,
    /// A write failed: the client is gone, further replies are dropped.
    failed: bool,
}

/// Writes `buf` (then clears it) and `big`, and flushes. False if the
/// connection can no longer be written.
async fn out_write<W: AsyncWrite + Unpin>(
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

/// Sends one reply from the calling thread (any thread) if the socket is
/// free and takes it; a reply the socket only partly takes is finished by
/// a task that keeps the socket locked meanwhile. If another reply is
/// being written, this one goes to the writer task instead.
fn reply_now<W: ReplyWriter>(
    out: Arc<Mutex<Out<W>>>,
    d: Done,
    structured: bool,
    tx: mpsc::UnboundedSender<Done>,
    rt: &tokio::runtime::Handle,
    peer: Arc<str>,
) {
    let mut g = match out.try_lock_owned() {
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
    let mut big = encode(&mut buf, d, structured).unwrap_or_default();
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
fn encode(out: &mut BytesMut, d: Done, structured: bool) -> Option<Bytes> {
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

async fn writer<W: AsyncWrite + Unpin>(
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
