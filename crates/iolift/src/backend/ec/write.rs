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
//! 4. in place: the same columns at the chunk, their crcs in the table.
//!
//! After a crash an update whose journal entries are all there is
//! written again (journal.rs); one whose entries are not all there never
//! reached step 4, so the stripe is old. A bitmap region that was dirty
//! is resynced (bitmap.rs). See docs/ec-device.md.

use super::join::{join_all, Fut};
use super::layout::{crcs, JHeader, BLOCK};
use super::wb::{Piece, Put};
use super::Inner;
use crate::block::Errno;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;

/// Bytes zeroed per stripe-write round by write-zeroes.
const ZERO_PIECE: u64 = 8 << 20;

/// Whether `pieces` cover columns `[lo, hi)` of chunk `c` (together).
fn covers(pieces: &[Piece], c: usize, lo: u64, hi: u64) -> bool {
    let mut iv: Vec<(u64, u64)> = pieces
        .iter()
        .filter(|p| p.0 == c)
        .map(|p| (p.1, p.1 + p.2.len() as u64))
        .collect();
    iv.sort_unstable();
    let mut at = lo;
    for (a, b) in iv {
        if a > at {
            return false;
        }
        at = at.max(b);
    }
    at >= hi
}

impl Inner {
    /// A write of `data` at `off`; with `fua`, stable when it completes.
    pub async fn write(&self, off: u64, data: Bytes, fua: bool) -> Result<(), Errno> {
        self.check_alive()?;
        let pieces = self.pieces(off, data.len() as u64);
        let mut stripes: Vec<(u64, Vec<Piece>)> = Vec::new();
        for (s, c, lo, hi, at) in pieces {
            let b = data.slice(at..at + (hi - lo) as usize);
            match stripes.last_mut() {
                Some((ls, v)) if *ls == s => v.push((c, lo, b)),
                _ => stripes.push((s, vec![(c, lo, b)])),
            }
        }
        let sb = self.geo.stripe_bytes();
        let futs: Vec<Fut<'_, Result<(), Errno>>> = stripes
            .into_iter()
            .map(|(s, p)| {
                let whole = p.iter().map(|x| x.2.len() as u64).sum::<u64>() == sb;
                let aligned = p
                    .iter()
                    .all(|x| x.1.is_multiple_of(BLOCK) && (x.2.len() as u64).is_multiple_of(BLOCK));
                if !fua && !whole && aligned && self.wb.enabled() {
                    Box::pin(self.write_buffered(s, p)) as Fut<'_, Result<(), Errno>>
                } else {
                    Box::pin(self.write_stripe(s, p)) as Fut<'_, Result<(), Errno>>
                }
            })
            .collect();
        for r in join_all(futs).await {
            r?;
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Zeroes `[off, off + len)` by writing zeroes, a piece at a time.
    pub async fn write_zeroes(&self, off: u64, len: u64, fua: bool) -> Result<(), Errno> {
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

    /// Puts `pieces` of stripe `s` in the write-back buffer, writing the
    /// stripe if that completes it, and first another one if the budget
    /// needs room (or `pieces` now, if room cannot be made).
    async fn write_buffered(&self, s: u64, pieces: Vec<Piece>) -> Result<(), Errno> {
        for _ in 0..3 {
            match self.wb.put(s, &pieces, self.geo.chunk, self.geo.k as u64) {
                Put::Held(None) => return Ok(()),
                Put::Held(Some(x)) => return self.write_stripe(x, Vec::new()).await,
                Put::Full(Some(victim)) => self.write_stripe(victim, Vec::new()).await?,
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

    /// Writes the buffer out, flushes every child that takes writes, then
    /// clears the bitmap bits of regions that were quiet.
    pub async fn flush(&self) -> Result<(), Errno> {
        self.drain(self.wb.stripes()).await?;
        let quiet = self.intent_flush_start();
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
        let mut pieces = self.wb.take(s);
        pieces.extend(new);
        if pieces.is_empty() {
            return Ok(());
        }
        self.update(s, slot, &pieces).await
    }

    /// Steps 2 to 4 of one stripe's update (the caller holds its lock).
    async fn update(&self, s: u64, slot: u64, pieces: &[Piece]) -> Result<(), Errno> {
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
        let mut stripe = vec![0u8; k * len];
        for (&c, b) in old_of.iter().zip(&old) {
            stripe[c * len..(c + 1) * len].copy_from_slice(b);
        }
        for (c, col, b) in pieces {
            let at = c * len + (col - lo) as usize;
            stripe[at..at + b.len()].copy_from_slice(b);
        }
        let parity = Bytes::from(self.encode(stripe.as_slice(), len).await?);
        let stripe = Bytes::from(stripe);
        let mut parts: Vec<usize> = (0..k)
            .filter(|c| pieces.iter().any(|p| p.0 == *c))
            .collect();
        parts.extend(k..k + m);
        parts.retain(|&c| self.writable(c));
        let cols = |c: usize| -> Bytes {
            if c < k {
                stripe.slice(c * len..(c + 1) * len)
            } else {
                parity.slice((c - k) * len..(c - k + 1) * len)
            }
        };
        let sums: Vec<Vec<u32>> = parts.iter().map(|&c| crcs(&cols(c))).collect();
        if self.use_journal() {
            self.journal_write(s, slot, lo, hi, &parts, &sums, &cols)
                .await?;
            self.in_place(s, lo, &parts, &sums, &cols).await;
        } else {
            self.intent_begin(s).await;
            self.in_place(s, lo, &parts, &sums, &cols).await;
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
        let futs: Vec<Fut<'_, Result<(), Errno>>> = parts
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
                let off = self.geo.slot_off(slot);
                Box::pin(self.child_write(c, off, rec.freeze())) as Fut<'_, Result<(), Errno>>
            })
            .collect();
        join_all(futs).await;
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

    /// Step 4: the columns at the chunks, then their crcs.
    async fn in_place(
        &self,
        s: u64,
        lo: u64,
        parts: &[usize],
        sums: &[Vec<u32>],
        cols: &(dyn Fn(usize) -> Bytes + Sync),
    ) {
        let futs: Vec<Fut<'_, ()>> = parts
            .iter()
            .zip(sums)
            .filter(|(&c, _)| self.writable(c))
            .map(|(&c, sum)| {
                let data = cols(c);
                Box::pin(async move {
                    if self
                        .child_write(c, self.geo.chunk_off(s) + lo, data)
                        .await
                        .is_ok()
                    {
                        self.write_meta(c, s, lo, sum).await;
                    }
                }) as Fut<'_, ()>
            })
            .collect();
        join_all(futs).await;
    }

    /// The m parity column ranges of `stripe` (k column ranges of `len`
    /// bytes, back to back), on the offload engine for whole chunks when
    /// `device=gpu`, else on this thread.
    async fn encode(&self, stripe: &[u8], len: usize) -> Result<Vec<u8>, Errno> {
        let (k, m) = (self.geo.k, self.geo.m);
        if let Some(g) = &self.gpu {
            if len as u64 == self.geo.chunk {
                self.metrics.offloaded.fetch_add(1, Ordering::Relaxed);
                return g.encode(stripe).await;
            }
        }
        let mut parity = vec![0u8; m * len];
        let srcs: Vec<&[u8]> = stripe.chunks(len).take(k).collect();
        let mut outs: Vec<&mut [u8]> = parity.chunks_mut(len).collect();
        self.codec.encode(&srcs, &mut outs).map_err(|e| {
            tracing::error!("ec: encode failed: {e}");
            Errno::EIO
        })?;
        Ok(parity)
    }
}
