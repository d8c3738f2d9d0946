//! `file:PATH[,size=SIZE][,direct][,ro][,engine=threads|uring][,sqpoll][,rings=N][,inline_us=N][,inline_writes]`:
//! a regular file or a block device.
//!
//! A missing regular file is created sparse with `size`; an existing one is
//! grown to `size` if smaller. `direct` opens with O_DIRECT (bounce buffers
//! aligned to 4 KiB). Flush and FUA reach stable storage with fdatasync;
//! trim punches holes; write-zeroes uses FALLOC_FL_ZERO_RANGE or punches a
//! hole when holes are allowed.
//!
//! Requests run on tokio's blocking thread pool, or with `engine=uring`
//! reads, writes and flushes go through an io_uring engine
//! ([`super::file_uring`]) and the rest through the pool. With the pool, a
//! request alone on the device (nothing else in flight, the device idle
//! at least `inline_us`; `backend/alone.rs`) runs on the thread that read
//! it off the connection instead: at queue depth 1 that saves the hop to a
//! pool thread and the wake-up back, and the NBD front-end answers it in
//! the same write as any other reply it has ready. With `inline_writes`,
//! every write given through `submit_cb` runs on the calling thread:
//! for callers that bring their own threads (the `ec` device writes its
//! file children from a few blocking-pool threads of its own, several
//! children per thread, instead of one pool hop per child write).

use super::alone::{Alone, Leave};
use super::{BackendSpec, Kind, OptHelp};
use crate::block::{BlockDev, DevInfo, DevRef, Errno, Extent, IoFuture, Reply, Request};
use anyhow::{bail, Context, Result};
use bytes::{Bytes, BytesMut};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ALIGN: usize = 4096;
/// `inline_us` unless told otherwise.
const INLINE_US: u64 = 10;

/// The file backend; cheap to share with the blocking pool.
pub struct FileDev {
    inner: Arc<FileInner>,
    uring: Option<super::file_uring::UringFile>,
    /// engine=threads: whether a request is alone (run it inline).
    alone: Arc<Alone>,
    /// engine=threads: `submit_cb` always runs writes on the calling thread.
    inline_writes: bool,
}

struct FileInner {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
    read_only: bool,
    is_block: bool,
}

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "size",
        kind: Kind::Size,
        default: "the file's",
        help: "create a missing file with this size, grow a smaller one, use only this much of a larger one",
    },
    OptHelp {
        name: "direct",
        kind: Kind::Flag,
        default: "off",
        help: "open with O_DIRECT (bypass the page cache)",
    },
    OptHelp {
        name: "ro",
        kind: Kind::Flag,
        default: "off",
        help: "read-only",
    },
    OptHelp {
        name: "engine",
        kind: Kind::Choice(ENGINES),
        default: "threads",
        help: "how reads, writes and flushes reach the file: a blocking thread pool, or io_uring (the rest always uses the pool)",
    },
    OptHelp {
        name: "sqpoll",
        kind: Kind::Flag,
        default: "off",
        help: "with engine=uring: a kernel thread polls the submission queue (no system call per submission)",
    },
    OptHelp {
        name: "rings",
        kind: Kind::Count,
        default: "1",
        help: "with engine=uring: io_uring instances (each with its own thread) that requests are spread over, 1 to 64",
    },
    OptHelp {
        name: "inline_us",
        kind: Kind::Count,
        default: "10",
        help: "with engine=threads: a request alone on the device (nothing else in flight, idle at least this many us) runs on the thread that read it instead of the pool; 0: never",
    },
    OptHelp {
        name: "inline_writes",
        kind: Kind::Flag,
        default: "off",
        help: "with engine=threads: every write given through submit_cb runs on the calling thread (for callers with threads of their own, as the ec device's child writers); other requests as inline_us says",
    },
];

const ENGINES: &[&str] = &["threads", "uring"];

/// The checked spec of one file backend.
pub struct FileConfig {
    pub path: PathBuf,
    pub size: Option<u64>,
    pub direct: bool,
    pub read_only: bool,
    /// `engine=uring`.
    pub uring: bool,
    pub sqpoll: bool,
    /// With engine=uring: rings to spread requests over.
    pub rings: usize,
    /// engine=threads: the idle time before a lone request runs inline
    /// (None: never).
    pub inline_gap: Option<Duration>,
    /// engine=threads: `submit_cb` always runs writes on the calling thread.
    pub inline_writes: bool,
}

pub fn parse(s: &BackendSpec) -> Result<FileConfig> {
    if s.arg.is_empty() {
        bail!("backend file: missing PATH (file:PATH[,size=SIZE][,direct][,ro])");
    }
    let size = match s.opts.get("size") {
        None => None,
        Some(_) => Some(s.opts.size("size", 0)?),
    };
    let uring = s.opts.choice("engine", ENGINES, "threads")? == "uring";
    let sqpoll = s.opts.flag("sqpoll")?;
    if sqpoll && !uring {
        return Err(s.opts.err("sqpoll", "needs engine=uring"));
    }
    let rings = s.opts.u64("rings", 1)?;
    if s.opts.get("rings").is_some() && !uring {
        return Err(s.opts.err("rings", "needs engine=uring"));
    }
    if !(1..=64).contains(&rings) {
        return Err(s.opts.err("rings", format!("{rings}: 1 to 64")));
    }
    let inline_us = s.opts.u64("inline_us", INLINE_US)?;
    if s.opts.get("inline_us").is_some() && uring {
        return Err(s.opts.err("inline_us", "needs engine=threads"));
    }
    let inline_writes = s.opts.flag("inline_writes")?;
    if inline_writes && uring {
        return Err(s.opts.err("inline_writes", "needs engine=threads"));
    }
    if inline_us > 1_000_000 {
        return Err(s
            .opts
            .err("inline_us", format!("{inline_us}: 0 to 1000000")));
    }
    Ok(FileConfig {
        path: PathBuf::from(&s.arg),
        size,
        direct: s.opts.flag("direct")?,
        read_only: s.opts.flag("ro")?,
        uring,
        sqpoll,
        rings: rings as usize,
        inline_gap: (inline_us > 0).then(|| Duration::from_micros(inline_us)),
        inline_writes,
    })
}

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let c = parse(s)?;
    let mut dev = FileDev::open(&c.path, c.size, c.direct, c.read_only)?;
    dev.alone = Arc::new(Alone::new(c.inline_gap));
    dev.inline_writes = c.inline_writes;
    if c.uring {
        dev.uring = Some(super::file_uring::UringFile::open(
            &c.path,
            c.direct,
            c.read_only,
            c.sqpoll,
            c.rings,
        )?);
    }
    Ok(Arc::new(dev))
}

fn is_block_dev(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false)
}

impl FileDev {
    pub fn open(path: &Path, size: Option<u64>, direct: bool, read_only: bool) -> Result<Self> {
        Ok(FileDev {
            inner: Arc::new(FileInner::open(path, size, direct, read_only)?),
            uring: None,
            alone: Arc::new(Alone::new(Some(Duration::from_micros(INLINE_US)))),
            inline_writes: false,
        })
    }
}

impl FileInner {
    fn open(path: &Path, size: Option<u64>, direct: bool, read_only: bool) -> Result<Self> {
        let is_block = is_block_dev(path);
        let exists = path.exists();
        if !exists && size.is_none() {
            bail!(
                "file backend: {} does not exist; give size=SIZE to create it",
                path.display()
            );
        }
        if !exists && read_only {
            bail!(
                "file backend: {} does not exist (read-only)",
                path.display()
            );
        }
        let mut oo = OpenOptions::new();
        oo.read(true)
            .write(!read_only)
            .create(!read_only && !is_block);
        if direct {
            oo.custom_flags(libc::O_DIRECT);
        }
        let file = oo
            .open(path)
            .with_context(|| format!("file backend: cannot open {}", path.display()))?;
        let cur = if is_block {
            block_size(&file)
                .with_context(|| format!("file backend: size of {}", path.display()))?
        } else {
            file.metadata()?.len()
        };
        let size = match size {
            Some(want) if !is_block && want > cur => {
                if read_only {
                    bail!(
                        "file backend: {} is {cur} bytes, smaller than size={want} (read-only)",
                        path.display()
                    );
                }
                file.set_len(want).with_context(|| {
                    format!("file backend: cannot grow {} to {want}", path.display())
                })?;
                want
            }
            Some(want) if want < cur => want,
            _ => cur,
        };
        Ok(FileInner {
            file,
            path: path.to_path_buf(),
            size,
            direct,
            read_only,
            is_block,
        })
    }

    fn run(&self, req: Request) -> Result<Reply, Errno> {
        match req {
            Request::Read { offset, len } => self.pread(offset, len as usize).map(Reply::Data),
            Request::Write {
                offset,
                data,
                flags,
            } => {
                self.pwrite(offset, &data)?;
                if flags.fua {
                    self.sync()?;
                }
                Ok(Reply::Done(data.len() as u64))
            }
            Request::Flush => self.sync().map(|_| Reply::Done(0)),
            Request::Trim { offset, len, flags } => {
                if !self.is_block {
                    // Trim is advisory: a filesystem without punch-hole is fine.
                    let _ = self.fallocate(
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        offset,
                        len as u64,
                    );
                }
                if flags.fua {
                    self.sync()?;
                }
                Ok(Reply::Done(0))
            }
            Request::WriteZeroes { offset, len, flags } => {
                self.zero(offset, len as u64, flags.no_hole, flags.fast_zero)?;
                if flags.fua {
                    self.sync()?;
                }
                Ok(Reply::Done(0))
            }
            Request::Cache { offset, len } => {
                // SAFETY: posix_fadvise only reads its arguments.
                unsafe {
                    libc::posix_fadvise(
                        self.file.as_raw_fd(),
                        offset as i64,
                        len as i64,
                        libc::POSIX_FADV_WILLNEED,
                    );
                }
                Ok(Reply::Done(0))
            }
            Request::BlockStatus { offset, len } => {
                self.extents(offset, len as u64).map(Reply::Extents)
            }
        }
    }

    fn pread(&self, offset: u64, len: usize) -> Result<Bytes, Errno> {
        if self.direct {
            let (a_off, a_len, skip) = align(offset, len);
            let mut buf = AlignedBuf::new(a_len);
            let n = read_full(&self.file, buf.as_mut(), a_off)?;
            if skip == 0 && a_len == len {
                // aligned: the bounce buffer is the answer (past a short
                // read it holds the allocation's zeroes)
                return Ok(Bytes::from_owner(buf));
            }
            let mut out = BytesMut::zeroed(len);
            let avail = n.saturating_sub(skip).min(len);
            out[..avail].copy_from_slice(&buf.as_mut()[skip..skip + avail]);
            return Ok(out.freeze());
        }
        let mut out = BytesMut::zeroed(len);
        read_full(&self.file, &mut out, offset)?;
        Ok(out.freeze())
    }

    fn pwrite(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        if self.direct {
            let (a_off, a_len, skip) = align(offset, data.len());
            let whole = skip == 0 && a_len == data.len();
            if whole && (data.as_ptr() as usize).is_multiple_of(ALIGN) {
                // aligned in the file and in memory: no bounce buffer
                return self.file.write_all_at(data, offset).map_err(Errno::from);
            }
            let mut buf = if whole {
                // every byte is overwritten below: no zeroing
                AlignedBuf::filled(data)
            } else {
                // Read-modify-write of the partial edge blocks.
                let mut b = AlignedBuf::new(a_len);
                read_full(&self.file, b.as_mut(), a_off)?;
                b
            };
            if !whole {
                buf.as_mut()[skip..skip + data.len()].copy_from_slice(data);
            }
            return self
                .file
                .write_all_at(buf.as_mut(), a_off)
                .map_err(Errno::from);
        }
        self.file.write_all_at(data, offset).map_err(Errno::from)
    }

    fn sync(&self) -> Result<(), Errno> {
        self.file.sync_data().map_err(Errno::from)
    }

    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<(), Errno> {
        // SAFETY: fallocate on an owned fd with plain integer arguments.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as i64, len as i64) };
        if r == 0 {
            Ok(())
        } else {
            Err(Errno::from_io(&std::io::Error::last_os_error()))
        }
    }

    fn zero(&self, offset: u64, len: u64, no_hole: bool, fast: bool) -> Result<(), Errno> {
        if !self.is_block {
            let r = if no_hole {
                self.fallocate(
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )
            } else {
                self.fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )
                .or_else(|_| {
                    self.fallocate(
                        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                        offset,
                        len,
                    )
                })
            };
            if r.is_ok() {
                return Ok(());
            }
        } else {
            let range = [offset, len];
            // SAFETY: BLKZEROOUT reads a [u64; 2] range we own.
            let r = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKZEROOUT, range.as_ptr()) };
            if r == 0 {
                return Ok(());
            }
        }
        if fast {
            return Err(Errno::ENOTSUP);
        }
        // Slow path: write zero buffers.
        let chunk = 1u64 << 20;
        let zeros = vec![0u8; chunk as usize];
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            self.pwrite(offset + done, &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>, Errno> {
        if self.is_block {
            return Ok(vec![Extent {
                len,
                hole: false,
                zero: false,
            }]);
        }
        let fd = self.file.as_raw_fd();
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut pos = offset;
        while pos < end {
            // SAFETY: lseek on an owned fd.
            let data = unsafe { libc::lseek(fd, pos as i64, libc::SEEK_DATA) };
            let (hole, next) = if data < 0 {
                // ENXIO: no data after pos; anything else: report data.
                let err = std::io::Error::last_os_error().raw_os_error();
                if err == Some(libc::ENXIO) {
                    (true, end)
                } else {
                    (false, end)
                }
            } else if data as u64 > pos {
                (true, (data as u64).min(end))
            } else {
                // SAFETY: as above.
                let h = unsafe { libc::lseek(fd, pos as i64, libc::SEEK_HOLE) };
                (false, if h < 0 { end } else { (h as u64).min(end) })
            };
            let next = next.max(pos + 1);
            match out.last_mut() {
                Some(e) if e.hole == hole => e.len += next - pos,
                _ => out.push(Extent {
                    len: next - pos,
                    hole,
                    zero: hole,
                }),
            }
            pos = next;
        }
        Ok(out)
    }
}

const BLKZEROOUT: libc::c_ulong = 0x127f;
const BLKGETSIZE64: libc::c_ulong = 0x80081272;

fn block_size(f: &File) -> std::io::Result<u64> {
    let mut sz: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut sz as *mut u64) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sz)
}

/// Reads until `buf` is full or EOF; returns bytes read (the rest stays zero).
fn read_full(f: &File, buf: &mut [u8], mut off: u64) -> Result<usize, Errno> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Errno::from(e)),
        }
    }
    Ok(done)
}

/// Aligned (offset, length, skip) covering `[offset, offset+len)`.
fn align(offset: u64, len: usize) -> (u64, usize, usize) {
    let a = ALIGN as u64;
    let start = offset / a * a;
    let end = (offset + len as u64).div_ceil(a) * a;
    (start, (end - start) as usize, (offset - start) as usize)
}

/// A heap buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is owned (no other handle to the allocation).
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: ptr is valid and initialised for len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AlignedBuf {
    /// A copy of `data` (whose length is a multiple of [`ALIGN`]), with
    /// no zeroing first.
    fn filled(data: &[u8]) -> Self {
        let len = data.len();
        let layout = std::alloc::Layout::from_size_align(len.max(ALIGN), ALIGN).expect("layout");
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: ptr is valid for len bytes (len <= the layout's size)
        // and does not overlap data; every byte of [0, len) is written.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, len) };
        AlignedBuf { ptr, len }
    }

    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(ALIGN), ALIGN).expect("layout");
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely owned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len.max(ALIGN), ALIGN).expect("layout");
        // SAFETY: allocated with the same layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

impl BlockDev for FileDev {
    fn info(&self) -> DevInfo {
        let f = &self.inner;
        let mut i = DevInfo::full(f.size);
        i.read_only = f.read_only;
        i.can_fast_zero = !f.is_block;
        if f.direct {
            i.pref_block = ALIGN as u32;
        }
        i
    }

    fn submit(&self, req: Request) -> IoFuture {
        if let Err(e) = self.admit(&req) {
            return crate::block::ready(Err(e));
        }
        let req = match &self.uring {
            Some(u) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                match u.try_submit(req, Box::new(move |c| drop(tx.send(c)))) {
                    None => return Box::pin(async move { rx.await.unwrap_or(Err(Errno::EIO)) }),
                    Some((req, _)) => req,
                }
            }
            None => req,
        };
        // Never inline here: callers of `submit` (stages, the EC device's
        // children) may start several requests before awaiting any.
        self.alone.enter(Instant::now());
        self.pool(req)
    }

    fn name(&self) -> String {
        format!("file({})", self.inner.path.display())
    }

    /// With engine=uring, completions call back from the engine's thread;
    /// with engine=threads, from the pool's or, for a request alone on the
    /// device (every write with `inline_writes`), from the caller's before
    /// `submit_cb` returns.
    fn native_callbacks(&self) -> bool {
        self.uring.is_some() || self.alone.enabled() || self.inline_writes
    }

    fn submit_cb(&self, req: Request, cb: crate::block::Callback) {
        if let Err(e) = self.admit(&req) {
            return cb(Err(e));
        }
        if let Some(u) = &self.uring {
            if let Some((req, cb)) = u.try_submit(req, cb) {
                crate::block::drive(self.submit(req), cb);
            }
            return;
        }
        let write = matches!(req, Request::Write { .. });
        if self.alone.enter(Instant::now()) || (self.inline_writes && write) {
            // alone (or a write with inline_writes): on this thread, no
            // hop to the pool and back
            let r = self.inner.run(req);
            self.alone.leave();
            return cb(r);
        }
        crate::block::drive(self.pool(req), cb)
    }
}

impl FileDev {
    /// Runs `req` on the blocking pool; it was counted in with
    /// [`Alone::enter`] and is counted out when it has run (or when the
    /// future is dropped unpolled).
    fn pool(&self, req: Request) -> IoFuture {
        let (dev, leave) = (self.inner.clone(), Leave(self.alone.clone()));
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let r = dev.run(req);
                drop(leave);
                r
            })
            .await
            .unwrap_or(Err(Errno::EIO))
        })
    }

    /// The range check, and EPERM for changes to a read-only file.
    fn admit(&self, req: &Request) -> Result<(), Errno> {
        req.admit(self.inner.size, self.inner.read_only)
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
