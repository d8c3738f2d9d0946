//! Reused parity buffers.
//!
//! Every stripe update encodes its parity into m fresh buffers (a run of n
//! whole stripes: m buffers of n chunks). Allocating them per update costs
//! a zeroing pass over every parity byte (the encoder overwrites them
//! anyway) and, for buffers of a MiB or more, the allocator's mmap/munmap
//! and a page fault per 4 KiB. The pool keeps buffers that the children
//! are done with (a child drops the `Bytes` once its write is done) and
//! hands them out again: their old bytes are overwritten by the encoder,
//! so they are never zeroed again.
//!
//! Budget: at most `bytes` (option `pool`, default 16 MiB) of free buffers
//! are kept; a buffer returned beyond that is freed. Buffers in use are
//! bounded by the updates in flight (see docs/ec-device.md, Memory).

use bytes::{Bytes, BytesMut};
use std::sync::{Arc, Mutex};

pub struct Pool {
    free: Mutex<Free>,
    /// Most bytes of free buffers kept (`pool`); 0: no reuse.
    budget: usize,
}

#[derive(Default)]
struct Free {
    bufs: Vec<Vec<u8>>,
    /// Pages (`memory:` children's old pages, each exactly one chunk),
    /// kept as they came back: turning one into a `Vec` would move its
    /// bytes (the bytes crate's `Vec::from` copies them to the start of
    /// the allocation even when they are there: a 64 KiB memmove a page).
    pages: Vec<BytesMut>,
    bytes: usize,
}

/// A buffer lent to a `Bytes`; it goes back to the pool when the last
/// `Bytes` over it is dropped.
struct Lent {
    buf: Vec<u8>,
    pool: Arc<Pool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.put(std::mem::take(&mut self.buf));
    }
}

impl Pool {
    pub fn new(budget: usize) -> Arc<Pool> {
        Arc::new(Pool {
            free: Mutex::new(Free::default()),
            budget,
        })
    }

    fn st(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A free buffer with room for `len` bytes, taken out of the pool:
    /// the smallest one already `len` long (it needs no fill to reach
    /// `len`), else the smallest one with the capacity. `None` when none
    /// holds `len` (or nothing is kept).
    fn take(&self, len: usize) -> Option<Vec<u8>> {
        if len == 0 || self.budget == 0 {
            return None;
        }
        let mut st = self.st();
        let i = st
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| (b.len() < len, b.capacity()))
            .map(|(i, _)| i)?;
        let b = st.bufs.swap_remove(i);
        st.bytes -= b.capacity();
        Some(b)
    }

    /// A buffer of `len` bytes whose contents are unspecified (old bytes
    /// of an earlier update, or zeroes): for outputs that are overwritten
    /// whole. A free buffer is reused where one holds `len`, else a new
    /// one is allocated.
    pub fn get(&self, len: usize) -> Vec<u8> {
        match self.take(len) {
            Some(mut b) => {
                if b.len() >= len {
                    b.truncate(len);
                } else {
                    b.resize(len, 0);
                }
                b
            }
            None => vec![0u8; len],
        }
    }

    /// An empty buffer with room for `cap` bytes: for outputs filled by
    /// appending (no bytes written before they are).
    pub fn get_empty(&self, cap: usize) -> Vec<u8> {
        match self.take(cap) {
            Some(mut b) => {
                b.clear();
                b
            }
            None => Vec::with_capacity(cap),
        }
    }

    /// A buffer of exactly `len` bytes (capacity too) whose contents are
    /// unspecified: for a chunk that a `memory:` child keeps as its page
    /// (it adopts only a buffer that is exactly its allocation). One
    /// reclaimed from a child's old page where one is kept, else a new
    /// zeroed one.
    pub fn page(&self, len: usize) -> BytesMut {
        if len > 0 && self.budget > 0 {
            let mut st = self.st();
            if let Some(b) = st.pages.pop() {
                st.bytes -= b.capacity();
                if b.len() == len && b.capacity() == len {
                    return b;
                }
            }
        }
        BytesMut::zeroed(len)
    }

    /// Keeps `b` (a `memory:` child's old page, read before it was
    /// replaced) if nothing else holds it any more and it is exactly
    /// `len` bytes with no room beyond them, within the budget; else
    /// drops it. No byte is moved.
    pub fn reclaim(&self, b: Bytes, len: usize) {
        if b.len() != len {
            return;
        }
        let Ok(m) = b.try_into_mut() else {
            return;
        };
        if m.capacity() != len {
            return;
        }
        let mut st = self.st();
        if st.bytes + len <= self.budget {
            st.bytes += len;
            st.pages.push(m);
        }
    }

    /// `buf` as `Bytes`; the buffer comes back here when they are dropped.
    pub fn lend(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        if self.budget == 0 {
            return Bytes::from(buf);
        }
        Bytes::from_owner(Lent {
            buf,
            pool: self.clone(),
        })
    }

    /// Keeps `buf` for reuse if the budget has room, else frees it.
    fn put(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap == 0 {
            return;
        }
        let mut st = self.st();
        if st.bytes + cap <= self.budget {
            st.bytes += cap;
            st.bufs.push(buf);
        }
    }

    /// The addresses of the free buffers and pages held.
    #[cfg(test)]
    pub fn addrs(&self) -> Vec<usize> {
        let st = self.st();
        let bufs = st.bufs.iter().map(|b| b.as_ptr() as usize);
        bufs.chain(st.pages.iter().map(|b| b.as_ptr() as usize))
            .collect()
    }

    /// Bytes of free buffers held.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.st().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_within_the_budget() {
        let p = Pool::new(3 << 20);
        let mut a = p.get(1 << 20);
        a[0] = 7;
        let ptr = a.as_ptr();
        let b = p.lend(a);
        let c = b.slice(0..10);
        drop(b);
        assert_eq!(p.held(), 0, "a slice still holds it");
        assert_eq!(c[0], 7);
        drop(c);
        assert_eq!(p.held(), 1 << 20);
        // reused: the same memory, shortened, old bytes kept
        let a = p.get(64 << 10);
        assert_eq!(a.as_ptr(), ptr);
        assert_eq!(a.len(), 64 << 10);
        assert_eq!(a[0], 7);
        assert_eq!(p.held(), 0);
        // beyond the budget a returned buffer is freed
        let big: Vec<Bytes> = (0..4).map(|_| p.lend(p.get(1 << 20))).collect();
        drop(big);
        assert_eq!(p.held(), 3 << 20);
        drop(p.lend(a));
        assert_eq!(p.held(), 3 << 20, "over the budget: freed");
        // a longer request than any free buffer holds: a new one
        assert_eq!(p.get(2 << 20).len(), 2 << 20);
        // an empty buffer for appending reuses the memory too
        let e = p.get_empty(1 << 20);
        assert!(e.is_empty() && e.capacity() >= 1 << 20);
        assert_eq!(p.held(), 2 << 20);
        drop(p.lend(e));
        // budget 0: nothing kept
        let z = Pool::new(0);
        drop(z.lend(z.get(4096)));
        assert_eq!(z.held(), 0);
    }
}
