//! [`Reply`]: where the answer to one FUSE request goes. It writes
//! fuse_out_header plus the body into the request's device-writable
//! buffers (through the sink the transport gives it), exactly once: a
//! `Reply` dropped unanswered answers EIO, so the guest is never left
//! waiting for a request the server lost.

use super::wire::OUT_HEADER_LEN;
use crate::model::Errno;

/// Receives the reply's pieces (header first) and returns the element to
/// the guest; `None` returns it with nothing written (FORGET, which has
/// no reply).
pub type Sink = Box<dyn FnOnce(Option<&[&[u8]]>) + Send>;

pub struct Reply {
    unique: u64,
    /// Device-writable bytes the guest gave for the reply.
    room: usize,
    sink: Option<Sink>,
}

impl Reply {
    pub fn new(unique: u64, room: usize, sink: Sink) -> Reply {
        Reply {
            unique,
            room,
            sink: Some(sink),
        }
    }

    /// How many body bytes fit after the header.
    pub fn room(&self) -> usize {
        self.room.saturating_sub(OUT_HEADER_LEN)
    }

    pub fn set_unique(&mut self, unique: u64) {
        self.unique = unique;
    }

    fn header(&self, len: usize, error: i32) -> [u8; OUT_HEADER_LEN] {
        let mut h = [0u8; OUT_HEADER_LEN];
        h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        h[4..8].copy_from_slice(&error.to_le_bytes());
        h[8..16].copy_from_slice(&self.unique.to_le_bytes());
        h
    }

    /// Answers success with `body` (its pieces in order). A body larger
    /// than the guest's buffers answers EIO instead.
    pub fn ok(mut self, body: &[&[u8]]) {
        let len: usize = body.iter().map(|b| b.len()).sum();
        if len > self.room() {
            tracing::warn!(
                "virtio-fs: a {len}-byte reply does not fit the guest's {} bytes: EIO",
                self.room()
            );
            return self.err(Errno::EIO);
        }
        let h = self.header(OUT_HEADER_LEN + len, 0);
        let mut parts: Vec<&[u8]> = Vec::with_capacity(body.len() + 1);
        parts.push(&h);
        parts.extend_from_slice(body);
        if let Some(s) = self.sink.take() {
            s(Some(&parts))
        }
    }

    /// Answers with `-errno` and no body.
    pub fn err(mut self, e: Errno) {
        let h = self.header(OUT_HEADER_LEN, -e.0.abs());
        if let Some(s) = self.sink.take() {
            if self.room >= OUT_HEADER_LEN {
                s(Some(&[&h]))
            } else {
                s(None)
            }
        }
    }

    /// Returns the element without a reply (FORGET, BATCH_FORGET, INTERRUPT).
    pub fn none(mut self) {
        if let Some(s) = self.sink.take() {
            s(None)
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(s) = self.sink.take() {
            let h = self.header(OUT_HEADER_LEN, -libc::EIO);
            if self.room >= OUT_HEADER_LEN {
                s(Some(&[&h]))
            } else {
                s(None)
            }
        }
    }
}

#[cfg(test)]
pub mod collect {
    //! A sink that collects the reply, for tests.
    use super::*;
    use std::sync::mpsc;

    pub fn reply(room: usize) -> (Reply, mpsc::Receiver<Option<Vec<u8>>>) {
        let (tx, rx) = mpsc::channel();
        let r = Reply::new(
            7,
            room,
            Box::new(move |p: Option<&[&[u8]]>| {
                let _ = tx.send(p.map(|p| p.concat()));
            }),
        );
        (r, rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_once_and_a_dropped_reply_answers_eio() {
        let (r, rx) = collect::reply(64);
        r.ok(&[b"abc", b"de"]);
        let v = rx.recv().unwrap().unwrap();
        assert_eq!(v.len(), 21);
        assert_eq!(&v[0..4], &21u32.to_le_bytes());
        assert_eq!(&v[4..8], &0i32.to_le_bytes());
        assert_eq!(&v[8..16], &7u64.to_le_bytes());
        assert_eq!(&v[16..], b"abcde");
        let (r, rx) = collect::reply(64);
        drop(r);
        let v = rx.recv().unwrap().unwrap();
        assert_eq!(&v[4..8], &(-libc::EIO).to_le_bytes());
        let (r, rx) = collect::reply(20);
        r.ok(&[b"too long"]);
        let v = rx.recv().unwrap().unwrap();
        assert_eq!(&v[4..8], &(-libc::EIO).to_le_bytes());
        let (r, rx) = collect::reply(0);
        r.none();
        assert_eq!(rx.recv().unwrap(), None);
    }
}
