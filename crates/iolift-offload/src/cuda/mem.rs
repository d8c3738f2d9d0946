//! CUDA memory helpers for kernels' host sides: page-locked host memory
//! mapped into the device's address space, device buffers grown on demand,
//! and large host copies over the rayon pool.

use super::cuda_err;
use crate::error::Result;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::Arc;

/// Page-locked host memory mapped into the device's address space.
pub struct Pinned<T> {
    ctx: Arc<CudaContext>,
    ptr: *mut T,
    len: usize,
    dptr: u64,
}

// SAFETY: plain host memory owned by this value; access is serialised by
// whoever owns the buffer (kernels keep them behind a per-stream lock).
unsafe impl<T: Send> Send for Pinned<T> {}

impl<T: Copy> Pinned<T> {
    /// `len` elements (at least 1) of page-locked, device-mapped memory.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Pinned<T>> {
        use cudarc::driver::sys;
        ctx.bind_to_thread().map_err(cuda_err)?;
        let bytes = len.max(1) * std::mem::size_of::<T>();
        // SAFETY: allocation of `bytes` of page-locked memory; checked below.
        let p = unsafe {
            cudarc::driver::result::malloc_host(
                bytes,
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }
        .map_err(cuda_err)?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `p` was allocated with DEVICEMAP just above.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, p, 0) };
        let pinned = Pinned {
            ctx: ctx.clone(),
            ptr: p as *mut T,
            len: len.max(1),
            dptr,
        };
        r.result().map_err(cuda_err)?;
        Ok(pinned)
    }

    /// Elements this buffer holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty (holds at least one element).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The buffer's address in the device's address space.
    pub fn dptr(&self) -> u64 {
        self.dptr
    }

    /// The first `n` elements.
    pub fn slice(&self, n: usize) -> &[T] {
        assert!(n <= self.len);
        // SAFETY: `len` initialised-or-device-written elements of T (plain
        // integers: every bit pattern is valid).
        unsafe { std::slice::from_raw_parts(self.ptr, n) }
    }

    /// The first `n` elements, writable.
    pub fn slice_mut(&mut self, n: usize) -> &mut [T] {
        assert!(n <= self.len);
        // SAFETY: as above, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, n) }
    }
}

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host; no launch using it is pending
        // (buffers are only replaced after the stream was synchronised).
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr as _) };
    }
}

/// Make `buf` a device buffer of at least `n` elements (a power of two;
/// replaced only when too small).
pub fn ensure<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<()> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = Some(
            stream
                .alloc_zeros::<T>(n.next_power_of_two())
                .map_err(cuda_err)?,
        );
    }
    Ok(())
}

/// Make `buf` a pinned buffer of at least `n` elements.
pub fn ensure_pinned<T: Copy>(
    ctx: &Arc<CudaContext>,
    buf: &mut Option<Pinned<T>>,
    n: usize,
) -> Result<()> {
    if buf.as_ref().is_none_or(|b| b.len < n) {
        *buf = None;
        *buf = Some(Pinned::new(ctx, n.next_power_of_two())?);
    }
    Ok(())
}

/// `dst.copy_from_slice(src)`, over the rayon pool for large copies.
pub fn par_copy<T: Copy + Send + Sync>(dst: &mut [T], src: &[T]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 18;
    if src.len() < 4 * CHUNK {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
}
