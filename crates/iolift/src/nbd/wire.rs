//! Pure parsers and encoders for the NBD wire format: no I/O, no state
//! beyond their arguments, so they can be unit-tested and fuzzed directly.
//!
//! - handshake: [`parse_client_flags`], [`parse_option_header`],
//!   [`parse_option`] (one option's payload);
//! - transmission: [`parse_request`] (28-byte header) and [`decode_request`]
//!   (validation against the export and the session: what to do with it);
//! - replies: `put_*` functions append to a `BytesMut`.
//!
//! Called by `handshake.rs` (options and their replies), `reader.rs`
//! (request headers) and `reply.rs` (transmission replies).

use super::proto::*;
use crate::block::{Errno, Extent, Flags, Request};
use bytes::{BufMut, BytesMut};

/// A fatal protocol violation: the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal(pub String);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

// ---------------------------------------------------------------- handshake

/// Flags the client sent after the server's greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Parses the 4-byte client flags; unknown bits are fatal (the spec says
/// the server MUST close the connection).
pub fn parse_client_flags(b: &[u8]) -> Result<ClientFlags, Fatal> {
    if b.len() < 4 {
        return Err(Fatal(format!("client flags truncated ({} bytes)", b.len())));
    }
    let f = be32(b);
    let known = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    if f & !known != 0 {
        return Err(Fatal(format!("unknown client flags {f:#x}")));
    }
    Ok(ClientFlags {
        fixed_newstyle: f & FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: f & FLAG_C_NO_ZEROES != 0,
    })
}

/// The 16-byte header of one client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub opt: u32,
    pub len: u32,
}

/// Parses an option header; a bad magic is fatal.
pub fn parse_option_header(b: &[u8]) -> Result<OptionHeader, Fatal> {
    if b.len() < OPTION_HEADER_LEN {
        return Err(Fatal(format!(
            "option header truncated ({} bytes)",
            b.len()
        )));
    }
    let magic = be64(b);
    if magic != IHAVEOPT {
        return Err(Fatal(format!("bad option magic {magic:#018x}")));
    }
    Ok(OptionHeader {
        opt: be32(&b[8..]),
        len: be32(&b[12..]),
    })
}

/// One parsed client option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opt {
    ExportName(String),
    Abort,
    List,
    /// NBD_OPT_INFO (`go == false`) or NBD_OPT_GO.
    Info {
        go: bool,
        name: String,
        requests: Vec<u16>,
    },
    StructuredReply,
    /// NBD_OPT_LIST_META_CONTEXT (`set == false`) or SET_META_CONTEXT.
    MetaContext {
        set: bool,
        export: String,
        queries: Vec<String>,
    },
    /// Anything we do not implement (STARTTLS, EXTENDED_HEADERS, unknown).
    Unsupported(u32),
}

/// An option the server answers with an error reply and then carries on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptError {
    /// NBD_REP_ERR_*.
    pub code: u32,
    pub msg: String,
}

fn invalid(msg: impl Into<String>) -> OptError {
    OptError {
        code: REP_ERR_INVALID,
        msg: msg.into(),
    }
}

/// A cursor over an option payload that fails with NBD_REP_ERR_INVALID.
struct Cur<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], OptError> {
        if self.b.len() < n {
            return Err(invalid(format!("{}: payload truncated", self.what)));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u16(&mut self) -> Result<u16, OptError> {
        self.take(2).map(be16)
    }
    fn u32(&mut self) -> Result<u32, OptError> {
        self.take(4).map(be32)
    }
    fn string(&mut self, n: usize) -> Result<String, OptError> {
        if n > MAX_STRING {
            return Err(invalid(format!(
                "{}: string of {n} bytes (max 4096)",
                self.what
            )));
        }
        let raw = self.take(n)?;
        check_string(raw).map_err(|m| invalid(format!("{}: {m}", self.what)))
    }
    fn end(&self) -> Result<(), OptError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(invalid(format!(
                "{}: {} trailing bytes",
                self.what,
                self.b.len()
            )))
        }
    }
}

/// An NBD string: UTF-8 without NUL, at most 4096 bytes.
pub fn check_string(raw: &[u8]) -> Result<String, String> {
    if raw.len() > MAX_STRING {
        return Err(format!("string of {} bytes (max 4096)", raw.len()));
    }
    if raw.contains(&0) {
        return Err("string contains NUL".into());
    }
    String::from_utf8(raw.to_vec()).map_err(|_| "string is not UTF-8".into())
}

/// Parses one option's payload. `Err` means: answer with that error
/// reply and keep negotiating.
pub fn parse_option(opt: u32, data: &[u8]) -> Result<Opt, OptError> {
    let mut c = Cur {
        b: data,
        what: opt_name(opt),
    };
    match opt {
        OPT_EXPORT_NAME => {
            let n = data.len();
            Ok(Opt::ExportName(c.string(n)?))
        }
        OPT_ABORT => Ok(Opt::Abort),
        OPT_LIST => {
            c.end()?;
            Ok(Opt::List)
        }
        OPT_STRUCTURED_REPLY => {
            c.end()?;
            Ok(Opt::StructuredReply)
        }
        OPT_INFO | OPT_GO => {
            let n = c.u32()? as usize;
            let name = c.string(n)?;
            let k = c.u16()? as usize;
            let mut requests = Vec::with_capacity(k.min(64));
            for _ in 0..k {
                requests.push(c.u16()?);
            }
            c.end()?;
            Ok(Opt::Info {
                go: opt == OPT_GO,
                name,
                requests,
            })
        }
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
            let n = c.u32()? as usize;
            let export = c.string(n)?;
            let k = c.u32()? as usize;
            // Each query takes at least 4 bytes: bound the count first.
            if k > c.b.len() / 4 {
                return Err(invalid(format!("{}: {k} queries do not fit", c.what)));
            }
            let mut queries = Vec::with_capacity(k);
            for _ in 0..k {
                let n = c.u32()? as usize;
                queries.push(c.string(n)?);
            }
            c.end()?;
            Ok(Opt::MetaContext {
                set: opt == OPT_SET_META_CONTEXT,
                export,
                queries,
            })
        }
        other => Ok(Opt::Unsupported(other)),
    }
}

/// Which of the contexts we serve match a list/set query list: only
/// `base:allocation` exists. An empty query list means "all" for LIST
/// and "none" for SET.
pub fn match_contexts(set: bool, queries: &[String]) -> bool {
    if queries.is_empty() {
        return !set;
    }
    queries
        .iter()
        .any(|q| q == BASE_ALLOCATION || (!set && (q == "base:" || q == "base")))
}

/// Appends the greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn put_greeting(b: &mut BytesMut) {
    b.put_u64(NBDMAGIC);
    b.put_u64(IHAVEOPT);
    b.put_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
}

/// Appends one option reply.
pub fn put_opt_reply(b: &mut BytesMut, opt: u32, typ: u32, data: &[u8]) {
    b.put_u64(OPT_REPLY_MAGIC);
    b.put_u32(opt);
    b.put_u32(typ);
    b.put_u32(data.len() as u32);
    b.put_slice(data);
}

/// Appends NBD_REP_INFO / NBD_INFO_EXPORT.
pub fn put_info_export(b: &mut BytesMut, opt: u32, size: u64, flags: u16) {
    let mut d = [0u8; 12];
    d[..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    d[2..10].copy_from_slice(&size.to_be_bytes());
    d[10..].copy_from_slice(&flags.to_be_bytes());
    put_opt_reply(b, opt, REP_INFO, &d);
}

/// Appends NBD_REP_INFO / NBD_INFO_BLOCK_SIZE.
pub fn put_info_block_size(b: &mut BytesMut, opt: u32, min: u32, pref: u32, max: u32) {
    let mut d = Vec::with_capacity(14);
    d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    d.extend_from_slice(&min.to_be_bytes());
    d.extend_from_slice(&pref.to_be_bytes());
    d.extend_from_slice(&max.to_be_bytes());
    put_opt_reply(b, opt, REP_INFO, &d);
}

/// Appends NBD_REP_INFO carrying a string (NBD_INFO_NAME/DESCRIPTION).
pub fn put_info_string(b: &mut BytesMut, opt: u32, info: u16, s: &str) {
    let mut d = Vec::with_capacity(2 + s.len());
    d.extend_from_slice(&info.to_be_bytes());
    d.extend_from_slice(s.as_bytes());
    put_opt_reply(b, opt, REP_INFO, &d);
}

/// Appends NBD_REP_SERVER for one export of NBD_OPT_LIST.
pub fn put_rep_server(b: &mut BytesMut, name: &str) {
    let mut d = Vec::with_capacity(4 + name.len());
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    put_opt_reply(b, OPT_LIST, REP_SERVER, &d);
}

/// Appends NBD_REP_META_CONTEXT.
pub fn put_rep_meta(b: &mut BytesMut, opt: u32, id: u32, name: &str) {
    let mut d = Vec::with_capacity(4 + name.len());
    d.extend_from_slice(&id.to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    put_opt_reply(b, opt, REP_META_CONTEXT, &d);
}

/// Appends the reply to NBD_OPT_EXPORT_NAME: size, flags, and 124 zero
/// bytes unless the client asked for NO_ZEROES.
pub fn put_export_name_reply(b: &mut BytesMut, size: u64, flags: u16, no_zeroes: bool) {
    b.put_u64(size);
    b.put_u16(flags);
    if !no_zeroes {
        b.put_bytes(0, 124);
    }
}

// ------------------------------------------------------------- transmission

/// A request header as it came off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

/// Parses a 28-byte request header; a bad magic is fatal (we can no
/// longer tell where the next request starts).
pub fn parse_request(b: &[u8]) -> Result<RequestHeader, Fatal> {
    if b.len() < REQUEST_LEN {
        return Err(Fatal(format!("request truncated ({} bytes)", b.len())));
    }
    let magic = be32(b);
    if magic != REQUEST_MAGIC {
        return Err(Fatal(format!("bad request magic {magic:#010x}")));
    }
    Ok(RequestHeader {
        flags: be16(&b[4..]),
        cmd: be16(&b[6..]),
        cookie: be64(&b[8..]),
        offset: be64(&b[16..]),
        len: be32(&b[24..]),
    })
}

/// What the export offers and the session negotiated: everything
/// [`decode_request`] needs to judge a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub size: u64,
    /// Transmission flags sent to the client.
    pub tflags: u16,
    pub structured: bool,
    pub base_allocation: bool,
    pub max_request: u32,
}

/// What to do with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Submit this request (never a write: see `Write`).
    Submit(Request),
    /// Read `len` payload bytes, then submit a write of them.
    Write { offset: u64, len: u32, flags: Flags },
    /// Discard `skip` payload bytes, then reply with this error.
    Reject { errno: Errno, skip: u32 },
    /// NBD_CMD_DISC: finish in-flight requests and close.
    Disconnect,
}

/// The transmission flags that describe an export honestly.
pub fn transmission_flags(info: &crate::block::DevInfo, read_only: bool) -> u16 {
    let ro = read_only || info.read_only;
    let mut f = FLAG_HAS_FLAGS;
    if ro {
        f |= FLAG_READ_ONLY;
    }
    if info.can_flush {
        f |= FLAG_SEND_FLUSH;
    }
    if info.can_fua && !ro {
        f |= FLAG_SEND_FUA;
    }
    if info.can_trim && !ro {
        f |= FLAG_SEND_TRIM;
    }
    if info.can_zero && !ro {
        f |= FLAG_SEND_WRITE_ZEROES;
        if info.can_fast_zero {
            f |= FLAG_SEND_FAST_ZERO;
        }
    }
    if info.can_multi_conn {
        f |= FLAG_CAN_MULTI_CONN;
    }
    if info.can_cache {
        f |= FLAG_SEND_CACHE;
    }
    f
}

/// Checks `[offset, offset+len)` against the export size.
fn range(s: &Session, offset: u64, len: u32, past_end: Errno) -> Result<(), Errno> {
    let end = offset.checked_add(len as u64).ok_or(Errno::EOVERFLOW)?;
    if end > s.size {
        return Err(past_end);
    }
    Ok(())
}

/// Judges one request header against the session: a pure function, so
/// every bad input class is testable without a socket.
pub fn decode_request(h: &RequestHeader, s: &Session) -> Action {
    // A write's payload follows its header whatever we think of it.
    let skip = if h.cmd == CMD_WRITE { h.len } else { 0 };
    let reject = |errno: Errno| Action::Reject { errno, skip };
    let known =
        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF | CMD_FLAG_REQ_ONE | CMD_FLAG_FAST_ZERO;
    if h.flags & !known != 0 {
        return reject(Errno::EINVAL);
    }
    let ro = s.tflags & FLAG_READ_ONLY != 0;
    let fua = h.flags & CMD_FLAG_FUA != 0;
    // A read-only export advertises no FUA; a FUA write there gets EPERM
    // below like every other write, not EINVAL for the flag.
    if fua
        && !ro
        && s.tflags & FLAG_SEND_FUA == 0
        && matches!(h.cmd, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES)
    {
        return reject(Errno::EINVAL);
    }
    if h.flags & CMD_FLAG_NO_HOLE != 0 && h.cmd != CMD_WRITE_ZEROES {
        return reject(Errno::EINVAL);
    }
    if h.flags & CMD_FLAG_FAST_ZERO != 0
        && (h.cmd != CMD_WRITE_ZEROES || s.tflags & FLAG_SEND_FAST_ZERO == 0)
    {
        return reject(Errno::EINVAL);
    }
    if h.flags & CMD_FLAG_REQ_ONE != 0 && h.cmd != CMD_BLOCK_STATUS {
        return reject(Errno::EINVAL);
    }
    // We never advertise SEND_DF.
    if h.flags & CMD_FLAG_DF != 0 {
        return reject(Errno::EINVAL);
    }
    let flags = Flags {
        fua,
        no_hole: h.flags & CMD_FLAG_NO_HOLE != 0,
        fast_zero: h.flags & CMD_FLAG_FAST_ZERO != 0,
    };
    let (offset, len) = (h.offset, h.len);
    let checked = |past_end: Errno| -> Result<(), Errno> {
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        range(s, offset, len, past_end)
    };
    match h.cmd {
        CMD_READ => {
            if len > s.max_request {
                return reject(Errno::EINVAL);
            }
            match checked(Errno::EINVAL) {
                Ok(()) => Action::Submit(Request::Read { offset, len }),
                Err(e) => reject(e),
            }
        }
        CMD_WRITE => {
            if len > s.max_request {
                return reject(Errno::EINVAL);
            }
            if ro {
                return reject(Errno::EPERM);
            }
            match checked(Errno::ENOSPC) {
                Ok(()) => Action::Write { offset, len, flags },
                Err(e) => reject(e),
            }
        }
        CMD_DISC => Action::Disconnect,
        CMD_FLUSH => {
            if s.tflags & FLAG_SEND_FLUSH == 0 {
                return reject(Errno::EINVAL);
            }
            Action::Submit(Request::Flush)
        }
        CMD_TRIM => {
            if ro {
                return reject(Errno::EPERM);
            }
            if s.tflags & FLAG_SEND_TRIM == 0 {
                return reject(Errno::EINVAL);
            }
            match checked(Errno::EINVAL) {
                Ok(()) => Action::Submit(Request::Trim { offset, len, flags }),
                Err(e) => reject(e),
            }
        }
        CMD_WRITE_ZEROES => {
            if ro {
                return reject(Errno::EPERM);
            }
            if s.tflags & FLAG_SEND_WRITE_ZEROES == 0 {
                return reject(Errno::EINVAL);
            }
            match checked(Errno::ENOSPC) {
                Ok(()) => Action::Submit(Request::WriteZeroes { offset, len, flags }),
                Err(e) => reject(e),
            }
        }
        CMD_CACHE => {
            if s.tflags & FLAG_SEND_CACHE == 0 {
                return reject(Errno::EINVAL);
            }
            match checked(Errno::EINVAL) {
                Ok(()) => Action::Submit(Request::Cache { offset, len }),
                Err(e) => reject(e),
            }
        }
        CMD_BLOCK_STATUS => {
            if !s.structured || !s.base_allocation {
                return reject(Errno::EINVAL);
            }
            match checked(Errno::EINVAL) {
                Ok(()) => Action::Submit(Request::BlockStatus { offset, len }),
                Err(e) => reject(e),
            }
        }
        _ => reject(Errno::EINVAL),
    }
}

/// Maps a host errno to one the NBD wire may carry.
pub fn nbd_errno(e: Errno) -> u32 {
    match e.0 {
        libc::EPERM | libc::EROFS | libc::EACCES => NBD_EPERM,
        libc::EIO => NBD_EIO,
        libc::ENOMEM => NBD_ENOMEM,
        libc::EINVAL => NBD_EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => NBD_ENOSPC,
        libc::EOVERFLOW => NBD_EOVERFLOW,
        libc::ENOTSUP => NBD_ENOTSUP,
        libc::ESHUTDOWN => NBD_ESHUTDOWN,
        _ => NBD_EIO,
    }
}

/// Appends a simple reply header (the caller appends read data).
pub fn put_simple_reply(b: &mut BytesMut, cookie: u64, error: u32) {
    b.put_u32(SIMPLE_REPLY_MAGIC);
    b.put_u32(error);
    b.put_u64(cookie);
}

/// Appends a structured reply chunk header.
pub fn put_chunk_header(b: &mut BytesMut, flags: u16, typ: u16, cookie: u64, len: u32) {
    b.put_u32(STRUCTURED_REPLY_MAGIC);
    b.put_u16(flags);
    b.put_u16(typ);
    b.put_u64(cookie);
    b.put_u32(len);
}

/// Appends the header of a final OFFSET_DATA chunk of `len` data bytes
/// (the caller appends the data).
pub fn put_offset_data_header(b: &mut BytesMut, cookie: u64, offset: u64, len: u32) {
    put_chunk_header(b, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, 8 + len);
    b.put_u64(offset);
}

/// Appends a final NBD_REPLY_TYPE_ERROR chunk.
pub fn put_error_chunk(b: &mut BytesMut, cookie: u64, error: u32, msg: &str) {
    let msg = &msg.as_bytes()[..msg.len().min(MAX_STRING)];
    put_chunk_header(
        b,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        6 + msg.len() as u32,
    );
    b.put_u32(error);
    b.put_u16(msg.len() as u16);
    b.put_slice(msg);
}

/// Appends a final BLOCK_STATUS chunk describing at most `len` bytes
/// (one extent if `req_one`). Extents are clipped to the request; an empty
/// list (a device that cannot tell) becomes one allocated extent.
pub fn put_block_status(
    b: &mut BytesMut,
    cookie: u64,
    ctx: u32,
    extents: &[Extent],
    len: u32,
    req_one: bool,
) {
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut left = len as u64;
    for e in extents {
        if left == 0 {
            break;
        }
        let n = e.len.min(left);
        if n == 0 {
            continue;
        }
        let st = if e.hole { STATE_HOLE } else { 0 } | if e.zero { STATE_ZERO } else { 0 };
        match out.last_mut() {
            Some(last) if last.1 == st => last.0 += n as u32,
            _ => out.push((n as u32, st)),
        }
        left -= n;
        if req_one {
            break;
        }
    }
    if out.is_empty() {
        out.push((len, 0));
    }
    if req_one {
        out.truncate(1);
    }
    put_chunk_header(
        b,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        4 + 8 * out.len() as u32,
    );
    b.put_u32(ctx);
    for (n, st) in out {
        b.put_u32(n);
        b.put_u32(st);
    }
}
