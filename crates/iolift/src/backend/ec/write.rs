//! Writes: one stripe update at a time per stripe.
//!
//! A write is cut into stripes. A piece of a stripe that is not the whole
//! stripe, 4 KiB aligned and not FUA, goes to the write-back stripe
//! buffer (wb.rs) and is acknowledged there; the buffer writes a stripe
//! when it is complete, when the budget needs room, at a flush or after a
//! short idle, and before a read of it. Everything else is written now.
//!
//! For each stripe update, under the stripe's exclusive lock:
//! 1. the buffered pieces of the stripe are taken and the new ones laid
//!    over them; the column range `[lo, hi)` they cover (rounded out to the
//!    unit);
//! 2. the old columns of every data chunk the pieces do not cover whole
//!    (decoded if need be), overlaid with the new bytes, encoded: m parity
//!    column ranges (read-modify-write; a full-stripe write reads nothing);
//! 3. with the bitmap (no child failed or being rebuilt,
//!    `consistency=bitmap`): the region's bit is on disk (bitmap.rs);
//!    with the journal: each taking part child (changed data chunks and
//!    every parity chunk) gets header + new columns in its journal slot
//!    `s % slots`; all of them complete before step 4;
//! 4. in place: the same columns at the chunk, their crcs in the table
//!    (with the bitmap, in memory; the table pages are written at the
//!    next flush, meta.rs).
//!
//! A stripe the buffer completes is written by a background writer on a
//! thread of the blocking pool (at most `wb_bg` of them), so that the
//! request's thread goes on receiving; a flush waits for those writes.
//! Consecutive whole stripes, from one request or ready in the buffer,
//! are written as one update with one write per child (run.rs).
//!
//! After a crash an update whose journal entries are all there is
//! written again (journal.rs); one whose entries are not all there never
//! reached step 4, so the stripe is old. A bitmap region that was dirty
//! is resynced (bitmap.rs). See docs/ec-device.md.

use super::join::{join_all, Fut};
use super::layout::{JHeader, BLOCK};
use super::wb::{covers, Piece, Put};
use super::Inner;
use crate::block::Errno;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Bytes zeroed per stripe-write round by write-zeroes.
const ZERO_PIECE: u64 = 8 << 20;

impl Inner {
    /// A write of `data` at `off`; with `fua`, stable when it completes.
    pub async fn write(self: &Arc<Self>, off: u64, data: Bytes, fua: bool) -> Result<(), Errno> {
        self.check_alive()?;
        let pieces = self.pieces(off, data.len() as u64);
        let sb = self.geo.stripe_bytes();
        // inside one stripe (a 128k write of a 256K stripe): that stripe's
        // write awaited here, without the lists and boxed futures below
        if let (Some(a), Some(z)) = (pieces.first(), pieces.last()) {
            if a.0 == z.0 {
                let s = a.0;
                let p: Vec<Piece> = pieces
                    .into_iter()
                    .map(|(_, c, lo, hi, at)| (c, lo, data.slice(at..at + (hi - lo) as usize)))
                    .collect();
                let whole = p.iter().map(|x| x.2.len() as u64).sum::<u64>() == sb;
                let aligned = p
                    .iter()
                    .all(|x| x.1.is_multiple_of(BLOCK) && (x.2.len() as u64).is_multiple_of(BLOCK));
                if whole {
                    self.write_run(s, vec![p]).await?;
                } else if !fua && aligned && self.wb.enabled() {
                    self.write_buffered(s, p).await?;
                } else {
                    self.write_stripe(s, p).await?;
                }
                if fua {
                    self.flush().await?;
                }
                return Ok(());
            }
        }
        let mut stripes: Vec<(u64, Vec<Piece>)> = Vec::new();
        for (s, c, lo, hi, at) in pieces {
            let b = data.slice(at..at + (hi - lo) as usize);
            match stripes.last_mut() {
                Some((ls, v)) if *ls == s => v.push((c, lo, b)),
                _ => stripes.push((s, vec![(c, lo, b)])),
            }
        }
        let mut futs: Vec<Fut<'_, Result<(), Errno>>> = Vec::new();
        // consecutive whole stripes: one run (one child write per child)
        let mut run: Vec<Vec<Piece>> = Vec::new();
        let mut run_at = 0;
        for (s, p) in stripes {
            let whole = p.iter().map(|x| x.2.len() as u64).sum::<u64>() == sb;
            if whole {
                if run.is_empty() {
                    run_at = s;
                }
                run.push(p);
                continue;
            }
            if !run.is_empty() {
                futs.push(Box::pin(self.write_run(run_at, std::mem::take(&mut run))));
            }
            let aligned = p
                .iter()
                .all(|x| x.1.is_multiple_of(BLOCK) && (x.2.len() as u64).is_multiple_of(BLOCK));
            if !fua && aligned && self.wb.enabled() {
                futs.push(Box::pin(self.write_buffered(s, p)));
            } else {
                futs.push(Box::pin(self.write_stripe(s, p)));
            }
        }
        if !run.is_empty() {
            futs.push(Box::pin(self.write_run(run_at, run)));
        }
        for r in join_all(futs).await {
            r?;
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Zeroes `[off, off + len)` by writing zeroes, a piece at a time.
    pub async fn write_zeroes(
        self: &Arc<Self>,
        off: u64,
        len: u64,
        fua: bool,
    ) -> Result<(), Errno> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZERO_PIECE);
            self.write(off + done, Bytes::from(vec![0u8; n as usize]), false)
                .await?;
            done += n;
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Puts `pieces` of stripe `s` in the write-back buffer. A stripe
    /// that this completes goes to the buffer's ready set, for a
    /// background writer (one is started if fewer than `wb_bg` run), or
    /// with `wb_bg=0` is written here; if the budget needs room, another
    /// stripe is written first (or `pieces` now, if room cannot be made).
    async fn write_buffered(self: &Arc<Self>, s: u64, pieces: Vec<Piece>) -> Result<(), Errno> {
        for _ in 0..3 {
            match self.wb.put(s, &pieces, self.geo.chunk, self.geo.k as u64) {
                Put::Held(None) => return Ok(()),
                Put::Held(Some(_)) if self.wb.has_writers() => {
                    // the stripe is in the ready set: a background writer
                    // takes it (with ready neighbours, as one run)
                    if self.wb.start_writer() {
                        let (me, rt) = (self.clone(), tokio::runtime::Handle::current());
                        tokio::task::spawn_blocking(move || {
                            super::io::writer_thread(|| rt.block_on(me.background_writer()))
                        });
                    }
                    return Ok(());
                }
                Put::Held(Some(x)) => return self.write_stripe(x, Vec::new()).await,
                // full while stripes wait for a writer (the writers are
                // behind): the lowest ready one and the ready whole ones
                // after it are written here, as one run; else the oldest
                Put::Full(Some(victim)) => match self.wb.claim_ready() {
                    Some((r, true)) => self.write_run(r, Vec::new()).await?,
                    Some((r, false)) => self.write_stripe(r, Vec::new()).await?,
                    None => self.write_stripe(victim, Vec::new()).await?,
                },
                Put::Full(None) => break,
            }
        }
        self.write_stripe(s, pieces).await
    }

    /// Writes out every stripe in the write-back buffer.
    pub async fn drain(&self, stripes: Vec<u64>) -> Result<(), Errno> {
        let futs: Vec<Fut<'_, Result<(), Errno>>> = stripes
            .into_iter()
            .map(|s| Box::pin(self.write_stripe(s, Vec::new())) as Fut<'_, _>)
            .collect();
        join_all(futs).await.into_iter().collect()
    }

    /// Writes the buffer out (and waits for buffered stripes other tasks
    /// are writing), writes the crc-table pages changed in memory, flushes
    /// every child that takes writes, then clears the bitmap bits of
    /// regions that were quiet.
    pub async fn flush(&self) -> Result<(), Errno> {
        let (held, busy) = self.wb.snapshot();
        self.drain(held).await?;
        for slot in busy {
            drop(self.locks[slot as usize].read().await);
        }
        let quiet = self.intent_flush_start();
        self.write_dirty_meta().await;
        let futs: Vec<Fut<'_, Result<(), Errno>>> = (0..self.n())
            .filter(|&c| self.writable(c))
            .map(|c| Box::pin(self.child_flush(c)) as Fut<'_, Result<(), Errno>>)
            .collect();
        join_all(futs).await;
        self.check_alive()?;
        self.intent_flush_end(&quiet).await;
        Ok(())
    }

    /// One stripe's update: `new` are (data chunk, column, bytes), laid
    /// over what the write-back buffer holds of the stripe.
    pub async fn write_stripe(&self, s: u64, new: Vec<Piece>) -> Result<(), Errno> {
        let slot = s % self.geo.slots;
        let _g = self.locks[slot as usize].write().await;
        let mut pieces = self.wb.take(s, slot);
        let buffered = !pieces.is_empty();
        pieces.extend(new);
        if pieces.is_empty() {
            return Ok(());
        }
        let r = self.update(s, slot, &pieces).await;
        if buffered {
            self.wb.written(slot);
        }
        r
    }

    /// Steps 2 to 4 of one stripe's update (the caller holds its lock).
    pub(super) async fn update(&self, s: u64, slot: u64, pieces: &[Piece]) -> Result<(), Errno> {
        let (k, m, unit) = (self.geo.k, self.geo.m, self.unit);
        let lo = pieces.iter().map(|p| p.1).min().expect("a piece") / unit * unit;
        let hi = pieces
            .iter()
            .map(|p| p.1 + p.2.len() as u64)
            .max()
            .expect("a piece")
            .div_ceil(unit)
            * unit;
        let len = (hi - lo) as usize;
        // data chunks whose old columns are needed
        let old_of: Vec<usize> = (0..k).filter(|&c| !covers(pieces, c, lo, hi)).collect();
        let old = if old_of.is_empty() {
            Vec::new()
        } else {
            self.read_cols(s, lo, hi, &old_of).await?
        };
        // each data chunk's columns: a piece's own bytes when one piece
        // covers them exactly (no copy), else old columns and pieces laid
        // over them in order
        let mut old = old.into_iter();
        let mut data: Vec<Bytes> = Vec::with_capacity(k);
        for c in 0..k {
            let mine: Vec<&Piece> = pieces.iter().filter(|p| p.0 == c).collect();
            let was = if old_of.contains(&c) {
                old.next()
            } else {
                None
            };
            match (mine.as_slice(), was) {
                ([p], _) if p.1 == lo && p.2.len() == len => data.push(p.2.clone()),
                ([], Some(b)) => data.push(b),
                (mine, was) => {
                    let mut b = match was {
                        Some(b) => BytesMut::from(&b[..]),
                        None => BytesMut::zeroed(len),
                    };
                    for p in mine {
                        let at = (p.1 - lo) as usize;
                        b[at..at + p.2.len()].copy_from_slice(&p.2);
                    }
                    data.push(b.freeze());
                }
            }
        }
        let mut parts: Vec<usize> = (0..k)
            .filter(|c| pieces.iter().any(|p| p.0 == *c))
            .collect();
        parts.extend(k..k + m);
        parts.retain(|&c| self.writable(c));
        let (parity, sums) = self.encode(&data, len, &parts).await?;
        let cols = |c: usize| -> Bytes {
            if c < k {
                data[c].clone()
            } else {
                parity[c - k].clone()
            }
        };
        if self.use_journal() {
            self.journal_write(s, slot, lo, hi, &parts, &sums, &cols)
                .await?;
            self.in_place(s, lo, &parts, &sums, &cols, false).await;
        } else {
            self.intent_begin(s).await;
            self.in_place(s, lo, &parts, &sums, &cols, true).await;
            self.intent_end(s);
        }
        self.metrics.stripe_writes.fetch_add(1, Ordering::Relaxed);
        self.check_alive()
    }

    /// Step 3 with the journal: every taking part child's entry.
    #[allow(clippy::too_many_arguments)]
    async fn journal_write(
        &self,
        s: u64,
        slot: u64,
        lo: u64,
        hi: u64,
        parts: &[usize],
        sums: &[Vec<u32>],
        cols: &(dyn Fn(usize) -> Bytes + Sync),
    ) -> Result<(), Errno> {
        let len = (hi - lo) as usize;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mask = parts.iter().fold(0u64, |a, &c| a | (1 << c));
        let uuid = self.sb.lock().await.uuid;
        let recs = parts
            .iter()
            .zip(sums)
            .map(|(&c, sum)| {
                let h = JHeader {
                    uuid,
                    seq,
                    stripe: s,
                    lo,
                    hi,
                    parts: mask,
                    crcs: sum.clone(),
                };
                let mut rec = BytesMut::with_capacity(super::BLOCK as usize + len);
                rec.extend_from_slice(&h.encode());
                rec.extend_from_slice(&cols(c));
                (c, self.geo.slot_off(slot), rec.freeze())
            })
            .collect();
        self.child_writes(recs).await;
        self.check_alive()?;
        if self.barrier {
            let futs: Vec<Fut<'_, Result<(), Errno>>> = parts
                .iter()
                .map(|&c| Box::pin(self.child_flush(c)) as Fut<'_, Result<(), Errno>>)
                .collect();
            join_all(futs).await;
            self.check_alive()?;
        }
        Ok(())
    }

    /// Step 4: the columns at the chunks, then their crcs: written to the
    /// children now, or with `defer` (the bitmap) set in memory and
    /// written at the next flush (meta.rs).
    async fn in_place(
        &self,
        s: u64,
        lo: u64,
        parts: &[usize],
        sums: &[Vec<u32>],
        cols: &(dyn Fn(usize) -> Bytes + Sync),
        defer: bool,
    ) {
        // the columns of every child at once (io.rs: file children from a
        // few threads), then the crcs of those that took them
        let to: Vec<(usize, &Vec<u32>)> = parts
            .iter()
            .zip(sums)
            .filter(|(&c, _)| self.writable(c))
            .map(|(&c, sum)| (c, sum))
            .collect();
        let at = self.geo.chunk_off(s) + lo;
        let res = self
            .child_writes(to.iter().map(|&(c, _)| (c, at, cols(c))).collect())
            .await;
        let futs: Vec<Fut<'_, ()>> = to
            .into_iter()
            .zip(res)
            .filter(|(_, r)| r.is_ok())
            .map(|((c, sum), _)| {
                Box::pin(async move {
                    if defer {
                        self.defer_meta(c, s, lo, sum).await;
                    } else {
                        self.write_meta(c, s, lo, sum).await;
                    }
                }) as Fut<'_, ()>
            })
            .collect();
        join_all(futs).await;
    }
}
