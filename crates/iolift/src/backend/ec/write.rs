//! Writes: one stripe update at a time per stripe, journalled.
//!
//! For each stripe a write touches, under the stripe's exclusive lock:
//! 1. the column range `[lo, hi)` it covers (rounded out to the unit);
//! 2. the old columns of every data chunk the write does not cover whole
//!    (decoded if need be), overlaid with the new bytes, encoded: m parity
//!    column ranges (read-modify-write; a full-stripe write reads nothing);
//! 3. journal: each taking part child (changed data chunks and every
//!    parity chunk) gets header + new columns in its journal slot
//!    `s % slots`; all of them complete before step 4;
//! 4. in place: the same columns at the chunk, their crcs in the table.
//!
//! After a crash an update whose journal entries are all there is
//! written again (journal.rs); one whose entries are not all there never
//! reached step 4, so the stripe is old. See docs/ec-device.md.

use super::join::{join_all, Fut};
use super::layout::{crcs, JHeader};
use super::Inner;
use crate::block::Errno;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;

/// A data chunk's new bytes in one stripe: (chunk, first column, bytes).
type Piece = (usize, u64, Bytes);

/// Bytes zeroed per stripe-write round by write-zeroes.
const ZERO_PIECE: u64 = 8 << 20;

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
        let futs: Vec<Fut<'_, Result<(), Errno>>> = stripes
            .into_iter()
            .map(|(s, p)| Box::pin(self.write_stripe(s, p)) as Fut<'_, Result<(), Errno>>)
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

    /// Flushes every child that takes writes.
    pub async fn flush(&self) -> Result<(), Errno> {
        let futs: Vec<Fut<'_, Result<(), Errno>>> = (0..self.n())
            .filter(|&c| self.writable(c))
            .map(|c| Box::pin(self.child_flush(c)) as Fut<'_, Result<(), Errno>>)
            .collect();
        join_all(futs).await;
        self.check_alive()
    }

    /// One stripe's update: `pieces` are (data chunk, column, bytes).
    async fn write_stripe(&self, s: u64, pieces: Vec<Piece>) -> Result<(), Errno> {
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
        let slot = s % self.geo.slots;
        let _g = self.locks[slot as usize].write().await;
        // data chunks whose old columns are needed
        let old_of: Vec<usize> = (0..k)
            .filter(|&c| {
                !pieces
                    .iter()
                    .any(|p| p.0 == c && p.1 == lo && p.2.len() == len)
            })
            .collect();
        let old = if old_of.is_empty() {
            Vec::new()
        } else {
            self.read_cols(s, lo, hi, &old_of).await?
        };
        let mut stripe = vec![0u8; k * len];
        for (&c, b) in old_of.iter().zip(&old) {
            stripe[c * len..(c + 1) * len].copy_from_slice(b);
        }
        for (c, col, b) in &pieces {
            let at = c * len + (col - lo) as usize;
            stripe[at..at + b.len()].copy_from_slice(b);
        }
        let parity = self.encode(stripe.as_slice(), len).await?;
        let mut parts: Vec<usize> = (0..k)
            .filter(|c| pieces.iter().any(|p| p.0 == *c))
            .collect();
        parts.extend(k..k + m);
        parts.retain(|&c| self.writable(c));
        let cols = |c: usize| -> &[u8] {
            if c < k {
                &stripe[c * len..(c + 1) * len]
            } else {
                &parity[(c - k) * len..(c - k + 1) * len]
            }
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mask = parts.iter().fold(0u64, |a, &c| a | (1 << c));
        let uuid = self.sb.lock().await.uuid;
        let sums: Vec<Vec<u32>> = parts.iter().map(|&c| crcs(cols(c))).collect();
        // 3. journal
        let futs: Vec<Fut<'_, Result<(), Errno>>> = parts
            .iter()
            .zip(&sums)
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
                rec.extend_from_slice(cols(c));
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
        // 4. in place
        let futs: Vec<Fut<'_, ()>> = parts
            .iter()
            .zip(&sums)
            .filter(|(&c, _)| self.writable(c))
            .map(|(&c, sum)| {
                let data = Bytes::copy_from_slice(cols(c));
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
        self.metrics.stripe_writes.fetch_add(1, Ordering::Relaxed);
        self.check_alive()
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
