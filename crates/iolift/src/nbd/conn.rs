//! One NBD connection's lifecycle: handshake, then transmission.
//!
//! Owns [`serve`], which the accept loop in `nbd/mod.rs` spawns once per
//! accepted socket, given its read and write halves. It wraps the read half
//! for poll mode ([`Polled`], `nbd/poll.rs`) and, for the handshake only, in
//! a 16 KiB `BufReader`; runs the handshake (`nbd/handshake.rs`) under the
//! server's handshake timeout, giving up at once on shutdown; then hands the
//! negotiated export and session, the read half and the bytes the
//! `BufReader` already holds to the reader (`nbd/reader.rs`), which runs
//! transmission on this same task until the connection ends. Replies go out
//! through `nbd/reply.rs`.
//!
//! Assumes nothing of the client: every way a handshake can end is logged
//! in one line and ends the connection; nothing here panics on its input.

use super::handshake::{handshake, HANDSHAKE_BUF};
use super::poll::{Polled, RawSocket};
use super::reader::transmission;
use super::Server;
use std::sync::Arc;
use tokio::io::{AsyncRead, BufReader};
use tokio::sync::watch;

pub use super::reply::ReplyWriter;

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
    let rd = Polled::new(
        rd,
        server.cfg.poll,
        server.spin_gate.clone(),
        server.load.clone(),
    );
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
