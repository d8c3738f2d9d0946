//! The classic transport: read() one request from /dev/fuse, hand it to
//! the shared FUSE session, writev() the reply. With the ring on, one
//! such thread still reads what the kernel never puts on the ring
//! (FORGET, BATCH_FORGET, INTERRUPT).

use super::patch::{self, Patch};
use super::Shared;
use crate::virtio::reply::{Reply, Sink};
use crate::virtio::Session;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Reads one request into `buf`: its length, or None once the
/// connection is gone (unmounted or aborted).
pub fn read_one(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // ENOENT: the request was interrupted before it was read.
            Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
            Some(libc::ENODEV) => return Ok(None),
            _ => return Err(io::Error::new(e.kind(), format!("read /dev/fuse: {e}"))),
        }
    }
}

/// Where a reply to a request read from `fd` goes: one writev (or one
/// write of the patched copy).
fn sink(fd: Arc<OwnedFd>, patch: Option<Patch>) -> Sink {
    Box::new(move |parts: Option<&[&[u8]]>| {
        let Some(parts) = parts else { return };
        let r = match patch {
            Some(p) => {
                let mut v = parts.concat();
                patch::apply(p, &mut v);
                // SAFETY: `v` is valid for reads of its length.
                unsafe { libc::write(fd.as_raw_fd(), v.as_ptr().cast(), v.len()) }
            }
            None => {
                let iov: Vec<libc::iovec> = parts
                    .iter()
                    .map(|p| libc::iovec {
                        iov_base: p.as_ptr() as *mut libc::c_void,
                        iov_len: p.len(),
                    })
                    .collect();
                // SAFETY: each iovec points at a live slice of its length.
                unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32) }
            }
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ENOENT: the kernel no longer waits for it (interrupted).
            if e.raw_os_error() != Some(libc::ENOENT) {
                tracing::debug!("devfuse: writing a reply to /dev/fuse: {e}");
            }
        }
    })
}

/// Serves the request in `req` (read from `fd`), with `patch` applied
/// to its reply.
pub fn answer(session: &Session, fd: &Arc<OwnedFd>, req: &[u8], room: usize, patch: Option<Patch>) {
    let unique = super::abi::u64_at(req, 8).unwrap_or(0);
    session.handle(req, Reply::new(unique, room, sink(fd.clone(), patch)));
}

/// One reader thread's loop, until the connection is gone.
pub fn serve(fd: Arc<OwnedFd>, session: Arc<Session>, shared: Arc<Shared>) -> io::Result<()> {
    let room = session.max_request();
    let mut buf = vec![0u8; room];
    while let Some(n) = read_one(&fd, &mut buf)? {
        let req = &buf[..n];
        shared.dev_requests.fetch_add(1, Ordering::Relaxed);
        let p = patch::for_request(req, false, shared.dir_cache);
        answer(&session, &fd, req, room, p);
    }
    Ok(())
}
