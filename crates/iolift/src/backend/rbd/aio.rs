//! librbd asynchronous I/O: one aio call per request, its completion
//! delivered to a future or straight to a callback.
//!
//! Contract: [`aio_start`] hands librbd a boxed context that owns the
//! request's buffer and the place its result goes (a oneshot sender or a
//! function); librbd's completion callback ([`aio_done`], on a librbd
//! thread) takes the context back, releases the completion and delivers
//! the return value with the buffer. The buffer therefore outlives the aio
//! even when the waiting future is dropped. A submission librbd refuses
//! is reclaimed at once and never called back. Return values follow
//! DeLiBA's completion semantics: bytes for reads and writes, 0 for
//! flush/discard/zero, or a negative errno.

use crate::block::{Completion, Errno, IoFuture, Reply};
use crate::ceph::rbd::{self as librbd, CompletionT, Image, ImageT, RbdApi};
use bytes::Bytes;
use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::Arc;
use tokio::sync::oneshot;

/// What a callback context keeps alive until librbd is done with it.
pub(super) enum AioBuf {
    None,
    Read(Vec<u8>),
    Write(Bytes),
}

/// Where an aio's result goes.
enum Sink {
    /// To a future waiting on the receiver.
    Future(oneshot::Sender<(isize, AioBuf)>),
    /// Straight to a function, called on librbd's completion thread.
    Call(Box<dyn FnOnce(isize, AioBuf) + Send>),
}

impl Sink {
    fn deliver(self, r: isize, buf: AioBuf) {
        match self {
            // The receiver may be gone (request abandoned); the buffer drops here.
            Sink::Future(tx) => {
                let _ = tx.send((r, buf));
            }
            Sink::Call(f) => f(r, buf),
        }
    }
}

/// Owned by librbd between submission and the callback.
struct AioCtx {
    sink: Sink,
    buf: AioBuf,
}

/// A receiver for one aio's return value and buffer.
pub(super) type AioRx = oneshot::Receiver<(isize, AioBuf)>;

/// librbd's completion callback: hands the result and the buffer on and
/// releases the completion.
unsafe extern "C" fn aio_done(c: CompletionT, arg: *mut c_void) {
    // The callback only exists after librbd was loaded.
    let Some(api) = librbd::loaded() else { return };
    // SAFETY: `c` is the completion librbd is finishing; `arg` is the
    // AioCtx leaked by `aio_start` for exactly this completion.
    let (r, ctx) = unsafe {
        let r = (api.rbd_aio_get_return_value)(c);
        (api.rbd_aio_release)(c);
        (r, Box::from_raw(arg as *mut AioCtx))
    };
    let AioCtx { sink, buf } = *ctx;
    // A panic must not unwind into librbd's C++ thread.
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.deliver(r, buf)));
    if ok.is_err() {
        tracing::error!("rbd: a completion callback panicked");
    }
}

/// Starts one aio: `start` gets the api, image, completion and the buffer
/// pointer (read: writable, write: readable, else null) and returns
/// librbd's submission code. On failure the sink comes back undelivered.
fn aio_start(
    img: &Image,
    buf: AioBuf,
    sink: Sink,
    start: impl FnOnce(&RbdApi, ImageT, CompletionT, *mut u8) -> c_int,
) -> Result<(), (Errno, Sink)> {
    let api = img.api();
    let mut ctx = Box::new(AioCtx { sink, buf });
    // The heap buffers do not move when the box is leaked.
    let p = match &mut ctx.buf {
        AioBuf::None => ptr::null_mut(),
        AioBuf::Read(v) => v.as_mut_ptr(),
        AioBuf::Write(b) => b.as_ptr() as *mut u8,
    };
    let arg = Box::into_raw(ctx);
    let mut c: CompletionT = ptr::null_mut();
    // SAFETY: arg stays valid until the callback (or the failure paths below) frees it.
    let r = unsafe { (api.rbd_aio_create_completion)(arg as *mut c_void, aio_done, &mut c) };
    if r < 0 {
        // SAFETY: not handed to librbd; reclaim it.
        let ctx = unsafe { Box::from_raw(arg) };
        return Err((Errno(-r), ctx.sink));
    }
    let r = start(api, img.handle(), c, p);
    if r < 0 {
        // Not queued: librbd will not call back. Release and reclaim.
        // SAFETY: the completion and arg are still ours.
        let ctx = unsafe {
            (api.rbd_aio_release)(c);
            Box::from_raw(arg)
        };
        return Err((Errno(-r), ctx.sink));
    }
    Ok(())
}

/// [`aio_start`] with a future's receiver as the sink.
pub(super) fn aio(
    img: &Image,
    buf: AioBuf,
    start: impl FnOnce(&RbdApi, ImageT, CompletionT, *mut u8) -> c_int,
) -> Result<AioRx, Errno> {
    let (tx, rx) = oneshot::channel();
    aio_start(img, buf, Sink::Future(tx), start).map_err(|(e, _)| e)?;
    Ok(rx)
}

/// [`aio_start`] with a callback as the sink; a submission failure is
/// delivered to it as a negative return value.
pub(super) fn aio_call(
    img: &Image,
    buf: AioBuf,
    f: impl FnOnce(isize, AioBuf) + Send + 'static,
    start: impl FnOnce(&RbdApi, ImageT, CompletionT, *mut u8) -> c_int,
) {
    if let Err((e, sink)) = aio_start(img, buf, Sink::Call(Box::new(f)), start) {
        sink.deliver(-(e.0 as isize), AioBuf::None);
    }
}

/// A librbd return value as a result.
pub(super) fn rc(r: isize) -> Result<usize, Errno> {
    if r < 0 {
        Err(Errno((-r).min(i32::MAX as isize) as i32))
    } else {
        Ok(r as usize)
    }
}

/// A finished read: librbd filled `r` bytes of the buffer's capacity (a
/// short read, past the end, is zero-filled).
pub(super) fn read_done(r: isize, buf: AioBuf, len: usize) -> Completion {
    let n = rc(r)?.min(len);
    let AioBuf::Read(mut v) = buf else {
        return Err(Errno::EIO);
    };
    if v.capacity() < len {
        return Err(Errno::EIO);
    }
    // SAFETY: librbd filled the first n bytes; zero the rest, then all
    // `len` bytes of capacity are initialised.
    unsafe {
        ptr::write_bytes(v.as_mut_ptr().add(n), 0, len - n);
        v.set_len(len);
    }
    Ok(Reply::Data(Bytes::from(v)))
}

/// Waits for an aio's callback; maps a negative return value to an errno.
pub(super) async fn wait(rx: AioRx) -> Result<(isize, AioBuf), Errno> {
    match rx.await {
        Ok((r, buf)) => rc(r).map(|_| (r, buf)),
        Err(_) => Err(Errno::EIO),
    }
}

pub(super) fn flush_aio(img: &Image) -> Result<AioRx, Errno> {
    // SAFETY: open image and a fresh completion.
    aio(img, AioBuf::None, |api, im, c, _| unsafe {
        (api.rbd_aio_flush)(im, c)
    })
}

/// Starts `rbd_aio_read` of `len` bytes into the context's `AioBuf::Read`.
pub(super) fn read_op(
    offset: u64,
    len: usize,
) -> impl FnOnce(&RbdApi, ImageT, CompletionT, *mut u8) -> c_int {
    // SAFETY: p points to the Vec's `len` bytes of capacity.
    move |api, img, c, p| unsafe { (api.rbd_aio_read)(img, offset, len, p as *mut c_char, c) }
}

/// Starts `rbd_aio_write` of the context's `AioBuf::Write` (`len` bytes).
pub(super) fn write_op(
    offset: u64,
    len: usize,
) -> impl FnOnce(&RbdApi, ImageT, CompletionT, *mut u8) -> c_int {
    // SAFETY: p points to `len` bytes kept alive by the context.
    move |api, img, c, p| unsafe { (api.rbd_aio_write)(img, offset, len, p as *const c_char, c) }
}

pub(super) fn write_aio(img: &Image, offset: u64, data: Bytes) -> Result<AioRx, Errno> {
    let len = data.len();
    aio(img, AioBuf::Write(data), write_op(offset, len))
}

/// Completes `first`, then (for FUA) a flush; returns `Done(n)`.
pub(super) fn then_flush(
    img: Arc<Image>,
    first: Result<AioRx, Errno>,
    fua: bool,
    n: u64,
) -> IoFuture {
    Box::pin(async move {
        wait(first?).await?;
        if fua {
            wait(flush_aio(&img)?).await?;
        }
        Ok(Reply::Done(n))
    })
}
