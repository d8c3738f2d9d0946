//! `memory:SIZE`: a sparse in-memory disk. Pages (64 KiB) are allocated
//! on first write, freed by trim and zeroing, so memory use stays within
//! SIZE and in practice within what was written.
//!
//! Pages are `Bytes`. A write is copied into its pages, except one that
//! can be *adopted*: its buffer becomes its page without a copy. That is
//! a write of exactly one page (64 KiB, page aligned) whose buffer is the
//! only handle to an allocation that is exactly the buffer (no bytes
//! before or after it: `Bytes::from(vec)` with `len == capacity`, or a
//! `BytesMut` of that capacity frozen, and nobody else holding a slice of
//! it). Anything else (a slice of a larger buffer, a buffer still shared,
//! a partial page, several pages) is copied as before. A write into part
//! of a page writes in place when nobody else holds the page, else into a
//! copy of the page (a reader may still hold a slice of the old one).
//!
//! Memory bound: every page is one 64 KiB allocation of its own, adopted
//! or not, so the pages hold exactly [`MemoryDev::allocated`] bytes.
//! Buffers of several pages are not adopted: their pages would share one
//! allocation, which a later write to one of them would leave pinned by
//! the others (or have to copy out: tried, with 1 MiB writes followed by
//! 128 KiB overwrites that copy cost more than it saved, and the freed
//! buffers doubled the peak RSS). A read inside one page returns a slice
//! of the page without a copy; it keeps that page alive until the reader
//! drops it, which bounds it by the reads in flight. Reads across pages
//! are copied.

use super::{BackendSpec, OptHelp};
use crate::block::extents::ExtentList;
use crate::block::{ready, BlockDev, DevInfo, DevRef, Extent, IoFuture, Reply, Request};
use anyhow::Result;
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const PAGE_SHIFT: u32 = 16;
const PAGE: u64 = 1 << PAGE_SHIFT;
/// Bytes of one page: a write of exactly this many bytes at a multiple of
/// it can be adopted (see the top).
pub const PAGE_BYTES: u64 = PAGE;
const SHARDS: usize = 64;

/// What holes read as.
static ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];

type Page = Bytes;

pub struct MemoryDev {
    size: u64,
    shards: Vec<Mutex<HashMap<u64, Page>>>,
}

/// No options: the positional SIZE is all.
pub const OPTIONS: &[OptHelp] = &[];

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let size = s.size_arg()?;
    Ok(Arc::new(MemoryDev::new(size)))
}

/// `data` as a `Vec` if it is the only handle to an allocation that is
/// exactly its bytes, else `data` back (a copy of it when it is the only
/// handle but its allocation has room before it). Moves no byte: the
/// bytes crate's `Vec::from(BytesMut)` moves the bytes to the start of
/// their allocation, a memmove of every byte even when they are there
/// already (one per adopted page, about 2% of an `ec` server's cycles on
/// 128k writes); converting an emptied buffer moves nothing and shows
/// where the allocation starts.
fn exact(data: Bytes) -> Result<Vec<u8>, Bytes> {
    let n = data.len();
    let mut m = data.try_into_mut()?;
    if m.capacity() != n {
        return Err(m.freeze());
    }
    let p = m.as_ptr() as usize;
    m.clear();
    let mut v: Vec<u8> = m.into();
    let start = v.as_ptr() as usize;
    if start == p && v.capacity() == n {
        // SAFETY: the allocation's first n bytes are the buffer's bytes,
        // written before (initialized) and not moved by the conversion.
        unsafe { v.set_len(n) };
        return Ok(v);
    }
    // The buffer was the last n bytes of a larger allocation (a unique
    // `BytesMut` owns its whole allocation, which `Vec::from` returns).
    assert!(
        p >= start && p + n == start + v.capacity(),
        "memory: a unique buffer outside its own allocation"
    );
    // SAFETY: [p, p + n) is the end of v's allocation (checked above),
    // alive while v is, and holds the buffer's bytes (not moved).
    let b = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
    Err(Bytes::copy_from_slice(b))
}

impl MemoryDev {
    pub fn new(size: u64) -> Self {
        MemoryDev {
            size,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, page: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Page>> {
        // A poisoned shard only means another request panicked mid-copy;
        // the map itself is still consistent.
        self.shards[(page as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `f(page, offset_in_page, range_in_buffer)` for each page piece
    /// of `[off, off+len)`.
    fn pieces(off: u64, len: u64, mut f: impl FnMut(u64, usize, std::ops::Range<usize>)) {
        let mut done = 0u64;
        while done < len {
            let pos = off + done;
            let page = pos >> PAGE_SHIFT;
            let in_page = (pos & (PAGE - 1)) as usize;
            let n = (PAGE - in_page as u64).min(len - done);
            f(page, in_page, done as usize..(done + n) as usize);
            done += n;
        }
    }

    fn read_at(&self, off: u64, len: u32) -> Bytes {
        let at = (off & (PAGE - 1)) as usize;
        if at + len as usize <= PAGE as usize {
            // inside one page: a slice of it, no copy
            let page = off >> PAGE_SHIFT;
            return match self.shard(page).get(&page) {
                Some(p) => p.slice(at..at + len as usize),
                None => Bytes::from_static(&ZEROS[..len as usize]),
            };
        }
        let mut buf = BytesMut::with_capacity(len as usize);
        Self::pieces(off, len as u64, |page, at, r| {
            match self.shard(page).get(&page) {
                Some(p) => buf.extend_from_slice(&p[at..at + r.len()]),
                None => buf.resize(r.end, 0),
            }
        });
        buf.freeze()
    }

    fn write_at(&self, off: u64, data: Bytes) {
        if off & (PAGE - 1) == 0 && data.len() as u64 == PAGE {
            match exact(data) {
                Ok(v) => {
                    let page = off >> PAGE_SHIFT;
                    self.shard(page).insert(page, Bytes::from(v));
                }
                Err(d) => self.copy_in(off, &d),
            }
            return;
        }
        self.copy_in(off, &data)
    }

    /// Copies `data` into the pages at `off`.
    fn copy_in(&self, off: u64, data: &[u8]) {
        Self::pieces(off, data.len() as u64, |page, at, r| {
            let mut s = self.shard(page);
            let src = &data[r];
            match s.get_mut(&page) {
                Some(p) => {
                    let mut m = unshare(p);
                    copy_to_page(&mut m[at..at + src.len()], src);
                    *p = m.freeze();
                }
                None => {
                    let mut m = BytesMut::zeroed(PAGE as usize);
                    copy_to_page(&mut m[at..at + src.len()], src);
                    s.insert(page, m.freeze());
                }
            }
        });
    }

    /// Zeroes a range; whole pages are freed unless `keep` (NO_HOLE).
    fn zero(&self, off: u64, len: u64, keep: bool) {
        Self::pieces(off, len, |page, at, r| {
            let mut s = self.shard(page);
            if r.len() as u64 == PAGE && !keep {
                s.remove(&page);
            } else if let Some(p) = s.get_mut(&page) {
                let mut m = unshare(p);
                m[at..at + r.len()].fill(0);
                *p = m.freeze();
            } else if keep {
                s.insert(page, BytesMut::zeroed(PAGE as usize).freeze());
            }
        });
    }

    fn extents(&self, off: u64, len: u64) -> Vec<Extent> {
        let mut out = ExtentList::new();
        Self::pieces(off, len, |page, _, r| {
            out.push(r.len() as u64, !self.shard(page).contains_key(&page));
        });
        out.into_vec()
    }

    /// Bytes of memory held by pages.
    pub fn allocated(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len() as u64 * PAGE)
            .sum()
    }

    /// Each page's number and bytes (tests: which allocation a page lies
    /// in, from the address of its bytes).
    #[cfg(test)]
    fn pages(&self) -> Vec<(u64, Bytes)> {
        let mut v: Vec<(u64, Bytes)> = Vec::new();
        for s in &self.shards {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            v.extend(s.iter().map(|(n, p)| (*n, p.clone())));
        }
        v
    }
}

/// Page `p`'s bytes, writable: its own buffer taken out when nobody else
/// holds it, else a copy. The caller puts them back with `freeze`.
fn unshare(p: &mut Page) -> BytesMut {
    match std::mem::take(p).try_into_mut() {
        Ok(m) => m,
        Err(b) => {
            *p = b;
            BytesMut::from(&p[..])
        }
    }
}

impl BlockDev for MemoryDev {
    fn info(&self) -> DevInfo {
        DevInfo::full(self.size)
    }

    fn submit(&self, req: Request) -> IoFuture {
        if let Err(e) = req.check_range(self.size) {
            return ready(Err(e));
        }
        ready(Ok(match req {
            Request::Read { offset, len } => Reply::Data(self.read_at(offset, len)),
            Request::Write { offset, data, .. } => {
                let n = data.len() as u64;
                self.write_at(offset, data);
                Reply::Done(n)
            }
            Request::Trim { offset, len, .. } => {
                self.zero(offset, len as u64, false);
                Reply::Done(0)
            }
            Request::WriteZeroes { offset, len, flags } => {
                self.zero(offset, len as u64, flags.no_hole);
                Reply::Done(0)
            }
            Request::BlockStatus { offset, len } => {
                Reply::Extents(self.extents(offset, len as u64))
            }
            Request::Flush | Request::Cache { .. } => Reply::Done(0),
        }))
    }

    fn name(&self) -> String {
        "memory".into()
    }
}

/// Pieces at least this long are copied into a page with streaming
/// stores (see [`copy_to_page`]).
#[cfg(target_arch = "x86_64")]
const STREAM_MIN: usize = 256;

/// Copies a write's payload into its page (also used by the `ec` backend
/// to fill the page-sized chunks it hands to `memory:` children). The page is cold (a random
/// offset in a large export), and a plain copy first reads every cache
/// line it is about to overwrite; on x86_64 pieces of [`STREAM_MIN`]
/// bytes or more are written with non-temporal 16-byte stores instead,
/// which skip that read (perf, 4k randwrite QD32: the copy was the
/// largest item of the server's profile, 20% of its samples; a 4 KiB copy
/// into random places of 256 MiB took about 1.45x less time this way on
/// the development VM). The fence at the end orders those stores before
/// the shard lock is released, so that any later reader sees them.
pub(crate) fn copy_to_page(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= STREAM_MIN {
        // SAFETY: both slices are valid for `len` bytes and do not overlap
        // (a page is never the payload's own buffer); SSE2 is part of
        // x86_64's baseline.
        unsafe { stream_copy(dst.as_mut_ptr(), src.as_ptr(), dst.len()) };
        return;
    }
    dst.copy_from_slice(src);
}

/// `len` bytes from `s` to `d`: plain copies up to `d`'s first 16-byte
/// boundary and after its last, non-temporal stores between, then a
/// store fence.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(d: *mut u8, s: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = ((d as usize).wrapping_neg() & 15).min(len);
    // SAFETY (whole body): every offset stays below `len`, and the
    // streamed stores' addresses are 16-byte aligned (after `head`).
    unsafe {
        std::ptr::copy_nonoverlapping(s, d, head);
        let mut i = head;
        while i + 16 <= len {
            let v = _mm_loadu_si128(s.add(i) as *const __m128i);
            _mm_stream_si128(d.add(i) as *mut __m128i, v);
            i += 16;
        }
        std::ptr::copy_nonoverlapping(s.add(i), d.add(i), len - i);
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{BlockDevExt, Errno, Flags};

    #[test]
    fn copy_to_page_matches_a_plain_copy_at_every_alignment() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 253) as u8 + 1).collect();
        for len in [0, 1, 15, 16, 17, 255, 256, 257, 300, 4096, 4099] {
            for off in 0..17 {
                for soff in [0, 1, 5] {
                    let mut page = vec![0u8; 5200];
                    copy_to_page(&mut page[off..off + len], &src[soff..soff + len]);
                    assert_eq!(
                        &page[off..off + len],
                        &src[soff..soff + len],
                        "len {len} off {off}"
                    );
                    assert!(
                        page[..off].iter().all(|&b| b == 0),
                        "before, len {len} off {off}"
                    );
                    assert!(
                        page[off + len..].iter().all(|&b| b == 0),
                        "after, len {len} off {off}"
                    );
                }
            }
        }
    }

    /// Writes `data` at `off` and checks the reply.
    async fn put(d: &MemoryDev, off: u64, data: Bytes) {
        let n = data.len() as u64;
        let r = d
            .submit(Request::Write {
                offset: off,
                data,
                flags: Flags::NONE,
            })
            .await;
        assert_eq!(r, Ok(Reply::Done(n)));
    }

    /// Bytes no other seed's pattern repeats at any offset (splitmix64).
    fn pattern(len: usize, seed: u32) -> Vec<u8> {
        let mut x = u64::from(seed) << 32;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let n = (len - out.len()).min(8);
            out.extend_from_slice(&z.to_le_bytes()[..n]);
        }
        out
    }

    /// Pages (of `pages`, from [`MemoryDev::pages`]) whose bytes lie in
    /// `[a, a + len)` and hold what that buffer held there (`seed`: its
    /// pattern), so that a page that merely got memory the allocator
    /// reused after that buffer was freed is not counted.
    fn owned_by(pages: &[(u64, Bytes)], a: usize, len: usize, seed: u32) -> Vec<u64> {
        let near: Vec<&(u64, Bytes)> = pages
            .iter()
            .filter(|(_, b)| {
                let at = (b.as_ptr() as usize).wrapping_sub(a);
                at < len && at + b.len() <= len
            })
            .collect();
        if near.is_empty() {
            return Vec::new();
        }
        let want = pattern(len, seed);
        let mut v: Vec<u64> = near
            .into_iter()
            .filter(|(_, b)| {
                let at = b.as_ptr() as usize - a;
                b[..] == want[at..at + b.len()]
            })
            .map(|(n, _)| *n)
            .collect();
        v.sort();
        v
    }

    fn pages_in(d: &MemoryDev, a: usize, len: usize, seed: u32) -> Vec<u64> {
        owned_by(&d.pages(), a, len, seed)
    }

    #[tokio::test]
    async fn exact_whole_page_buffers_are_adopted_others_copied() {
        let d = MemoryDev::new(64 * PAGE);
        let p = PAGE as usize;
        // exact and unique but 3 pages: copied (its pages would share one
        // allocation)
        let v = pattern(3 * p, 1);
        let mine = v.clone();
        let a = mine.as_ptr() as usize;
        put(&d, 2 * PAGE, Bytes::from(mine)).await;
        assert!(pages_in(&d, a, 3 * p, 1).is_empty());
        assert_eq!(&d.read(2 * PAGE, 3 * p as u32).await.unwrap()[..], &v[..]);
        // one page, exact: adopted
        let one = pattern(p, 2);
        let a1 = one.as_ptr() as usize;
        put(&d, 10 * PAGE, Bytes::from(one)).await;
        assert_eq!(pages_in(&d, a1, p, 2), vec![10]);
        // a slice of a larger buffer, a buffer still shared, an unaligned
        // offset, a partial page: copied
        let big = Bytes::from(pattern(4 * p, 3));
        let ab = big.as_ptr() as usize;
        put(&d, 20 * PAGE, big.slice(p..2 * p)).await;
        put(&d, 21 * PAGE, big.clone()).await;
        assert!(pages_in(&d, ab, 4 * p, 3).is_empty());
        let un = pattern(p, 4);
        let au = un.as_ptr() as usize;
        put(&d, 30 * PAGE + 4096, Bytes::from(un.clone())).await;
        let half = pattern(p / 2, 5);
        let ah = half.as_ptr() as usize;
        put(&d, 40 * PAGE, Bytes::from(half.clone())).await;
        assert!(pages_in(&d, au, p, 4).is_empty() && pages_in(&d, ah, p / 2, 5).is_empty());
        assert_eq!(
            &d.read(21 * PAGE, 4 * p as u32).await.unwrap()[..],
            &big[..]
        );
        assert_eq!(
            &d.read(20 * PAGE, p as u32).await.unwrap()[..],
            &big[p..2 * p]
        );
        assert_eq!(
            &d.read(30 * PAGE + 4096, p as u32).await.unwrap()[..],
            &un[..]
        );
        assert_eq!(
            &d.read(40 * PAGE, p as u32 / 2).await.unwrap()[..],
            &half[..]
        );
        // the last page of a larger allocation, its only handle (the
        // head dropped): copied, not adopted (it would pin the head)
        let tail = Bytes::from(pattern(2 * p, 7)).slice(p..2 * p);
        assert!(tail.is_unique());
        let at = tail.as_ptr() as usize;
        let want = tail.to_vec();
        put(&d, 60 * PAGE, tail).await;
        assert!(d.pages().iter().all(|(_, b)| b.as_ptr() as usize != at));
        assert_eq!(&d.read(60 * PAGE, p as u32).await.unwrap()[..], &want[..]);
        // a buffer with spare capacity is not exact
        let mut spare = Vec::with_capacity(2 * p);
        spare.extend_from_slice(&pattern(p, 6));
        let asp = spare.as_ptr() as usize;
        put(&d, 50 * PAGE, Bytes::from(spare)).await;
        assert!(pages_in(&d, asp, p, 6).is_empty());
        // a partial write into an adopted page nobody else holds: in place
        put(&d, 10 * PAGE + 512, Bytes::from(vec![9u8; 1024])).await;
        assert_eq!(pages_in(&d, a1, p, 2), Vec::<u64>::new(), "content changed");
        let pg = d.pages().into_iter().find(|(n, _)| *n == 10).unwrap().1;
        assert_eq!(pg.as_ptr() as usize, a1, "copied, not written in place");
        assert!(pg[512..1536].iter().all(|&b| b == 9));
    }

    #[tokio::test]
    async fn a_reader_keeps_its_bytes_while_the_page_is_rewritten() {
        let d = MemoryDev::new(4 * PAGE);
        let v = pattern(PAGE as usize, 7);
        put(&d, 0, Bytes::from(v.clone())).await;
        let r = d.read(4096, 8192).await.unwrap();
        put(&d, 4096, Bytes::from(vec![0xee; 4096])).await;
        assert_eq!(&r[..], &v[4096..4096 + 8192], "the reader's slice changed");
        let now = d.read(0, PAGE as u32).await.unwrap();
        assert!(now[4096..8192].iter().all(|&b| b == 0xee));
        assert_eq!(&now[8192..], &v[8192..]);
        // a hole reads as zeroes without a page
        assert!(d.read(PAGE, 100).await.unwrap().iter().all(|&b| b == 0));
        assert_eq!(d.allocated(), PAGE);
    }

    /// Exact 16-page buffers, then random exact whole-page writes (one
    /// page: adopted; two or three: not), partial-page writes, trims and
    /// zeroings over them. After every request: no buffer is kept alive
    /// by fewer pages than it has (found from the pages' addresses and
    /// contents, not from the backend's own bookkeeping), so the memory
    /// held is exactly the pages; at the end the contents match a model.
    #[tokio::test]
    async fn overwritten_adopted_buffers_pin_nothing() {
        const N: u64 = 64;
        let p = PAGE as usize;
        let d = MemoryDev::new(N * PAGE);
        let mut model = vec![0u8; (N * PAGE) as usize];
        // adopted buffers: address, length, pattern seed
        let mut bufs: Vec<(usize, usize, u32)> = Vec::new();
        for g in 0..N / 16 {
            let v = pattern(16 * p, g as u32 + 1000);
            bufs.push((v.as_ptr() as usize, v.len(), g as u32 + 1000));
            model[(g * 16 * PAGE) as usize..][..v.len()].copy_from_slice(&v);
            put(&d, g * 16 * PAGE, Bytes::from(v)).await;
        }
        let mut x: u64 = 12345;
        let mut rnd = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        for step in 0..300u32 {
            let page = rnd(N);
            match rnd(5) {
                0 | 1 => {
                    // whole pages (1-3), exact: one page adopted, more copied
                    let n = (1 + rnd(3)).min(N - page) as usize;
                    let v = pattern(n * p, step);
                    bufs.push((v.as_ptr() as usize, v.len(), step));
                    model[(page * PAGE) as usize..][..v.len()].copy_from_slice(&v);
                    put(&d, page * PAGE, Bytes::from(v)).await;
                }
                2 => {
                    let at = page * PAGE + rnd(PAGE / 512) * 512;
                    let len = (512 * (1 + rnd(300))).min(N * PAGE - at) as usize;
                    let v = pattern(len, step);
                    model[at as usize..][..len].copy_from_slice(&v);
                    put(&d, at, Bytes::from(v)).await;
                }
                3 => {
                    let len = ((1 + rnd(2)) * PAGE).min((N - page) * PAGE);
                    model[(page * PAGE) as usize..][..len as usize].fill(0);
                    let r = d
                        .submit(Request::Trim {
                            offset: page * PAGE,
                            len: len as u32,
                            flags: Flags::NONE,
                        })
                        .await;
                    assert_eq!(r, Ok(Reply::Done(0)));
                }
                _ => {
                    let at = page * PAGE + 4096;
                    model[at as usize..][..4096].fill(0);
                    let r = d
                        .submit(Request::WriteZeroes {
                            offset: at,
                            len: 4096,
                            flags: Flags::NONE,
                        })
                        .await;
                    assert_eq!(r, Ok(Reply::Done(0)));
                }
            }
            // every adopted buffer still referenced is referenced by all
            // of its pages
            let pages = d.pages();
            for &(a, len, seed) in &bufs {
                let n = owned_by(&pages, a, len, seed).len();
                assert!(
                    n == 0 || n * p == len,
                    "step {step}: {n} pages keep a {len}-byte buffer alive"
                );
            }
            drop(pages);
        }
        let all = d.read(0, (N * PAGE) as u32).await.unwrap();
        assert!(all[..] == model[..], "contents differ from the model");
        assert!(
            bufs.iter()
                .any(|&(a, len, seed)| !pages_in(&d, a, len, seed).is_empty()),
            "nothing adopted: the test tests nothing"
        );
    }

    #[tokio::test]
    async fn write_read_trim_across_pages() {
        let d = MemoryDev::new(1 << 20);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        d.write(1000, Bytes::from(data.clone()), Flags::NONE)
            .await
            .unwrap();
        let got = d.read(1000, data.len() as u32).await.unwrap();
        assert_eq!(&got[..], &data[..]);
        assert_eq!(d.allocated(), 4 * PAGE);
        d.submit(Request::Trim {
            offset: 0,
            len: 1 << 20,
            flags: Flags::NONE,
        })
        .await
        .unwrap();
        assert_eq!(d.allocated(), 0);
        let got = d.read(1000, 10).await.unwrap();
        assert!(got.iter().all(|&b| b == 0));
        let e = d
            .submit(Request::Read {
                offset: (1 << 20) - 1,
                len: 2,
            })
            .await;
        assert_eq!(e, Err(Errno::EINVAL));
    }
}
