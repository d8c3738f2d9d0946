//! Tests of the NBD front-end: parser unit tests (every malformed input
//! class), in-process servers driven with raw bytes over a unix socket,
//! and a stable-Rust fuzz harness (`IOLIFT_FUZZ_ITERS`, see docs/nbd.md).

use super::proto::*;
use super::wire::{self, Action, Opt, Session};
use super::{Export, Listener, Server, ServerCfg};
use crate::backend::memory::MemoryDev;
use crate::block::{Errno, Extent, Flags, Request};
use bytes::BytesMut;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

// ------------------------------------------------------------ helpers

fn opt_bytes(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn go_payload(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        v.extend_from_slice(&(q.len() as u32).to_be_bytes());
        v.extend_from_slice(q.as_bytes());
    }
    v
}

fn req_bytes(flags: u16, cmd: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(28);
    v.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&cmd.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

fn session() -> Session {
    Session {
        size: 1 << 20,
        tflags: wire::transmission_flags(&crate::block::DevInfo::full(1 << 20), false),
        structured: true,
        base_allocation: true,
        max_request: 64 << 10,
    }
}

fn hdr(flags: u16, cmd: u16, offset: u64, len: u32) -> wire::RequestHeader {
    wire::parse_request(&req_bytes(flags, cmd, 7, offset, len)).unwrap()
}

// ------------------------------------------------------- parser tests

#[test]
fn client_flags() {
    let f = wire::parse_client_flags(&3u32.to_be_bytes()).unwrap();
    assert!(f.fixed_newstyle && f.no_zeroes);
    let f = wire::parse_client_flags(&1u32.to_be_bytes()).unwrap();
    assert!(f.fixed_newstyle && !f.no_zeroes);
    assert!(
        wire::parse_client_flags(&4u32.to_be_bytes()).is_err(),
        "unknown bit"
    );
    assert!(wire::parse_client_flags(&[0, 0, 1]).is_err(), "truncated");
}

#[test]
fn option_headers() {
    let b = opt_bytes(OPT_GO, &[]);
    assert_eq!(
        wire::parse_option_header(&b).unwrap(),
        wire::OptionHeader {
            opt: OPT_GO,
            len: 0
        }
    );
    let mut bad = b.clone();
    bad[0] ^= 1;
    assert!(wire::parse_option_header(&bad).is_err(), "bad magic");
    assert!(wire::parse_option_header(&b[..15]).is_err(), "truncated");
}

#[test]
fn options_valid() {
    assert_eq!(
        wire::parse_option(OPT_GO, &go_payload("disk", &[INFO_BLOCK_SIZE])).unwrap(),
        Opt::Info {
            go: true,
            name: "disk".into(),
            requests: vec![INFO_BLOCK_SIZE]
        }
    );
    assert_eq!(
        wire::parse_option(OPT_INFO, &go_payload("", &[])).unwrap(),
        Opt::Info {
            go: false,
            name: "".into(),
            requests: vec![]
        }
    );
    assert_eq!(
        wire::parse_option(OPT_EXPORT_NAME, b"x").unwrap(),
        Opt::ExportName("x".into())
    );
    assert_eq!(wire::parse_option(OPT_LIST, &[]).unwrap(), Opt::List);
    assert_eq!(wire::parse_option(OPT_ABORT, &[]).unwrap(), Opt::Abort);
    assert_eq!(
        wire::parse_option(OPT_STRUCTURED_REPLY, &[]).unwrap(),
        Opt::StructuredReply
    );
    assert_eq!(
        wire::parse_option(OPT_SET_META_CONTEXT, &meta_payload("", &[BASE_ALLOCATION])).unwrap(),
        Opt::MetaContext {
            set: true,
            export: "".into(),
            queries: vec![BASE_ALLOCATION.into()]
        }
    );
    assert_eq!(
        wire::parse_option(OPT_STARTTLS, &[]).unwrap(),
        Opt::Unsupported(OPT_STARTTLS)
    );
    assert_eq!(
        wire::parse_option(999, &[1, 2]).unwrap(),
        Opt::Unsupported(999)
    );
}

#[test]
fn options_malformed() {
    let inval = |opt, d: &[u8]| {
        let e = wire::parse_option(opt, d).unwrap_err();
        assert_eq!(e.code, REP_ERR_INVALID, "{opt} {d:?}: {e:?}");
    };
    let go = go_payload("disk", &[INFO_NAME, INFO_BLOCK_SIZE]);
    // Every truncation of a GO payload is invalid.
    for n in 0..go.len() {
        inval(OPT_GO, &go[..n]);
    }
    let mut trailing = go.clone();
    trailing.push(0);
    inval(OPT_GO, &trailing);
    // Name length larger than the payload / larger than 4096.
    inval(OPT_GO, &[0xff, 0xff, 0xff, 0xff, 0, 0]);
    let long = "x".repeat(MAX_STRING + 1);
    inval(OPT_INFO, &go_payload(&long, &[]));
    inval(OPT_EXPORT_NAME, long.as_bytes());
    inval(OPT_GO, &go_payload("a\0b", &[]));
    let mut nonutf = go_payload("ab", &[]);
    nonutf[4] = 0xff;
    inval(OPT_GO, &nonutf);
    inval(OPT_LIST, &[0]);
    inval(OPT_STRUCTURED_REPLY, &[0, 0]);
    let m = meta_payload("", &[BASE_ALLOCATION, "base:"]);
    for n in 0..m.len() {
        inval(OPT_LIST_META_CONTEXT, &m[..n]);
    }
    // A query count that cannot fit must not allocate.
    let mut huge = meta_payload("", &[]);
    huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    inval(OPT_SET_META_CONTEXT, &huge);
}

#[test]
fn meta_context_matching() {
    assert!(wire::match_contexts(true, &[BASE_ALLOCATION.into()]));
    assert!(
        !wire::match_contexts(true, &[]),
        "SET with no query selects none"
    );
    assert!(
        wire::match_contexts(false, &[]),
        "LIST with no query lists all"
    );
    assert!(wire::match_contexts(false, &["base:".into()]));
    assert!(!wire::match_contexts(true, &["base:".into()]));
    assert!(!wire::match_contexts(true, &["qemu:dirty-bitmap:x".into()]));
}

#[test]
fn request_headers() {
    let b = req_bytes(CMD_FLAG_FUA, CMD_WRITE, 0x1122, 4096, 512);
    let h = wire::parse_request(&b).unwrap();
    assert_eq!(
        (h.flags, h.cmd, h.cookie, h.offset, h.len),
        (CMD_FLAG_FUA, CMD_WRITE, 0x1122, 4096, 512)
    );
    let mut bad = b.clone();
    bad[3] ^= 0x80;
    assert!(wire::parse_request(&bad).is_err(), "bad magic");
    assert!(wire::parse_request(&b[..27]).is_err(), "truncated");
}

#[test]
fn decode_valid_requests() {
    let s = session();
    assert_eq!(
        wire::decode_request(&hdr(0, CMD_READ, 0, 4096), &s),
        Action::Submit(Request::Read {
            offset: 0,
            len: 4096
        })
    );
    assert_eq!(
        wire::decode_request(&hdr(CMD_FLAG_FUA, CMD_WRITE, 4096, 512), &s),
        Action::Write {
            offset: 4096,
            len: 512,
            flags: Flags::FUA
        }
    );
    assert_eq!(
        wire::decode_request(&hdr(0, CMD_FLUSH, 0, 0), &s),
        Action::Submit(Request::Flush)
    );
    assert_eq!(
        wire::decode_request(
            &hdr(
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                CMD_WRITE_ZEROES,
                0,
                1 << 20
            ),
            &s
        ),
        Action::Submit(Request::WriteZeroes {
            offset: 0,
            len: 1 << 20,
            flags: Flags {
                fua: false,
                no_hole: true,
                fast_zero: true
            }
        })
    );
    // Trim, zero, cache and block status may exceed max_request.
    assert!(matches!(
        wire::decode_request(&hdr(0, CMD_TRIM, 0, 1 << 20), &s),
        Action::Submit(Request::Trim { .. })
    ));
    assert!(matches!(
        wire::decode_request(&hdr(0, CMD_CACHE, 0, 1 << 20), &s),
        Action::Submit(Request::Cache { .. })
    ));
    assert!(matches!(
        wire::decode_request(&hdr(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 0, 1 << 20), &s),
        Action::Submit(Request::BlockStatus { .. })
    ));
    assert_eq!(
        wire::decode_request(&hdr(0, CMD_DISC, 0, 0), &s),
        Action::Disconnect
    );
}

#[test]
fn decode_bad_requests() {
    let s = session();
    let rej = |h: wire::RequestHeader, s: &Session| match wire::decode_request(&h, s) {
        Action::Reject { errno, skip } => (errno, skip),
        a => panic!("{h:?} accepted as {a:?}"),
    };
    let size = s.size;
    // Out of range, overflow.
    assert_eq!(rej(hdr(0, CMD_READ, size - 1, 2), &s), (Errno::EINVAL, 0));
    assert_eq!(
        rej(hdr(0, CMD_READ, u64::MAX, 2), &s),
        (Errno::EOVERFLOW, 0)
    );
    assert_eq!(rej(hdr(0, CMD_WRITE, size, 1), &s), (Errno::ENOSPC, 1));
    assert_eq!(
        rej(hdr(0, CMD_WRITE, u64::MAX - 10, 100), &s),
        (Errno::EOVERFLOW, 100)
    );
    assert_eq!(
        rej(hdr(0, CMD_WRITE_ZEROES, size - 1, 4), &s),
        (Errno::ENOSPC, 0)
    );
    assert_eq!(rej(hdr(0, CMD_TRIM, size, 4), &s), (Errno::EINVAL, 0));
    assert_eq!(rej(hdr(0, CMD_CACHE, size + 1, 4), &s), (Errno::EINVAL, 0));
    assert_eq!(
        rej(hdr(0, CMD_BLOCK_STATUS, size, 1), &s),
        (Errno::EINVAL, 0)
    );
    // Oversized payloads: the write's payload is still skipped.
    assert_eq!(
        rej(hdr(0, CMD_READ, 0, s.max_request + 1), &s),
        (Errno::EINVAL, 0)
    );
    assert_eq!(
        rej(hdr(0, CMD_WRITE, 0, s.max_request + 1), &s),
        (Errno::EINVAL, s.max_request + 1)
    );
    // Zero length.
    assert_eq!(rej(hdr(0, CMD_READ, 0, 0), &s), (Errno::EINVAL, 0));
    assert_eq!(rej(hdr(0, CMD_TRIM, 0, 0), &s), (Errno::EINVAL, 0));
    // Unknown command and flags, flags on the wrong command.
    assert_eq!(rej(hdr(0, 99, 0, 10), &s), (Errno::EINVAL, 0));
    assert_eq!(rej(hdr(1 << 9, CMD_WRITE, 0, 10), &s), (Errno::EINVAL, 10));
    assert_eq!(
        rej(hdr(CMD_FLAG_NO_HOLE, CMD_WRITE, 0, 10), &s),
        (Errno::EINVAL, 10)
    );
    assert_eq!(
        rej(hdr(CMD_FLAG_REQ_ONE, CMD_READ, 0, 10), &s),
        (Errno::EINVAL, 0)
    );
    assert_eq!(
        rej(hdr(CMD_FLAG_FAST_ZERO, CMD_TRIM, 0, 10), &s),
        (Errno::EINVAL, 0)
    );
    assert_eq!(
        rej(hdr(CMD_FLAG_DF, CMD_READ, 0, 10), &s),
        (Errno::EINVAL, 0)
    );
    // Block status needs structured replies and the context.
    let mut ns = s;
    ns.base_allocation = false;
    assert_eq!(
        rej(hdr(0, CMD_BLOCK_STATUS, 0, 10), &ns),
        (Errno::EINVAL, 0)
    );
    ns.structured = false;
    assert_eq!(
        rej(hdr(0, CMD_BLOCK_STATUS, 0, 10), &ns),
        (Errno::EINVAL, 0)
    );
    // Read-only export.
    let mut ro = s;
    ro.tflags = wire::transmission_flags(&crate::block::DevInfo::full(size), true);
    assert_eq!(rej(hdr(0, CMD_WRITE, 0, 10), &ro), (Errno::EPERM, 10));
    assert_eq!(rej(hdr(0, CMD_TRIM, 0, 10), &ro), (Errno::EPERM, 0));
    assert_eq!(rej(hdr(0, CMD_WRITE_ZEROES, 0, 10), &ro), (Errno::EPERM, 0));
    assert!(matches!(
        wire::decode_request(&hdr(0, CMD_READ, 0, 10), &ro),
        Action::Submit(_)
    ));
}

#[test]
fn flags_tell_the_truth() {
    let mut i = crate::block::DevInfo::full(1);
    let f = wire::transmission_flags(&i, false);
    for bit in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_SEND_FAST_ZERO,
        FLAG_CAN_MULTI_CONN,
        FLAG_SEND_CACHE,
    ] {
        assert_ne!(f & bit, 0, "{bit:#x}");
    }
    assert_eq!(f & FLAG_READ_ONLY, 0);
    i.can_trim = false;
    i.can_fast_zero = false;
    i.can_multi_conn = false;
    i.read_only = true;
    let f = wire::transmission_flags(&i, false);
    assert_ne!(f & FLAG_READ_ONLY, 0);
    for bit in [
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_SEND_FAST_ZERO,
        FLAG_CAN_MULTI_CONN,
    ] {
        assert_eq!(f & bit, 0, "{bit:#x}");
    }
}

#[test]
fn block_status_encoding() {
    let ext = [
        Extent {
            len: 100,
            hole: false,
            zero: false,
        },
        Extent {
            len: 50,
            hole: false,
            zero: false,
        },
        Extent {
            len: 1000,
            hole: true,
            zero: true,
        },
    ];
    let mut b = BytesMut::new();
    wire::put_block_status(&mut b, 9, 1, &ext, 200, false);
    // header 20 + ctx 4 + two merged descriptors (150 data, 50 hole).
    assert_eq!(b.len(), 20 + 4 + 16);
    assert_eq!(&b[24..32], &[0, 0, 0, 150, 0, 0, 0, 0]);
    assert_eq!(&b[32..40], &[0, 0, 0, 50, 0, 0, 0, 3]);
    let mut b = BytesMut::new();
    wire::put_block_status(&mut b, 9, 1, &ext, 200, true);
    assert_eq!(b.len(), 20 + 4 + 8, "REQ_ONE: one descriptor");
    let mut b = BytesMut::new();
    wire::put_block_status(&mut b, 9, 1, &[], 77, false);
    assert_eq!(&b[24..32], &[0, 0, 0, 77, 0, 0, 0, 0], "unknown = data");
}

#[test]
fn errno_mapping() {
    assert_eq!(wire::nbd_errno(Errno::EPERM), NBD_EPERM);
    assert_eq!(wire::nbd_errno(Errno(libc::EROFS)), NBD_EPERM);
    assert_eq!(wire::nbd_errno(Errno::ENOSPC), NBD_ENOSPC);
    assert_eq!(wire::nbd_errno(Errno::EOVERFLOW), NBD_EOVERFLOW);
    assert_eq!(wire::nbd_errno(Errno(libc::ETIMEDOUT)), NBD_EIO);
}

// ------------------------------------------------- in-process server

struct TestServer {
    path: PathBuf,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start(exports: Vec<Export>, default_export: Option<&str>, cfg: ServerCfg) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let server = Arc::new(Server::new(exports, default_export.map(String::from), cfg));
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(super::run(
        server,
        vec![Listener::Unix(l, Some(path.clone()))],
        rx,
        Duration::from_secs(5),
    ));
    TestServer {
        path,
        stop,
        task,
        _dir: dir,
    }
}

fn mem_export(name: &str, size: u64, read_only: bool) -> Export {
    Export {
        name: name.into(),
        dev: Arc::new(MemoryDev::new(size)),
        read_only,
        description: "test memory".into(),
    }
}

async fn read_u16(s: &mut UnixStream) -> u16 {
    s.read_u16().await.unwrap()
}

/// Reads one option reply: (opt, type, data).
async fn read_opt_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    assert_eq!(s.read_u64().await.unwrap(), OPT_REPLY_MAGIC);
    let opt = s.read_u32().await.unwrap();
    let typ = s.read_u32().await.unwrap();
    let len = s.read_u32().await.unwrap();
    let mut d = vec![0; len as usize];
    s.read_exact(&mut d).await.unwrap();
    (opt, typ, d)
}

/// Greeting + client flags.
async fn hello(path: &Path) -> UnixStream {
    let mut s = UnixStream::connect(path).await.unwrap();
    assert_eq!(s.read_u64().await.unwrap(), NBDMAGIC);
    assert_eq!(s.read_u64().await.unwrap(), IHAVEOPT);
    assert_eq!(read_u16(&mut s).await, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    s.write_all(&3u32.to_be_bytes()).await.unwrap();
    s
}

/// Handshake through GO; returns the stream, size and transmission flags.
async fn connect(path: &Path, name: &str, structured: bool) -> (UnixStream, u64, u16) {
    let mut s = hello(path).await;
    if structured {
        s.write_all(&opt_bytes(OPT_STRUCTURED_REPLY, &[]))
            .await
            .unwrap();
        assert_eq!(read_opt_reply(&mut s).await.1, REP_ACK);
        s.write_all(&opt_bytes(
            OPT_SET_META_CONTEXT,
            &meta_payload(name, &[BASE_ALLOCATION]),
        ))
        .await
        .unwrap();
        let (_, t, d) = read_opt_reply(&mut s).await;
        assert_eq!(t, REP_META_CONTEXT);
        assert_eq!(&d[4..], BASE_ALLOCATION.as_bytes());
        assert_eq!(read_opt_reply(&mut s).await.1, REP_ACK);
    }
    s.write_all(&opt_bytes(OPT_GO, &go_payload(name, &[INFO_BLOCK_SIZE])))
        .await
        .unwrap();
    let (mut size, mut flags) = (0, 0);
    loop {
        let (opt, t, d) = read_opt_reply(&mut s).await;
        assert_eq!(opt, OPT_GO);
        if t == REP_ACK {
            break;
        }
        assert_eq!(
            t,
            REP_INFO,
            "GO failed: {t:#x} {}",
            String::from_utf8_lossy(&d)
        );
        if u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT {
            size = u64::from_be_bytes(d[2..10].try_into().unwrap());
            flags = u16::from_be_bytes([d[10], d[11]]);
        }
    }
    (s, size, flags)
}

/// Reads a simple reply: (error, cookie).
async fn simple(s: &mut UnixStream) -> (u32, u64) {
    assert_eq!(s.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
    let e = s.read_u32().await.unwrap();
    (e, s.read_u64().await.unwrap())
}

/// Reads a reply of either kind: (magic, flags, type, cookie, payload or error).
async fn any_reply(s: &mut UnixStream, read_len: Option<usize>) -> (u32, u16, u16, u64, Vec<u8>) {
    let magic = s.read_u32().await.unwrap();
    if magic == SIMPLE_REPLY_MAGIC {
        let e = s.read_u32().await.unwrap();
        let c = s.read_u64().await.unwrap();
        let mut d = vec![0; if e == 0 { read_len.unwrap_or(0) } else { 0 }];
        s.read_exact(&mut d).await.unwrap();
        return (
            magic,
            0,
            0,
            c,
            e.to_be_bytes().into_iter().chain(d).collect(),
        );
    }
    assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
    let f = s.read_u16().await.unwrap();
    let t = s.read_u16().await.unwrap();
    let c = s.read_u64().await.unwrap();
    let len = s.read_u32().await.unwrap();
    let mut d = vec![0; len as usize];
    s.read_exact(&mut d).await.unwrap();
    (magic, f, t, c, d)
}

async fn expect_eof(s: &mut UnixStream) {
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
        .await
        .expect("server did not close the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "expected the server to close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_handshake_options() {
    let ts = start(
        vec![
            mem_export("a", 1 << 20, false),
            mem_export("b", 2 << 20, true),
        ],
        Some("a"),
        ServerCfg::default(),
    )
    .await;
    let mut s = hello(&ts.path).await;
    // LIST
    s.write_all(&opt_bytes(OPT_LIST, &[])).await.unwrap();
    let mut names = Vec::new();
    loop {
        let (_, t, d) = read_opt_reply(&mut s).await;
        if t == REP_ACK {
            break;
        }
        assert_eq!(t, REP_SERVER);
        names.push(String::from_utf8(d[4..].to_vec()).unwrap());
    }
    assert_eq!(names, vec!["a", "b"]);
    // Unknown option, STARTTLS: UNSUP; malformed LIST: INVALID.
    s.write_all(&opt_bytes(4242, b"junk")).await.unwrap();
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ERR_UNSUP);
    s.write_all(&opt_bytes(OPT_STARTTLS, &[])).await.unwrap();
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ERR_UNSUP);
    s.write_all(&opt_bytes(OPT_LIST, b"x")).await.unwrap();
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ERR_INVALID);
    // SET_META_CONTEXT before STRUCTURED_REPLY: INVALID.
    s.write_all(&opt_bytes(
        OPT_SET_META_CONTEXT,
        &meta_payload("a", &[BASE_ALLOCATION]),
    ))
    .await
    .unwrap();
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ERR_INVALID);
    // LIST_META_CONTEXT with no query lists base:allocation.
    s.write_all(&opt_bytes(OPT_LIST_META_CONTEXT, &meta_payload("a", &[])))
        .await
        .unwrap();
    let (_, t, d) = read_opt_reply(&mut s).await;
    assert_eq!((t, &d[4..]), (REP_META_CONTEXT, BASE_ALLOCATION.as_bytes()));
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ACK);
    // INFO on a missing export: UNKNOWN; on "b": read-only, with name.
    s.write_all(&opt_bytes(OPT_INFO, &go_payload("zz", &[])))
        .await
        .unwrap();
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ERR_UNKNOWN);
    s.write_all(&opt_bytes(
        OPT_INFO,
        &go_payload("b", &[INFO_NAME, INFO_DESCRIPTION]),
    ))
    .await
    .unwrap();
    let mut seen = Vec::new();
    loop {
        let (_, t, d) = read_opt_reply(&mut s).await;
        if t == REP_ACK {
            break;
        }
        let info = u16::from_be_bytes([d[0], d[1]]);
        seen.push(info);
        match info {
            INFO_EXPORT => {
                assert_eq!(u64::from_be_bytes(d[2..10].try_into().unwrap()), 2 << 20);
                let f = u16::from_be_bytes([d[10], d[11]]);
                assert_ne!(f & FLAG_READ_ONLY, 0);
                assert_eq!(f & FLAG_SEND_TRIM, 0);
            }
            INFO_NAME => assert_eq!(&d[2..], b"b"),
            INFO_DESCRIPTION => assert_eq!(&d[2..], b"test memory"),
            INFO_BLOCK_SIZE => {
                assert_eq!(u32::from_be_bytes(d[2..6].try_into().unwrap()), 1);
                assert_eq!(u32::from_be_bytes(d[10..14].try_into().unwrap()), 32 << 20);
            }
            _ => panic!("unexpected info {info}"),
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]
    );
    // Oversized option: TOO_BIG, and the stream stays in sync.
    s.write_all(&opt_bytes(OPT_GO, &vec![0u8; MAX_OPTION_LEN as usize + 1]))
        .await
        .unwrap();
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ERR_TOO_BIG);
    // ABORT: ACK then close.
    s.write_all(&opt_bytes(OPT_ABORT, &[])).await.unwrap();
    assert_eq!(read_opt_reply(&mut s).await.1, REP_ACK);
    expect_eof(&mut s).await;

    // EXPORT_NAME "" picks the default export, NO_ZEROES honoured.
    let mut s = hello(&ts.path).await;
    s.write_all(&opt_bytes(OPT_EXPORT_NAME, b"")).await.unwrap();
    assert_eq!(s.read_u64().await.unwrap(), 1 << 20);
    let f = read_u16(&mut s).await;
    assert_ne!(f & FLAG_HAS_FLAGS, 0);
    s.write_all(&req_bytes(0, CMD_READ, 5, 0, 8)).await.unwrap();
    assert_eq!(
        simple(&mut s).await,
        (0, 5),
        "no 124 zero bytes before the reply"
    );
    let mut d = [1u8; 8];
    s.read_exact(&mut d).await.unwrap();
    assert_eq!(d, [0; 8]);
    s.write_all(&req_bytes(0, CMD_DISC, 6, 0, 0)).await.unwrap();
    expect_eof(&mut s).await;

    // EXPORT_NAME of a missing export closes the connection.
    let mut s = hello(&ts.path).await;
    s.write_all(&opt_bytes(OPT_EXPORT_NAME, b"nope"))
        .await
        .unwrap();
    expect_eof(&mut s).await;

    // Bad option magic closes; unknown client flags close.
    let mut s = hello(&ts.path).await;
    let mut o = opt_bytes(OPT_LIST, &[]);
    o[0] = 0;
    s.write_all(&o).await.unwrap();
    expect_eof(&mut s).await;
    let mut s = UnixStream::connect(&ts.path).await.unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).await.unwrap();
    s.write_all(&0x80u32.to_be_bytes()).await.unwrap();
    expect_eof(&mut s).await;

    ts.stop.send(true).unwrap();
    ts.task.await.unwrap();
    assert!(!ts.path.exists(), "socket removed at stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_transmission_structured() {
    let cfg = ServerCfg {
        max_request: 1 << 20,
        ..ServerCfg::default()
    };
    let ts = start(vec![mem_export("", 4 << 20, false)], None, cfg).await;
    let (mut s, size, flags) = connect(&ts.path, "", true).await;
    assert_eq!(size, 4 << 20);
    assert_ne!(flags & FLAG_CAN_MULTI_CONN, 0);
    // Pipeline 16 writes of distinct patterns, then 16 reads.
    let mut out = Vec::new();
    for i in 0..16u64 {
        out.extend(req_bytes(CMD_FLAG_FUA, CMD_WRITE, i, i * 65536, 65536));
        out.extend(std::iter::repeat_n(i as u8 + 1, 65536));
    }
    for i in 0..16u64 {
        out.extend(req_bytes(0, CMD_READ, 100 + i, i * 65536, 65536));
    }
    s.write_all(&out).await.unwrap();
    let mut writes = 0;
    let mut reads = 0;
    for _ in 0..32 {
        let (magic, f, t, cookie, d) = any_reply(&mut s, None).await;
        if cookie < 100 {
            assert_eq!((magic, &d[..]), (SIMPLE_REPLY_MAGIC, &[0u8, 0, 0, 0][..]));
            writes += 1;
        } else {
            assert_eq!((f, t), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
            let i = cookie - 100;
            assert_eq!(u64::from_be_bytes(d[..8].try_into().unwrap()), i * 65536);
            assert!(d[8..].iter().all(|&b| b == i as u8 + 1), "read {i} data");
            reads += 1;
        }
    }
    assert_eq!((writes, reads), (16, 16));
    // Block status: data then hole.
    s.write_all(&req_bytes(0, CMD_BLOCK_STATUS, 200, 0, 4 << 20))
        .await
        .unwrap();
    let (_, f, t, c, d) = any_reply(&mut s, None).await;
    assert_eq!((f, t, c), (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, 200));
    assert_eq!(
        u32::from_be_bytes(d[..4].try_into().unwrap()),
        BASE_ALLOCATION_ID
    );
    assert_eq!(&d[4..12], &[0, 0x10, 0, 0, 0, 0, 0, 0], "1 MiB data");
    assert_eq!(&d[12..20], &[0, 0x30, 0, 0, 0, 0, 0, 3], "3 MiB hole");
    // Errors: read past end -> ERROR chunk EINVAL; write past end -> ENOSPC
    // (payload skipped); oversize write -> EINVAL; unknown command.
    let mut out = req_bytes(0, CMD_READ, 300, size - 1, 2);
    out.extend(req_bytes(0, CMD_WRITE, 301, size - 1, 2));
    out.extend([9, 9]);
    out.extend(req_bytes(0, CMD_WRITE, 302, 0, (1 << 20) + 1));
    out.extend(vec![7u8; (1 << 20) + 1]);
    out.extend(req_bytes(0, 77, 303, 0, 0));
    out.extend(req_bytes(0, CMD_READ, 304, u64::MAX - 1, 4));
    out.extend(req_bytes(0, CMD_FLUSH, 305, 0, 0));
    s.write_all(&out).await.unwrap();
    let mut got = std::collections::HashMap::new();
    for _ in 0..6 {
        let (magic, _f, t, c, d) = any_reply(&mut s, None).await;
        let e = if magic == SIMPLE_REPLY_MAGIC {
            u32::from_be_bytes(d[..4].try_into().unwrap())
        } else {
            assert_eq!(t, REPLY_TYPE_ERROR);
            u32::from_be_bytes(d[..4].try_into().unwrap())
        };
        got.insert(c, e);
    }
    assert_eq!(got[&300], NBD_EINVAL);
    assert_eq!(got[&301], NBD_ENOSPC);
    assert_eq!(got[&302], NBD_EINVAL);
    assert_eq!(got[&303], NBD_EINVAL);
    assert_eq!(got[&304], NBD_EOVERFLOW);
    assert_eq!(got[&305], 0);
    // Nothing of the rejected writes reached the disk.
    s.write_all(&req_bytes(0, CMD_READ, 400, 0, 4))
        .await
        .unwrap();
    let (_, _, _, _, d) = any_reply(&mut s, None).await;
    assert_eq!(&d[8..], &[1, 1, 1, 1]);
    // Bad request magic: the server closes.
    let mut bad = req_bytes(0, CMD_READ, 500, 0, 4);
    bad[0] = 0;
    s.write_all(&bad).await.unwrap();
    expect_eof(&mut s).await;
    ts.stop.send(true).unwrap();
    ts.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_read_only_and_vanishing_client() {
    let ts = start(
        vec![mem_export("ro", 1 << 20, true)],
        None,
        ServerCfg::default(),
    )
    .await;
    let (mut s, _, flags) = connect(&ts.path, "ro", false).await;
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    let mut out = req_bytes(0, CMD_WRITE, 1, 0, 4);
    out.extend([1, 2, 3, 4]);
    out.extend(req_bytes(0, CMD_TRIM, 2, 0, 4096));
    out.extend(req_bytes(0, CMD_WRITE_ZEROES, 3, 0, 4096));
    // Block status without structured replies: EINVAL.
    out.extend(req_bytes(0, CMD_BLOCK_STATUS, 4, 0, 4096));
    s.write_all(&out).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(simple(&mut s).await);
    }
    got.sort_by_key(|g| g.1);
    assert_eq!(
        got,
        vec![
            (NBD_EPERM, 1),
            (NBD_EPERM, 2),
            (NBD_EPERM, 3),
            (NBD_EINVAL, 4)
        ]
    );
    // A client that sends requests and a truncated write, then vanishes.
    let mut out = Vec::new();
    for i in 0..32 {
        out.extend(req_bytes(0, CMD_READ, 10 + i, 0, 65536));
    }
    out.extend(req_bytes(0, CMD_WRITE, 99, 0, 4096));
    out.extend([0u8; 100]);
    s.write_all(&out).await.unwrap();
    drop(s);
    // The server keeps serving others.
    let (mut s2, _, _) = connect(&ts.path, "ro", true).await;
    s2.write_all(&req_bytes(0, CMD_READ, 1, 0, 512))
        .await
        .unwrap();
    let (_, f, t, c, d) = any_reply(&mut s2, None).await;
    assert_eq!(
        (f, t, c, d.len()),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 1, 520)
    );
    // Shutdown with a connection open: it is closed, the server stops.
    ts.stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), ts.task)
        .await
        .expect("server stops")
        .unwrap();
    expect_eof(&mut s2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_cap_bounds_a_client_that_never_reads() {
    // 1 MiB cap: a client that pipelines reads but never reads replies
    // stalls itself, not the server.
    let cfg = ServerCfg {
        inflight_bytes: 1 << 20,
        max_request: 256 << 10,
        ..ServerCfg::default()
    };
    let ts = start(vec![mem_export("", 8 << 20, false)], None, cfg).await;
    let (hog, _, _) = connect(&ts.path, "", false).await;
    let mut out = Vec::new();
    for i in 0..2000u64 {
        out.extend(req_bytes(0, CMD_READ, i, 0, 256 << 10));
    }
    // Writing may block once buffers fill: do it in the background.
    let (_r, mut w) = hog.into_split();
    let bg = tokio::spawn(async move {
        let _ = w.write_all(&out).await;
        w
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mut s, _, _) = connect(&ts.path, "", false).await;
    s.write_all(&req_bytes(0, CMD_FLUSH, 1, 0, 0))
        .await
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), simple(&mut s)).await;
    assert_eq!(r.expect("other clients are served"), (0, 1));
    bg.abort();
    ts.stop.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), ts.task).await;
}

// ------------------------------------------------------- fuzz harness

// The fuzz harness's generator: iolift-testkit's seeded xorshift64*.
use iolift_testkit::Rng;

fn fuzz_iters(default: u64) -> u64 {
    std::env::var("IOLIFT_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fuzz_seed() -> u64 {
    std::env::var("IOLIFT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x1015_f7ee_d5ee)
        | 1
}

/// Flips, inserts, deletes, truncates or overwrites with interesting
/// integers.
fn mutate(r: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..=r.below(4) {
        match r.below(6) {
            0 if !v.is_empty() => {
                let i = r.below(v.len() as u64) as usize;
                v[i] ^= 1 << r.below(8);
            }
            1 => {
                let i = r.below(v.len() as u64 + 1) as usize;
                let n = r.below(8) as usize;
                let b = r.bytes(n);
                v.splice(i..i, b);
            }
            2 if !v.is_empty() => {
                let i = r.below(v.len() as u64) as usize;
                let n = (r.below(8) as usize).min(v.len() - i);
                v.drain(i..i + n);
            }
            3 => {
                let n = r.below(v.len() as u64 + 1) as usize;
                v.truncate(n);
            }
            4 if v.len() >= 4 => {
                let i = r.below(v.len() as u64 - 3) as usize;
                let x: u32 =
                    [0, 1, 0xffff_ffff, 0x8000_0000, 4096, 0x7fff_ffff][r.below(6) as usize];
                v[i..i + 4].copy_from_slice(&x.to_be_bytes());
            }
            _ => {
                let i = r.below(v.len() as u64 + 1) as usize;
                v.truncate(i);
                let n = r.below(40) as usize;
                v.extend(r.bytes(n));
            }
        }
    }
    v
}

fn seed_options(r: &mut Rng) -> (u32, Vec<u8>) {
    match r.below(5) {
        0 => (OPT_GO, go_payload("a", &[INFO_NAME, INFO_BLOCK_SIZE])),
        1 => (OPT_INFO, go_payload("", &[])),
        2 => (
            OPT_SET_META_CONTEXT,
            meta_payload("a", &[BASE_ALLOCATION, "base:"]),
        ),
        3 => (OPT_LIST_META_CONTEXT, meta_payload("", &[])),
        _ => {
            let n = r.below(16) as usize;
            (r.below(12) as u32, r.bytes(n))
        }
    }
}

#[test]
fn fuzz_parsers() {
    let iters = fuzz_iters(20_000);
    let mut r = Rng::new(fuzz_seed());
    let s = session();
    for _ in 0..iters {
        // Random bytes to every fixed-size parser.
        let n = r.below(40) as usize;
        let raw = r.bytes(n);
        let _ = wire::parse_client_flags(&raw);
        let _ = wire::parse_option_header(&raw);
        // Options: mutated valid payloads and random ones.
        let (opt, payload) = seed_options(&mut r);
        let payload = mutate(&mut r, payload);
        if let Ok(Opt::Info { name, .. } | Opt::ExportName(name)) =
            wire::parse_option(opt, &payload)
        {
            assert!(name.len() <= MAX_STRING && !name.contains('\0'));
        }
        // Requests: mutated valid headers, judged against random sessions.
        let cmd = r.below(10) as u16;
        let mut h = req_bytes(
            1 << r.below(6),
            cmd,
            r.next_u64(),
            r.below(2 << 20),
            r.below(1 << 17) as u32,
        );
        if r.below(2) == 0 {
            h = mutate(&mut r, h);
        }
        if let Ok(hd) = wire::parse_request(&h) {
            let mut ss = s;
            ss.structured = r.below(2) == 0;
            ss.base_allocation = ss.structured && r.below(2) == 0;
            if r.below(3) == 0 {
                ss.tflags |= FLAG_READ_ONLY;
            }
            match wire::decode_request(&hd, &ss) {
                Action::Submit(req) => {
                    assert!(req.check_range(ss.size).is_ok(), "{req:?} out of range");
                    if let Request::Read { len, .. } = req {
                        assert!(len <= ss.max_request && len > 0);
                    }
                    if matches!(req, Request::Trim { .. } | Request::WriteZeroes { .. }) {
                        assert_eq!(ss.tflags & FLAG_READ_ONLY, 0);
                    }
                }
                Action::Write { offset, len, .. } => {
                    assert_eq!(hd.cmd, CMD_WRITE);
                    assert!(len <= ss.max_request && len > 0);
                    assert!(offset + len as u64 <= ss.size);
                    assert_eq!(ss.tflags & FLAG_READ_ONLY, 0);
                }
                Action::Reject { skip, .. } => {
                    assert_eq!(skip, if hd.cmd == CMD_WRITE { hd.len } else { 0 });
                }
                Action::Disconnect => assert_eq!(hd.cmd, CMD_DISC),
            }
        }
    }
}

/// A valid client byte stream: flags, options, GO, some requests.
fn seed_stream(r: &mut Rng) -> Vec<u8> {
    let mut v = 3u32.to_be_bytes().to_vec();
    if r.below(2) == 0 {
        v.extend(opt_bytes(OPT_STRUCTURED_REPLY, &[]));
        v.extend(opt_bytes(
            OPT_SET_META_CONTEXT,
            &meta_payload("", &[BASE_ALLOCATION]),
        ));
    }
    if r.below(4) == 0 {
        v.extend(opt_bytes(OPT_LIST, &[]));
    }
    if r.below(2) == 0 {
        v.extend(opt_bytes(OPT_GO, &go_payload("", &[INFO_BLOCK_SIZE])));
    } else {
        v.extend(opt_bytes(OPT_EXPORT_NAME, b""));
    }
    for _ in 0..r.below(8) {
        let cmd = r.below(9) as u16;
        let len = [0, 1, 512, 4096, 65536][r.below(5) as usize];
        let off = [0, 4096, (1 << 20) - 1, 1 << 20, u64::MAX][r.below(5) as usize];
        v.extend(req_bytes(1 << r.below(6) >> 1, cmd, r.next_u64(), off, len));
        if cmd == CMD_WRITE {
            v.extend(r.bytes(len as usize));
        }
    }
    if r.below(2) == 0 {
        v.extend(req_bytes(0, CMD_DISC, 0, 0, 0));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_live_server() {
    let iters = (fuzz_iters(20_000) / 100).max(5);
    let cfg = ServerCfg {
        handshake_timeout: Duration::from_secs(5),
        ..ServerCfg::default()
    };
    let ts = start(vec![mem_export("", 1 << 20, false)], None, cfg).await;
    let mut r = Rng::new(fuzz_seed() ^ 0x5eed);
    for i in 0..iters {
        let stream = seed_stream(&mut r);
        let stream = if i % 4 == 0 {
            stream
        } else {
            mutate(&mut r, stream)
        };
        let mut s = UnixStream::connect(&ts.path).await.unwrap();
        let (mut rd, mut wr) = s.split();
        // Send everything, half-close, read until the server closes.
        let send = async {
            let _ = wr.write_all(&stream).await;
            let _ = wr.shutdown().await;
        };
        let recv = async {
            let mut sink = Vec::new();
            let _ = rd.read_to_end(&mut sink).await;
        };
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(send, recv) })
            .await
            .unwrap_or_else(|_| panic!("server hung on fuzz case {i}: {stream:02x?}"));
    }
    // Still healthy: a clean client round-trips data.
    let (mut s, _, _) = connect(&ts.path, "", true).await;
    let mut out = req_bytes(0, CMD_WRITE, 1, 8192, 4);
    out.extend([5, 6, 7, 8]);
    out.extend(req_bytes(0, CMD_READ, 2, 8192, 4));
    s.write_all(&out).await.unwrap();
    let a = any_reply(&mut s, None).await;
    let b = any_reply(&mut s, None).await;
    let read = if a.3 == 2 { a } else { b };
    assert_eq!(&read.4[8..], &[5, 6, 7, 8]);
    ts.stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), ts.task)
        .await
        .expect("server stops after fuzzing")
        .unwrap();
}

// ------------------------------------ devices that call back on own threads

/// Memory whose `submit_cb` completes on a thread of its own (as librbd
/// does), after a short delay, or at once on the caller's thread for every
/// third request.
struct ThreadedDev {
    mem: Arc<MemoryDev>,
    n: std::sync::atomic::AtomicU64,
}

impl crate::block::BlockDev for ThreadedDev {
    fn info(&self) -> crate::block::DevInfo {
        self.mem.info()
    }
    fn submit(&self, req: Request) -> crate::block::IoFuture {
        self.mem.submit(req)
    }
    fn name(&self) -> String {
        "threaded".into()
    }
    fn native_callbacks(&self) -> bool {
        true
    }
    fn submit_cb(&self, req: Request, cb: crate::block::Callback) {
        let i = self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut f = self.mem.submit(req);
        let c = crate::block::poll_once(&mut f).expect("memory completes at once");
        if i.is_multiple_of(3) {
            cb(c);
        } else {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(50 * (i % 7)));
                cb(c)
            });
        }
    }
}

/// Replies sent from the device's completion threads: every request is
/// answered exactly once with the right data, including reads larger than
/// the socket takes at once (finished by a task holding the socket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_from_device_threads() {
    let cfg = ServerCfg {
        max_request: 4 << 20,
        ..ServerCfg::default()
    };
    let export = Export {
        name: "".into(),
        dev: Arc::new(ThreadedDev {
            mem: Arc::new(MemoryDev::new(256 << 20)),
            n: Default::default(),
        }),
        read_only: false,
        description: "threaded".into(),
    };
    let ts = start(vec![export], None, cfg).await;
    for structured in [true, false] {
        let (s, _, _) = connect(&ts.path, "", structured).await;
        let (mut rd, mut wr) = s.into_split();
        let lens: Vec<u32> = (0..48u32)
            .map(|i| [4096, 65536, 4 << 20][(i % 3) as usize])
            .collect();
        let client = tokio::spawn(async move {
            for (i, &len) in lens.iter().enumerate() {
                let off = i as u64 * (4 << 20);
                let mut out = req_bytes(0, CMD_WRITE, i as u64, off, len);
                out.extend(std::iter::repeat_n(i as u8 + 1, len as usize));
                wr.write_all(&out).await.unwrap();
            }
            for (i, &len) in lens.iter().enumerate() {
                let off = i as u64 * (4 << 20);
                wr.write_all(&req_bytes(0, CMD_READ, 1000 + i as u64, off, len))
                    .await
                    .unwrap();
            }
            (wr, lens)
        });
        // Read replies while the client is still sending.
        let mut seen = std::collections::HashSet::new();
        let mut n = 0;
        while n < 96 {
            let magic = tokio::time::timeout(Duration::from_secs(60), rd.read_u32())
                .await
                .expect("a reply is missing")
                .unwrap();
            let (cookie, data) = if magic == SIMPLE_REPLY_MAGIC {
                assert_eq!(rd.read_u32().await.unwrap(), 0, "error reply");
                let c = rd.read_u64().await.unwrap();
                let len = if c >= 1000 {
                    [4096, 65536, 4 << 20][((c - 1000) % 3) as usize]
                } else {
                    0
                };
                let mut d = vec![0u8; len];
                rd.read_exact(&mut d).await.unwrap();
                (c, d)
            } else {
                assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
                let f = rd.read_u16().await.unwrap();
                let t = rd.read_u16().await.unwrap();
                assert_eq!((f, t), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
                let c = rd.read_u64().await.unwrap();
                let len = rd.read_u32().await.unwrap();
                let mut d = vec![0u8; len as usize];
                rd.read_exact(&mut d).await.unwrap();
                (c, d[8..].to_vec())
            };
            assert!(seen.insert(cookie), "cookie {cookie} answered twice");
            if cookie >= 1000 {
                let i = cookie - 1000;
                assert!(
                    data.iter().all(|&b| b == i as u8 + 1),
                    "read {i}: wrong data"
                );
            }
            n += 1;
        }
        let (mut wr, _) = client.await.unwrap();
        wr.write_all(&req_bytes(0, CMD_DISC, 0, 0, 0))
            .await
            .unwrap();
        let mut b = [0u8; 1];
        assert_eq!(rd.read(&mut b).await.unwrap(), 0);
    }
    ts.stop.send(true).unwrap();
    ts.task.await.unwrap();
}

/// Memory whose `submit_cb` holds every completion until the test hands
/// them back, all in one batch, on a thread of the test's (as the io_uring
/// engine's thread answers a reaped batch of completions).
struct HeldDev {
    mem: Arc<MemoryDev>,
    held: Held,
}

type Held = Arc<std::sync::Mutex<Vec<(crate::block::Completion, crate::block::Callback)>>>;

/// The `n` completions the device holds, once it holds that many.
async fn take(held: &Held, n: usize) -> Vec<(crate::block::Completion, crate::block::Callback)> {
    for _ in 0..2000 {
        if held.lock().unwrap().len() == n {
            return std::mem::take(&mut *held.lock().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the server did not submit {n} requests");
}

impl crate::block::BlockDev for HeldDev {
    fn info(&self) -> crate::block::DevInfo {
        self.mem.info()
    }
    fn submit(&self, req: Request) -> crate::block::IoFuture {
        self.mem.submit(req)
    }
    fn name(&self) -> String {
        "held".into()
    }
    fn native_callbacks(&self) -> bool {
        true
    }
    fn submit_cb(&self, req: Request, cb: crate::block::Callback) {
        let mut f = self.mem.submit(req);
        let c = crate::block::poll_once(&mut f).expect("memory completes at once");
        self.held.lock().unwrap().push((c, cb));
    }
}

/// Bytes waiting in the client's socket, without reading them.
fn waiting(fd: std::os::fd::RawFd) -> usize {
    let mut b = vec![0u8; 1 << 20];
    // SAFETY: peeks into a local buffer of that length.
    let n = unsafe {
        libc::recv(
            fd,
            b.as_mut_ptr().cast(),
            b.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n.max(0) as usize
}

/// Replies of completions answered inside one engine batch
/// (`iolift_direct::engine::batch`) reach the socket together once the
/// batch's callbacks are done, none of them before; a reply completed
/// outside a batch is written at once. Every reply is whole and right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_of_one_engine_batch_go_out_together() {
    use std::os::fd::AsRawFd;
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let export = Export {
        name: "".into(),
        dev: Arc::new(HeldDev {
            mem: Arc::new(MemoryDev::new(1 << 20)),
            held: held.clone(),
        }),
        read_only: false,
        description: "held".into(),
    };
    let ts = start(vec![export], None, ServerCfg::default()).await;
    let (mut s, _, _) = connect(&ts.path, "", true).await;
    let fd = s.as_raw_fd();
    const N: u64 = 8;
    const REPLY: usize = 20 + 8 + 4096; // chunk header, offset, data
                                        // One read outside any batch: its reply is written at once.
    s.write_all(&req_bytes(0, CMD_READ, 99, 0, 4096))
        .await
        .unwrap();
    let one = take(&held, 1).await;
    for (c, cb) in one {
        cb(c);
    }
    assert_eq!(
        waiting(fd),
        REPLY,
        "a reply outside a batch is written at once"
    );
    let (_, _, _, cookie, _) = any_reply(&mut s, Some(4096)).await;
    assert_eq!(cookie, 99);
    // N reads answered in one batch.
    for i in 0..N {
        s.write_all(&req_bytes(0, CMD_READ, i, i * 4096, 4096))
            .await
            .unwrap();
    }
    let batch = take(&held, N as usize).await;
    let inside = tokio::task::spawn_blocking(move || {
        iolift_direct::engine::batch::run(|| {
            for (c, cb) in batch {
                cb(c);
            }
            waiting(fd)
        })
    })
    .await
    .unwrap();
    assert_eq!(inside, 0, "a reply went out before the batch was done");
    assert_eq!(
        waiting(fd),
        N as usize * REPLY,
        "every reply after the batch"
    );
    let mut seen = std::collections::HashSet::new();
    for _ in 0..N {
        let (magic, flags, typ, cookie, d) = any_reply(&mut s, Some(4096)).await;
        assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
        assert_eq!((flags, typ), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
        assert_eq!(
            u64::from_be_bytes(d[..8].try_into().unwrap()),
            cookie * 4096
        );
        assert_eq!(d.len(), 8 + 4096);
        assert!(seen.insert(cookie), "cookie {cookie} answered twice");
    }
    assert_eq!(seen.len(), N as usize);
    // The client disconnects with N reads in flight: their staged replies
    // still go out before the server closes the socket, however late the
    // batch's deferred write runs.
    for i in 0..N {
        s.write_all(&req_bytes(0, CMD_READ, 100 + i, i * 4096, 4096))
            .await
            .unwrap();
    }
    s.write_all(&req_bytes(0, CMD_DISC, 0, 0, 0)).await.unwrap();
    let batch = take(&held, N as usize).await;
    tokio::task::spawn_blocking(move || {
        iolift_direct::engine::batch::run(|| {
            // deferred first, so it runs before the replies' write
            let slow: iolift_direct::engine::batch::Later =
                Box::new(|| std::thread::sleep(Duration::from_millis(200)));
            assert!(iolift_direct::engine::batch::defer(slow).is_ok());
            for (c, cb) in batch {
                cb(c);
            }
        })
    })
    .await
    .unwrap();
    for _ in 0..N {
        let (_, _, _, cookie, d) = any_reply(&mut s, Some(4096)).await;
        assert!((100..100 + N).contains(&cookie), "cookie {cookie}");
        assert_eq!(d.len(), 8 + 4096);
    }
    expect_eof(&mut s).await;
    ts.stop.send(true).unwrap();
    ts.task.await.unwrap();
}
