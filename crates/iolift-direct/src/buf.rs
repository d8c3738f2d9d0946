//! Aligned buffers and the pool of registered (fixed) buffers.
//!
//! O_DIRECT needs the memory, the offset and the length aligned to the
//! device's logical block size; [`AlignedBuf`] is a heap buffer aligned to
//! [`ALIGN`] (4 KiB, a multiple of every logical block size in use).
//!
//! [`FixedPool`] is one aligned allocation cut into equal buffers that the
//! engine registers with its ring (`IORING_REGISTER_BUFFERS`), so the kernel
//! maps and pins their pages once instead of on every request. A buffer
//! taken from the pool ([`FixedBuf`]) goes back to it when dropped.
//!
//! Page-locking for a GPU: a [`PinHook`] given to the engine is called once
//! on the pool's whole allocation after it is made and before it is freed.
//! The offload engine's CUDA device will implement it with
//! `cuMemHostRegister` / `cuMemHostUnregister` so that a kernel can read the
//! buffers the engine fills; no implementation exists yet (see
//! docs/direct.md).

use std::alloc::{alloc, alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::io;
use std::sync::{Arc, Mutex};

/// Alignment of every buffer this crate allocates.
pub const ALIGN: usize = 4096;

/// A zeroed heap buffer aligned to [`ALIGN`].
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer owns its allocation; nothing else points into it.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (its allocation is rounded up to
    /// [`ALIGN`], at least one page).
    pub fn new(len: usize) -> AlignedBuf {
        let cap = len.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len, cap }
    }

    /// A buffer holding a copy of `src`: the bytes are copied once, not
    /// zeroed first (only the allocation's tail past them is zeroed).
    pub fn copy_of(src: &[u8]) -> AlignedBuf {
        Self::concat([src], src.len())
    }

    /// A buffer of `len` bytes holding `parts` one after the other (at
    /// most `len` bytes of them), zeroes after them: each byte is written
    /// once.
    pub fn concat<'a>(parts: impl IntoIterator<Item = &'a [u8]>, len: usize) -> AlignedBuf {
        let cap = len.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            handle_alloc_error(layout);
        }
        let mut at = 0;
        for p in parts {
            let n = p.len().min(len - at);
            // SAFETY: `at + n <= len <= cap` bytes of the new allocation;
            // `p` is another object, so they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), ptr.add(at), n) };
            at += n;
        }
        // SAFETY: the rest of the allocation, `at..cap`: every byte of
        // the buffer is initialised, as `new`'s are.
        unsafe { std::ptr::write_bytes(ptr.add(at), 0, cap - at) };
        AlignedBuf { ptr, len, cap }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocated size (a multiple of [`ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Changes the length within the capacity (the bytes keep their values).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "set_len {len} over capacity {}", self.cap);
        self.len = len;
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, initialised (zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we own the buffer uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, ALIGN).expect("buffer layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} of {})", self.len, self.cap)
    }
}

/// Called on the fixed-buffer pool's memory: `pin` once after it is
/// allocated, `unpin` once before it is freed. The hook through which the
/// GPU page-locks the engine's buffers (see the module docs).
pub trait PinHook: Send + Sync {
    fn pin(&self, ptr: *mut u8, len: usize) -> io::Result<()>;
    fn unpin(&self, ptr: *mut u8, len: usize);
}

/// `count` buffers of `size` bytes in one aligned allocation.
pub struct FixedPool {
    mem: AlignedBuf,
    size: usize,
    count: usize,
    free: Mutex<Vec<u16>>,
    pin: Option<Arc<dyn PinHook>>,
}

impl FixedPool {
    /// A pool of `count` (at most 16384) buffers of `size` bytes (rounded up
    /// to [`ALIGN`]); `pin` is called on the whole allocation.
    pub fn new(count: usize, size: usize, pin: Option<Arc<dyn PinHook>>) -> io::Result<FixedPool> {
        if count > 16384 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{count} fixed buffers: at most 16384"),
            ));
        }
        let size = size.max(1).div_ceil(ALIGN) * ALIGN;
        let mut mem = AlignedBuf::new(size * count.max(1));
        if let Some(p) = &pin {
            p.pin(mem.as_mut_ptr(), mem.capacity())?;
        }
        Ok(FixedPool {
            mem,
            size,
            count,
            free: Mutex::new((0..count as u16).rev().collect()),
            pin,
        })
    }

    /// The size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.size
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Buffers not taken.
    pub fn available(&self) -> usize {
        self.free.lock().unwrap().len()
    }

    /// The iovecs to register, in index order.
    pub(crate) fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.count)
            .map(|i| libc::iovec {
                // SAFETY: i * size is inside the allocation.
                iov_base: unsafe { self.mem.as_ptr().add(i * self.size) } as *mut libc::c_void,
                iov_len: self.size,
            })
            .collect()
    }

    /// Takes a free buffer of length `len` (<= [`Self::buf_size`]), or None
    /// when all are taken or `len` does not fit.
    pub fn take(self: &Arc<Self>, len: usize) -> Option<FixedBuf> {
        if len > self.size {
            return None;
        }
        let idx = self.free.lock().unwrap().pop()?;
        // SAFETY: idx < count, so the slice is inside the allocation.
        let ptr = unsafe { self.mem.as_ptr().add(idx as usize * self.size) } as *mut u8;
        Some(FixedBuf {
            pool: self.clone(),
            idx,
            ptr,
            len,
        })
    }
}

impl Drop for FixedPool {
    fn drop(&mut self) {
        if let Some(p) = &self.pin {
            p.unpin(self.mem.as_mut_ptr(), self.mem.capacity());
        }
    }
}

/// One registered buffer of a [`FixedPool`]; back to the pool on drop.
pub struct FixedBuf {
    pool: Arc<FixedPool>,
    idx: u16,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer's slice of the pool is owned by this value alone until
// it is dropped.
unsafe impl Send for FixedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for FixedBuf {}

impl FixedBuf {
    /// Its index among the ring's registered buffers.
    pub fn index(&self) -> u16 {
        self.idx
    }

    /// Changes the length within the pool's buffer size.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.pool.size,
            "set_len {len} over {}",
            self.pool.size
        );
        self.len = len;
    }

    /// The pool this buffer belongs to.
    pub fn pool(&self) -> &Arc<FixedPool> {
        &self.pool
    }
}

impl std::ops::Deref for FixedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for pool.size >= len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for FixedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; this buffer's slice is ours alone.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for FixedBuf {
    fn drop(&mut self) {
        self.pool.free.lock().unwrap().push(self.idx);
    }
}

/// Read-only bytes owned elsewhere (a network payload), written as they are.
pub type SharedBytes = Box<dyn AsRef<[u8]> + Send + Sync>;

/// The memory of one request: an aligned buffer, a registered buffer, a
/// plain vector, or (writes only) shared read-only bytes.
pub enum Buf {
    Aligned(AlignedBuf),
    Fixed(FixedBuf),
    Vec(Vec<u8>),
    /// Write-only: a read into it completes with -EINVAL, and it cannot be
    /// borrowed mutably (`DerefMut` panics: a caller's mistake).
    Shared(SharedBytes),
}

impl Buf {
    pub fn len(&self) -> usize {
        match self {
            Buf::Aligned(b) => b.len(),
            Buf::Fixed(b) => b.len(),
            Buf::Vec(v) => v.len(),
            Buf::Shared(b) => (**b).as_ref().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory to read into; None for shared bytes.
    pub(crate) fn ptr_mut(&mut self) -> Option<*mut u8> {
        match self {
            Buf::Aligned(b) => Some(b.as_mut_ptr()),
            Buf::Fixed(b) => Some(b.ptr),
            Buf::Vec(v) => Some(v.as_mut_ptr()),
            Buf::Shared(_) => None,
        }
    }

    /// The memory to write from.
    pub(crate) fn ptr(&self) -> *const u8 {
        self.as_ref().as_ptr()
    }

    /// The registered buffer index, for a fixed buffer.
    pub fn fixed_index(&self) -> Option<u16> {
        match self {
            Buf::Fixed(b) => Some(b.idx),
            _ => None,
        }
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Buf::Aligned(b) => b,
            Buf::Fixed(b) => b,
            Buf::Vec(v) => v,
            Buf::Shared(b) => (**b).as_ref(),
        }
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Buf::Aligned(b) => b,
            Buf::Fixed(b) => b,
            Buf::Vec(v) => v,
            Buf::Shared(_) => panic!("Buf::Shared is read-only"),
        }
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for len in [0, 1, 511, 4096, 4097, 65536 + 3] {
            let b = AlignedBuf::new(len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0, "len {len}");
            assert_eq!(b.len(), len);
            assert!(b.capacity() >= len && b.capacity().is_multiple_of(ALIGN));
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn copies_hold_their_bytes_and_zeroes_after_them() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut b = AlignedBuf::copy_of(&src);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert_eq!(&b[..], &src[..]);
        // The tail up to the capacity is zeroed, not left as it was.
        let cap = b.capacity();
        b.set_len(cap);
        assert!(b[5000..].iter().all(|&x| x == 0));
        let c = AlignedBuf::concat([&src[..100], &src[100..300], &src[..50]], 400);
        assert_eq!(c.len(), 400);
        assert_eq!(&c[..300], &src[..300]);
        assert_eq!(&c[300..350], &src[..50]);
        assert!(c[350..].iter().all(|&x| x == 0), "zeroes after the parts");
        // Parts past the length are cut.
        let d = AlignedBuf::concat([&src[..], &src[..]], 6000);
        assert_eq!(&d[..5000], &src[..]);
        assert_eq!(&d[5000..], &src[..1000]);
    }

    #[test]
    fn pool_hands_out_each_buffer_once_and_takes_it_back() {
        let p = Arc::new(FixedPool::new(3, 5000, None).unwrap());
        assert_eq!(p.buf_size(), 8192);
        assert!(p.take(8193).is_none(), "oversized take");
        let a = p.take(100).unwrap();
        let b = p.take(8192).unwrap();
        let c = p.take(1).unwrap();
        assert!(p.take(1).is_none(), "a fourth buffer from a pool of 3");
        let mut idx = vec![a.index(), b.index(), c.index()];
        idx.sort();
        assert_eq!(idx, vec![0, 1, 2]);
        for (i, v) in p.iovecs().iter().enumerate() {
            assert_eq!(v.iov_base as usize % ALIGN, 0);
            assert_eq!(v.iov_len, 8192, "iovec {i}");
        }
        drop(b);
        assert_eq!(p.available(), 1);
        let d = p.take(10).unwrap();
        assert_eq!(d.len(), 10);
    }

    struct CountPins(std::sync::atomic::AtomicIsize);
    impl PinHook for CountPins {
        fn pin(&self, ptr: *mut u8, len: usize) -> io::Result<()> {
            assert_eq!(ptr as usize % ALIGN, 0);
            self.0
                .fetch_add(len as isize, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        fn unpin(&self, _ptr: *mut u8, len: usize) {
            self.0
                .fetch_sub(len as isize, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn pin_hook_sees_the_whole_pool_once() {
        let h = Arc::new(CountPins(0.into()));
        let p = FixedPool::new(4, 4096, Some(h.clone())).unwrap();
        assert_eq!(h.0.load(std::sync::atomic::Ordering::SeqCst), 4 * 4096);
        drop(p);
        assert_eq!(h.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
