//! Runs of consecutive whole stripes, written as one update.
//!
//! Chunk i of stripe s lies at `data_base + s * chunk` on child i, so the
//! chunks of consecutive stripes are consecutive on every child: a run of
//! n whole stripes is one write of n chunks per child instead of n writes
//! (one system call and one thread hand-off per child for file children,
//! not n). The data chunks are gathered into one buffer per child in the
//! encode pass (encode.rs), while each tile is in cache; the parity is
//! encoded straight into one buffer per parity child. Children whose
//! requests cost little (`memory:`) take one write per chunk instead, from
//! the requests' own buffers, so nothing is copied for them.
//!
//! Runs come from a write covering whole stripes, and from the
//! background writers of the write-back buffer (wb.rs), which take the
//! lowest ready stripe and the ready whole stripes after it. A run holds
//! the first stripe's lock (awaited) and the next stripes' locks taken
//! only if free at once (`try_write`), so a run never waits for one lock
//! while holding another. At most `run` stripes a run (option, default 16).
//!
//! Crash safety is that of the single-stripe update (write.rs): with the
//! bitmap, every stripe's region bit is on disk before anything is
//! written in place and stays set until the update ends; the crcs are set
//! in memory and their table pages marked (meta.rs). With the journal (a
//! child failed or being rebuilt, `consistency=journal`) or `device=gpu`
//! the stripes of a run are updated one by one (concurrently), each
//! through its journal slot.

use super::encode::{encode_tiles, recycle};
use super::join::{join_all, Fut};
use super::layout::BLOCK;
use super::wb::{covers, Piece};
use super::Inner;
use crate::block::Errno;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Whether `pieces` cover every column of every data chunk.
fn whole(pieces: &[Piece], k: usize, chunk: u64) -> bool {
    (0..k).all(|c| covers(pieces, c, 0, chunk))
}

/// Data chunk `c` of a whole stripe: a piece's own bytes when one covers
/// it exactly, else the pieces laid over each other in order.
fn chunk_of(pieces: &[Piece], c: usize, chunk: u64) -> Bytes {
    let mut mine = pieces.iter().filter(|p| p.0 == c);
    if let (Some(p), None) = (mine.next(), mine.next()) {
        if p.1 == 0 && p.2.len() as u64 == chunk {
            return p.2.clone();
        }
    }
    let mut b = BytesMut::zeroed(chunk as usize);
    for p in pieces.iter().filter(|p| p.0 == c) {
        b[p.1 as usize..p.1 as usize + p.2.len()].copy_from_slice(&p.2);
    }
    b.freeze()
}

impl Inner {
    /// A background writer of the write-back buffer: writes ready stripes
    /// (the lowest first, with the ready whole stripes after it as one
    /// run) until none is ready.
    pub async fn background_writer(self: Arc<Self>) {
        while let Some((s, whole)) = self.wb.next_ready() {
            let r = if whole {
                self.write_run(s, Vec::new()).await
            } else {
                self.write_stripe(s, Vec::new()).await
            };
            if let Err(e) = r {
                tracing::warn!("ec: writing buffered stripe {s}: {e:?}");
            }
        }
    }

    /// Writes whole stripes from `first`: `news[i]` are the new pieces of
    /// stripe `first + i` (each a whole stripe). With `news` empty, the
    /// stripes are the write-back buffer's: `first` (claimed by a
    /// background writer) and the ready whole stripes after it.
    pub async fn write_run(&self, first: u64, news: Vec<Vec<Piece>>) -> Result<(), Errno> {
        let from_wb = news.is_empty();
        let total = news.len().max(1);
        let mut news = news.into_iter();
        let slots = self.geo.slots;
        let mut s = first;
        let mut done = 0;
        let mut res = Ok(());
        while done < total {
            let mut guards = vec![self.locks[(s % slots) as usize].write().await];
            let mut got: Vec<(Vec<Piece>, bool)> = Vec::new();
            loop {
                let t = s + got.len() as u64;
                if !got.is_empty() {
                    let more = if from_wb {
                        got.len() < self.run_max
                    } else {
                        done + got.len() < total && got.len() < self.run_max
                    };
                    if !more {
                        break;
                    }
                    let Ok(g) = self.locks[(t % slots) as usize].try_write() else {
                        break;
                    };
                    if from_wb && !self.wb.claim_whole(t) {
                        break;
                    }
                    guards.push(g);
                }
                let mut p = self.wb.take(t, t % slots);
                let buffered = !p.is_empty();
                p.extend(news.next().unwrap_or_default());
                got.push((p, buffered));
            }
            let pieces: Vec<Vec<Piece>> = got.iter().map(|g| g.0.clone()).collect();
            let r = self.update_run(s, &pieces).await;
            for (i, (_, buffered)) in got.iter().enumerate() {
                if *buffered {
                    self.wb.written((s + i as u64) % slots);
                }
            }
            drop(guards);
            if res.is_ok() {
                res = r;
            }
            let n = got.len() as u64;
            s += n;
            done += n as usize;
            if from_wb {
                break;
            }
        }
        res
    }

    /// Updates stripes `first..` (their locks held): runs of whole ones
    /// at once, the others (a stripe another writer emptied, or not
    /// whole) one by one.
    async fn update_run(&self, first: u64, stripes: &[Vec<Piece>]) -> Result<(), Errno> {
        let (k, chunk, slots) = (self.geo.k, self.geo.chunk, self.geo.slots);
        let batch = self.gpu.is_none() && !self.use_journal();
        let mut futs: Vec<Fut<'_, Result<(), Errno>>> = Vec::new();
        let mut i = 0;
        while i < stripes.len() {
            let mut j = i;
            while batch && j < stripes.len() && whole(&stripes[j], k, chunk) {
                j += 1;
            }
            // one whole stripe alone is an update of its own (its data
            // written from the requests' buffers, no gathering copy),
            // unless children adopt pages: they take it as a run of one
            if j - i >= 2 || (j - i == 1 && self.children.iter().any(|c| c.adopt)) {
                futs.push(Box::pin(
                    self.update_whole(first + i as u64, &stripes[i..j]),
                ));
                i = j;
                continue;
            }
            let s = first + i as u64;
            if !stripes[i].is_empty() {
                futs.push(Box::pin(self.update(s, s % slots, &stripes[i])));
            }
            i += 1;
        }
        join_all(futs).await.into_iter().collect()
    }

    /// One update of consecutive whole stripes from `first`, with the
    /// bitmap (the caller checked): encode, bits on disk, one write per
    /// child (or one per chunk for children that take no gathered
    /// buffer), crcs in memory. Children that adopt (`Child::adopt`) get
    /// each chunk as a page-sized buffer of its own, filled in the encode
    /// pass, and their old pages come back into the pool.
    async fn update_whole(&self, first: u64, stripes: &[Vec<Piece>]) -> Result<(), Errno> {
        let (k, m, chunk) = (self.geo.k, self.geo.m, self.geo.chunk as usize);
        let n = stripes.len();
        let data: Vec<Vec<Bytes>> = stripes
            .iter()
            .map(|p| (0..k).map(|c| chunk_of(p, c, chunk as u64)).collect())
            .collect();
        let parts: Vec<usize> = (0..k + m).filter(|&c| self.writable(c)).collect();
        let bpc = chunk / BLOCK as usize;
        let mut sums: Vec<Vec<u32>> = parts.iter().map(|_| Vec::with_capacity(n * bpc)).collect();
        // the pages the adopting children hold now, taken back once replaced
        let mut old: Vec<Bytes> = Vec::new();
        for &c in parts.iter().filter(|&&c| self.children[c].adopt) {
            for i in 0..n as u64 {
                let at = self.geo.chunk_off(first + i);
                old.push(self.child_read(c, at, chunk as u64).await?);
            }
        }
        // each child's new bytes: pages of its own (adopting children),
        // one buffer of the run (parity; data of gathering children), or
        // none (data written from the requests' buffers)
        let mut bufs: Vec<Buf> = (0..k + m)
            .map(|c| {
                if self.children[c].adopt && self.writable(c) {
                    Buf::Pages((0..n).map(|_| self.pool.page(chunk)).collect())
                } else if c >= k || (self.children[c].gather && self.writable(c)) {
                    Buf::Run(self.pool.get(n * chunk))
                } else {
                    Buf::None
                }
            })
            .collect();
        // (the per-stripe lists reuse one allocation each: encode::recycle)
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(k);
        let mut outs_at: Vec<&mut [u8]> = Vec::with_capacity(m);
        let mut copy_at: Vec<Option<&mut [u8]>> = Vec::with_capacity(k);
        for (i, d) in data.iter().enumerate() {
            srcs.clear();
            srcs.extend(d.iter().map(|b| &b[..]));
            let (dbufs, pbufs) = bufs.split_at_mut(k);
            let mut outs: Vec<&mut [u8]> = recycle(std::mem::take(&mut outs_at));
            outs.extend(
                pbufs
                    .iter_mut()
                    .map(|b| b.stripe(i, chunk).expect("parity has a buffer")),
            );
            let mut copy: Vec<Option<&mut [u8]>> = recycle(std::mem::take(&mut copy_at));
            copy.extend(dbufs.iter_mut().map(|b| b.stripe(i, chunk)));
            encode_tiles(self, &srcs, &mut outs, &parts, &mut sums, &mut copy)?;
            outs_at = recycle(outs);
            copy_at = recycle(copy);
        }
        let mut writes: Vec<Vec<Bytes>> = bufs
            .into_iter()
            .enumerate()
            .map(|(c, b)| match b {
                Buf::Pages(p) => p.into_iter().map(Bytes::from).collect(),
                Buf::Run(v) => {
                    let b = self.pool.lend(v);
                    if self.children[c].gather {
                        vec![b]
                    } else {
                        (0..n)
                            .map(|i| b.slice(i * chunk..(i + 1) * chunk))
                            .collect()
                    }
                }
                Buf::None => data.iter().map(|d| d[c].clone()).collect(),
            })
            .collect();
        for i in 0..n as u64 {
            self.intent_begin(first + i).await;
        }
        // every child's writes at once (io.rs: file children from a few
        // threads), then the crcs of the children whose writes all landed
        let mut all = Vec::new();
        let mut of = Vec::new();
        for (i, &c) in parts.iter().enumerate() {
            let mut at = self.geo.chunk_off(first);
            for b in std::mem::take(&mut writes[c]) {
                let len = b.len() as u64;
                all.push((c, at, b));
                of.push(i);
                at += len;
            }
        }
        let mut ok = vec![true; parts.len()];
        for (i, r) in of.into_iter().zip(self.child_writes(all).await) {
            ok[i] &= r.is_ok();
        }
        let futs: Vec<Fut<'_, ()>> = parts
            .iter()
            .zip(&sums)
            .zip(ok)
            .filter(|(_, ok)| *ok)
            .map(|((&c, sum), _)| Box::pin(self.defer_meta(c, first, 0, sum)) as Fut<'_, ()>)
            .collect();
        join_all(futs).await;
        for i in 0..n as u64 {
            self.intent_end(first + i);
        }
        for b in old {
            self.pool.reclaim(b, chunk);
        }
        self.metrics
            .stripe_writes
            .fetch_add(n as u64, Ordering::Relaxed);
        self.check_alive()
    }
}

/// What one child of a run is written from.
enum Buf {
    /// A buffer per stripe, each exactly one chunk (adopting children).
    Pages(Vec<BytesMut>),
    /// One buffer of the run's n chunks.
    Run(Vec<u8>),
    /// The requests' own buffers (data chunks, no copy).
    None,
}

impl Buf {
    /// Stripe `i`'s chunk in this buffer, if it has one.
    fn stripe(&mut self, i: usize, chunk: usize) -> Option<&mut [u8]> {
        match self {
            Buf::Pages(p) => Some(&mut p[i][..]),
            Buf::Run(v) => Some(&mut v[i * chunk..(i + 1) * chunk]),
            Buf::None => None,
        }
    }
}
