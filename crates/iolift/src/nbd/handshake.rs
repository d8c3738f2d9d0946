//! The handshake: fixed newstyle negotiation, option haggling and export
//! selection.
//!
//! Owns [`handshake`]: it sends the greeting, reads the client flags, then
//! answers options (`LIST`, `INFO`, `STRUCTURED_REPLY`, the meta-context
//! options, `ABORT`, and `UNSUP` for the rest) until `GO` or `EXPORT_NAME`
//! selects an export, and returns it with the [`Session`] that transmission
//! runs under (export size, transmission flags, structured replies and
//! `base:allocation` if negotiated, the largest request). Parsing and
//! encoding are the pure functions of `nbd/wire.rs`; this file only moves
//! bytes and keeps the negotiation's state (structured replies on, the
//! context chosen for which export name).
//!
//! Called by `conn::serve`, which bounds it with the handshake timeout and
//! shutdown. Assumes a buffered reader (`BufReader` of [`HANDSHAKE_BUF`]
//! bytes): options are read a few bytes at a time, and whatever the reader
//! has read past the final option (a client may send its first requests
//! right behind `GO`) is passed on to transmission by the caller.
//! Malformed options get an error reply and negotiation goes on; what
//! cannot be answered (bad magic, unknown client flags, a bad
//! `EXPORT_NAME`) is an [`HsError`] and ends the connection.

use super::proto::*;
use super::wire::{self, Fatal, Opt, Session};
use super::Server;
use bytes::BytesMut;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Handshake reader buffer size (transmission reads through
/// [`RecvBuf`](super::recv::RecvBuf)).
pub(super) const HANDSHAKE_BUF: usize = 16 * 1024;

/// The export and session a successful handshake leads to.
pub(crate) struct Negotiated {
    pub export: Arc<super::Export>,
    pub session: Session,
}

/// Why a handshake failed.
#[derive(Debug)]
pub(super) enum HsError {
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
pub(super) async fn handshake<R, W>(
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
