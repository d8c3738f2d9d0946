//! The storage an engine drives: a raw block device or an image file.
//!
//! [`Target::open`] opens it with O_DIRECT when asked ([`Direct`]). Some file
//! systems refuse O_DIRECT (tmpfs, overlay on some kernels): `open(2)` then
//! fails with EINVAL. [`Direct::On`] turns that into an error that says so;
//! [`Direct::Auto`] opens the file without O_DIRECT instead and records why
//! ([`Target::fallback`]), so a caller can print it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Whether to bypass the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direct {
    /// Buffered I/O through the page cache.
    Off,
    /// O_DIRECT where the file system allows it, buffered otherwise.
    Auto,
    /// O_DIRECT or an error.
    On,
}

/// How to open a target.
#[derive(Debug, Clone)]
pub struct Open {
    pub read: bool,
    pub write: bool,
    pub direct: Direct,
    /// Create a missing image file with this size, and grow a smaller one.
    pub create_size: Option<u64>,
}

impl Default for Open {
    fn default() -> Self {
        Open {
            read: true,
            write: true,
            direct: Direct::Auto,
            create_size: None,
        }
    }
}

/// An opened block device or image file.
#[derive(Debug)]
pub struct Target {
    file: File,
    path: PathBuf,
    size: u64,
    is_block: bool,
    direct: bool,
    fallback: Option<String>,
    block: usize,
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;

impl Target {
    /// Opens `path` as `o` says.
    pub fn open(path: &Path, o: &Open) -> io::Result<Target> {
        let ctx = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
        };
        let meta = std::fs::metadata(path);
        let is_block = meta
            .as_ref()
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if meta.is_err() && o.create_size.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{}: does not exist (give a size to create it)",
                    path.display()
                ),
            ));
        }
        let mut oo = OpenOptions::new();
        oo.read(o.read).write(o.write);
        if o.write && !is_block && o.create_size.is_some() {
            oo.create(true);
        }
        let mut fallback = None;
        let file = if o.direct == Direct::Off {
            oo.open(path).map_err(|e| ctx(e, "open"))?
        } else {
            let mut od = oo.clone();
            od.custom_flags(libc::O_DIRECT);
            match od.open(path) {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    let why = format!(
                        "the file system holding {} refuses O_DIRECT (EINVAL)",
                        path.display()
                    );
                    if o.direct == Direct::On {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("{why}; open it without direct I/O"),
                        ));
                    }
                    fallback = Some(why);
                    oo.open(path).map_err(|e| ctx(e, "open"))?
                }
                Err(e) => return Err(ctx(e, "open (O_DIRECT)")),
            }
        };
        let direct = o.direct != Direct::Off && fallback.is_none();
        let mut size = if is_block {
            let mut sz: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 into sz.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut sz as *mut u64) };
            if r != 0 {
                return Err(ctx(io::Error::last_os_error(), "BLKGETSIZE64"));
            }
            sz
        } else {
            file.metadata().map_err(|e| ctx(e, "stat"))?.len()
        };
        if let Some(want) = o.create_size {
            if !is_block && want > size {
                if !o.write {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: {size} bytes, smaller than {want} (read-only)",
                            path.display()
                        ),
                    ));
                }
                file.set_len(want).map_err(|e| ctx(e, "grow"))?;
                size = want;
            }
        }
        let block = if !direct {
            1
        } else if is_block {
            let mut b: libc::c_int = 0;
            // SAFETY: BLKSSZGET writes one int into b.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut b as *mut libc::c_int) };
            if r != 0 || b <= 0 {
                512
            } else {
                b as usize
            }
        } else {
            crate::buf::ALIGN
        };
        Ok(Target {
            file,
            path: path.to_path_buf(),
            size,
            is_block,
            direct,
            fallback,
            block,
        })
    }

    /// Allocates every block of an image file (fallocate(2), mode 0: holes
    /// get blocks, data stays), as a block device has them: an O_DIRECT
    /// write into a hole makes the host's file system allocate, which
    /// io_uring cannot do without blocking, so each such write is handed
    /// to a kernel worker thread. Nothing to do for a block device.
    pub fn allocate(&self) -> io::Result<()> {
        if self.is_block || self.size == 0 {
            return Ok(());
        }
        let len = libc::off_t::try_from(self.size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size past off_t"))?;
        // SAFETY: fallocate on a descriptor we own.
        if unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, len) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("{}: fallocate: {e}", self.path.display()),
            ));
        }
        Ok(())
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size in bytes (a block device's, or the image file's at open).
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn is_block(&self) -> bool {
        self.is_block
    }

    /// Opened with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Why O_DIRECT was asked for ([`Direct::Auto`]) but not used.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// The alignment direct I/O needs for offsets, lengths and memory: the
    /// device's logical block size, 4096 for an image file opened with
    /// O_DIRECT, 1 for buffered I/O.
    pub fn align(&self) -> usize {
        self.block
    }
}
