//! `file:PATH[,size=SIZE][,direct][,ro][,engine=threads|uring][,sqpoll][,rings=N]`:
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
//! ([`super::file_uring`]) and the rest through the pool.

use super::{BackendSpec, Kind, OptHelp};
use crate::block::{BlockDev, DevInfo, DevRef, Errno, Extent, IoFuture, Reply, Request};
use anyhow::{bail, Context, Result};
use bytes::{Bytes, BytesMut};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const ALIGN: usize = 4096;

/// The file backend; cheap to share with the blocking pool.
pub struct FileDev {
    inner: Arc<FileInner>,
    uring: Option<super::file_uring::UringFile>,
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
    Ok(FileConfig {
        path: PathBuf::from(&s.arg),
        size,
        direct: s.opts.flag("direct")?,
        read_only: s.opts.flag("ro")?,
        uring,
        sqpoll,
        rings: rings as usize,
    })
}

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let c = parse(s)?;
    let mut dev = FileDev::open(&c.path, c.size, c.direct, c.read_only)?;
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
            let mut buf = AlignedBuf::new(a_len);
            if skip != 0 || a_len != data.len() {
                // Read-modify-write of the partial edge blocks.
                read_full(&self.file, buf.as_mut(), a_off)?;
            }
            buf.as_mut()[skip..skip + data.len()].copy_from_slice(data);
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

impl AlignedBuf {
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
        let dev = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || dev.run(req))
                .await
                .unwrap_or(Err(Errno::EIO))
        })
    }

    fn name(&self) -> String {
        format!("file({})", self.inner.path.display())
    }

    /// With engine=uring, completions call back from the engine's thread.
    fn native_callbacks(&self) -> bool {
        self.uring.is_some()
    }

    fn submit_cb(&self, req: Request, cb: crate::block::Callback) {
        if let Some(u) = &self.uring {
            if let Err(e) = self.admit(&req) {
                return cb(Err(e));
            }
            if let Some((req, cb)) = u.try_submit(req, cb) {
                crate::block::drive(self.submit(req), cb);
            }
            return;
        }
        crate::block::drive(self.submit(req), cb)
    }
}

impl FileDev {
    /// The range check, and EPERM for changes to a read-only file.
    fn admit(&self, req: &Request) -> Result<(), Errno> {
        req.admit(self.inner.size, self.inner.read_only)
    }
}
