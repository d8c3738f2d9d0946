//! The request model shared by every front-end, stage and backend.
//!
//! A [`Request`] (read, write, flush, trim, write-zeroes, cache, block-status)
//! is submitted to a [`BlockDev`] and completes asynchronously with a
//! [`Completion`]: `Ok(Reply)` or `Err(Errno)`. [`completion_code`] gives
//! DeLiBA's completion value: bytes transferred for reads and writes, 0 for
//! flush/trim/zero, or a negative errno.
//!
//! Backends implement [`BlockDev`] directly; stages implement it by wrapping
//! the `Arc<dyn BlockDev>` below them.

use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

mod errno;
pub mod extents;
pub use errno::Errno;

/// A boxed future completing one request.
pub type IoFuture = Pin<Box<dyn Future<Output = Completion> + Send + 'static>>;
/// The result of one request.
pub type Completion = Result<Reply, Errno>;
/// A shared handle on a device (a backend or the top of a stage stack).
pub type DevRef = Arc<dyn BlockDev>;

/// A completion callback (DeLiBA's completion semantics): called exactly
/// once, on whatever thread completes the request.
pub type Callback = Box<dyn FnOnce(Completion) + Send + 'static>;

/// Polls a future once with a no-op waker: `Some` if already complete.
pub fn poll_once(f: &mut IoFuture) -> Option<Completion> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(c) => Some(c),
        std::task::Poll::Pending => None,
    }
}

/// Wraps an already-known completion as an [`IoFuture`].
pub fn ready(c: Completion) -> IoFuture {
    Box::pin(std::future::ready(c))
}

/// Per-request flags (NBD's FUA, NO_HOLE and FAST_ZERO).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// Force unit access: the write is on stable storage before completion.
    pub fua: bool,
    /// Write-zeroes only: the range must stay allocated (no hole punching).
    pub no_hole: bool,
    /// Write-zeroes only: fail with ENOTSUP unless zeroing is fast.
    pub fast_zero: bool,
}

impl Flags {
    pub const NONE: Flags = Flags {
        fua: false,
        no_hole: false,
        fast_zero: false,
    };
    pub const FUA: Flags = Flags {
        fua: true,
        no_hole: false,
        fast_zero: false,
    };
}

/// One block request.
#[derive(Clone, PartialEq, Eq)]
pub enum Request {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
        flags: Flags,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        flags: Flags,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        flags: Flags,
    },
    /// Advisory: prefetch a range into any cache below.
    Cache {
        offset: u64,
        len: u32,
    },
    /// Allocation status of a range (NBD `base:allocation`).
    BlockStatus {
        offset: u64,
        len: u32,
    },
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Read { offset, len } => write!(f, "Read({offset}+{len})"),
            Request::Write {
                offset,
                data,
                flags,
            } => write!(f, "Write({offset}+{}, {flags:?})", data.len()),
            Request::Flush => write!(f, "Flush"),
            Request::Trim { offset, len, flags } => write!(f, "Trim({offset}+{len}, {flags:?})"),
            Request::WriteZeroes { offset, len, flags } => {
                write!(f, "WriteZeroes({offset}+{len}, {flags:?})")
            }
            Request::Cache { offset, len } => write!(f, "Cache({offset}+{len})"),
            Request::BlockStatus { offset, len } => write!(f, "BlockStatus({offset}+{len})"),
        }
    }
}

/// The kind of a request, for statistics and logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Cache,
    BlockStatus,
}

impl OpKind {
    pub const ALL: [OpKind; 7] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::Flush,
        OpKind::Trim,
        OpKind::WriteZeroes,
        OpKind::Cache,
        OpKind::BlockStatus,
    ];
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Trim => "trim",
            OpKind::WriteZeroes => "write_zeroes",
            OpKind::Cache => "cache",
            OpKind::BlockStatus => "block_status",
        }
    }
}

impl Request {
    pub fn kind(&self) -> OpKind {
        match self {
            Request::Read { .. } => OpKind::Read,
            Request::Write { .. } => OpKind::Write,
            Request::Flush => OpKind::Flush,
            Request::Trim { .. } => OpKind::Trim,
            Request::WriteZeroes { .. } => OpKind::WriteZeroes,
            Request::Cache { .. } => OpKind::Cache,
            Request::BlockStatus { .. } => OpKind::BlockStatus,
        }
    }

    /// The byte range the request touches, `None` for flush.
    pub fn range(&self) -> Option<(u64, u64)> {
        match self {
            Request::Read { offset, len }
            | Request::Trim { offset, len, .. }
            | Request::WriteZeroes { offset, len, .. }
            | Request::Cache { offset, len }
            | Request::BlockStatus { offset, len } => Some((*offset, *len as u64)),
            Request::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
            Request::Flush => None,
        }
    }

    pub fn flags(&self) -> Flags {
        match self {
            Request::Write { flags, .. }
            | Request::Trim { flags, .. }
            | Request::WriteZeroes { flags, .. } => *flags,
            _ => Flags::NONE,
        }
    }

    /// Checks the request's range against a device of `size` bytes:
    /// EOVERFLOW if offset+len wraps, EINVAL if it runs past the end
    /// (ENOSPC for writes, as the NBD spec asks).
    pub fn check_range(&self, size: u64) -> Result<(), Errno> {
        let Some((off, len)) = self.range() else {
            return Ok(());
        };
        let end = off.checked_add(len).ok_or(Errno::EOVERFLOW)?;
        if end > size {
            return Err(match self.kind() {
                OpKind::Write | OpKind::WriteZeroes => Errno::ENOSPC,
                _ => Errno::EINVAL,
            });
        }
        Ok(())
    }

    /// [`Request::check_range`], then EPERM for a request that changes
    /// data (write, trim, write-zeroes) on a read-only device: the checks
    /// a backend makes before it takes a request.
    pub fn admit(&self, size: u64, read_only: bool) -> Result<(), Errno> {
        self.check_range(size)?;
        if read_only
            && matches!(
                self.kind(),
                OpKind::Write | OpKind::Trim | OpKind::WriteZeroes
            )
        {
            return Err(Errno::EPERM);
        }
        Ok(())
    }
}

/// One extent of a block-status reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    /// Unallocated (NBD_STATE_HOLE).
    pub hole: bool,
    /// Reads as zeroes (NBD_STATE_ZERO).
    pub zero: bool,
}

/// The successful outcome of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Data of a read.
    Data(Bytes),
    /// Bytes written by a write, or 0 for flush/trim/zero/cache.
    Done(u64),
    /// Extents of a block-status request, covering at least one byte.
    Extents(Vec<Extent>),
}

/// DeLiBA's completion value: bytes transferred, 0, or a negative errno.
pub fn completion_code(c: &Completion) -> i64 {
    match c {
        Ok(Reply::Data(d)) => d.len() as i64,
        Ok(Reply::Done(n)) => *n as i64,
        Ok(Reply::Extents(_)) => 0,
        Err(e) => -(e.0 as i64),
    }
}

/// What a device can do and how big it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevInfo {
    pub size: u64,
    pub read_only: bool,
    pub can_flush: bool,
    pub can_fua: bool,
    pub can_trim: bool,
    pub can_zero: bool,
    pub can_fast_zero: bool,
    pub can_cache: bool,
    /// Flushes on one connection cover writes completed on any other.
    pub can_multi_conn: bool,
    /// Minimum, preferred and maximum block sizes (NBD_INFO_BLOCK_SIZE).
    pub min_block: u32,
    pub pref_block: u32,
    pub max_block: u32,
}

impl DevInfo {
    /// A writable device of `size` bytes that supports every operation.
    pub fn full(size: u64) -> Self {
        DevInfo {
            size,
            read_only: false,
            can_flush: true,
            can_fua: true,
            can_trim: true,
            can_zero: true,
            can_fast_zero: true,
            can_cache: true,
            can_multi_conn: true,
            min_block: 1,
            pref_block: 4096,
            max_block: 32 << 20,
        }
    }
}

/// A block device: a backend, or a stage wrapping the device below it.
///
/// `submit` must not block the calling thread for long: slow work belongs
/// in a spawned task or a blocking pool. Requests may be submitted
/// concurrently from many tasks; the device decides their order, except
/// that a `Flush` completes only after every write completed before it was
/// submitted is on stable storage.
pub trait BlockDev: Send + Sync + 'static {
    /// Size and capabilities.
    fn info(&self) -> DevInfo;
    /// Starts one request. Ranges have been checked with
    /// [`Request::check_range`] by the front-end.
    fn submit(&self, req: Request) -> IoFuture;
    /// A short human name, e.g. `memory` or `cache(32M)`.
    fn name(&self) -> String;
    /// Flushes and releases resources at shutdown.
    fn close(&self) -> IoFuture {
        self.submit(Request::Flush)
    }
    /// True if [`submit_cb`](Self::submit_cb) calls back from the thread
    /// that completes the I/O (librbd's), without a hop through the async
    /// runtime; front-ends then prefer it for requests that do not complete
    /// at once.
    fn native_callbacks(&self) -> bool {
        false
    }
    /// Starts one request and calls `cb` with its completion. The default
    /// drives [`submit`](Self::submit)'s future: at once if it is already
    /// complete, else in a task of the current tokio runtime (so it must be
    /// called from one).
    fn submit_cb(&self, req: Request, cb: Callback) {
        drive(self.submit(req), cb)
    }
}

/// Calls `cb` with the completion of `f`: at once if it is already
/// complete, else from a task of the current tokio runtime.
pub fn drive(mut f: IoFuture, cb: Callback) {
    match poll_once(&mut f) {
        Some(c) => cb(c),
        None => {
            tokio::spawn(async move { cb(f.await) });
        }
    }
}

/// Convenience calls on any device.
pub trait BlockDevExt: BlockDev {
    fn read(
        &self,
        offset: u64,
        len: u32,
    ) -> Pin<Box<dyn Future<Output = Result<Bytes, Errno>> + Send>> {
        let f = self.submit(Request::Read { offset, len });
        Box::pin(async move {
            match f.await? {
                Reply::Data(d) => Ok(d),
                _ => Err(Errno::EIO),
            }
        })
    }
    fn write(&self, offset: u64, data: Bytes, flags: Flags) -> IoFuture {
        self.submit(Request::Write {
            offset,
            data,
            flags,
        })
    }
    fn flush(&self) -> IoFuture {
        self.submit(Request::Flush)
    }
}

impl<T: BlockDev + ?Sized> BlockDevExt for T {}
