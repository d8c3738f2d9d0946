//! Positioned file I/O helpers.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Reads exactly `buf.len()` bytes at `off`; a short file is an error.
pub fn read_exact(file: &File, off: u64, buf: &mut [u8]) -> io::Result<()> {
    file.read_exact_at(buf, off)
}

/// Reads `buf.len()` bytes at `off`; what lies past the end of the file
/// reads as zeroes (qcow2 files may end inside their last cluster).
pub fn read_zero_fill(file: &File, off: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub fn write_all(file: &File, off: u64, buf: &[u8]) -> io::Result<()> {
    file.write_all_at(buf, off)
}

/// Makes every completed write to `file` durable (fdatasync).
pub fn sync(file: &File) -> io::Result<()> {
    file.sync_data()
}

/// Alignment of O_DIRECT offsets, lengths and buffers (the largest
/// logical block size in common use, so it works on every device).
pub const DIRECT_ALIGN: usize = 4096;
/// Bytes one O_DIRECT call moves through the bounce buffer; each thread
/// that does direct I/O keeps one buffer of this size.
pub const DIRECT_CHUNK: usize = 128 << 10;

/// A heap buffer aligned for O_DIRECT.
struct Aligned {
    ptr: std::ptr::NonNull<u8>,
}

impl Aligned {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(DIRECT_CHUNK, DIRECT_ALIGN).expect("layout")
    }

    fn new() -> Aligned {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        let ptr = std::ptr::NonNull::new(p).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(Self::layout());
        });
        Aligned { ptr }
    }

    fn slice(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: `ptr` owns DIRECT_CHUNK bytes and len <= DIRECT_CHUNK.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len.min(DIRECT_CHUNK)) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout()) }
    }
}

thread_local! {
    static BOUNCE: std::cell::RefCell<Option<Aligned>> = const { std::cell::RefCell::new(None) };
}

/// Whether `[off, off + len)` can go through O_DIRECT.
pub fn direct_ok(off: u64, len: usize) -> bool {
    off.is_multiple_of(DIRECT_ALIGN as u64) && len.is_multiple_of(DIRECT_ALIGN) && len > 0
}

fn with_bounce<R>(f: impl FnOnce(&mut Aligned) -> R) -> R {
    BOUNCE.with(|b| {
        let mut b = b.borrow_mut();
        f(b.get_or_insert_with(Aligned::new))
    })
}

/// [`read_zero_fill`] on a file opened with O_DIRECT, through this
/// thread's aligned bounce buffer (`off` and `buf.len()` aligned).
pub fn read_direct(file: &File, off: u64, buf: &mut [u8]) -> io::Result<()> {
    with_bounce(|a| {
        for (i, out) in buf.chunks_mut(DIRECT_CHUNK).enumerate() {
            let b = a.slice(out.len());
            read_zero_fill(file, off + (i * DIRECT_CHUNK) as u64, b)?;
            out.copy_from_slice(b);
        }
        Ok(())
    })
}

/// [`write_all`] on a file opened with O_DIRECT (aligned as for
/// [`read_direct`]).
pub fn write_direct(file: &File, off: u64, data: &[u8]) -> io::Result<()> {
    with_bounce(|a| {
        for (i, piece) in data.chunks(DIRECT_CHUNK).enumerate() {
            let b = a.slice(piece.len());
            b.copy_from_slice(piece);
            write_all(file, off + (i * DIRECT_CHUNK) as u64, b)?;
        }
        Ok(())
    })
}
