//! Reads: each chunk a request touches is read from its child and its
//! blocks checked against the crc table; a chunk that cannot be read
//! (child failed, I/O error) or does not match is decoded from k others,
//! and a mismatching one is written back repaired.

use super::join::{join_all, Fut};
use super::layout::{crcs, BLOCK};
use super::Inner;
use crate::block::Errno;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;

/// Columns of one chunk a request touches: (stripe, chunk, lo, hi, at).
type Span = (u64, usize, u64, u64, usize);

/// What reading one chunk's columns gave.
enum Got {
    Good(Bytes),
    /// Read, but a block's crc does not match the table.
    Corrupt,
    /// Not readable (failed child or I/O error).
    Lost,
}

impl Inner {
    /// Reads columns `[lo, hi)` of chunk `c` of stripe `s` and checks them.
    async fn read_checked(&self, c: usize, s: u64, lo: u64, hi: u64) -> Got {
        if !self.readable(c) {
            return Got::Lost;
        }
        let off = self.geo.chunk_off(s) + lo;
        let Ok(b) = self.child_read(c, off, hi - lo).await else {
            return Got::Lost;
        };
        for (i, blk) in b.chunks(BLOCK as usize).enumerate() {
            if super::layout::block_crc(blk) != self.crc(c, s, lo / BLOCK + i as u64) {
                tracing::warn!(
                    "ec: child {c}: stripe {s} block {} fails its crc; decoding from parity",
                    lo / BLOCK + i as u64
                );
                self.metrics.crc_errors.fetch_add(1, Ordering::Relaxed);
                return Got::Corrupt;
            }
        }
        Got::Good(b)
    }

    /// Columns `[lo, hi)` (multiples of the unit) of chunks `want` of
    /// stripe `s`, in `want`'s order, decoded where needed. The caller
    /// holds the stripe's lock (shared or exclusive).
    pub async fn read_cols(
        &self,
        s: u64,
        lo: u64,
        hi: u64,
        want: &[usize],
    ) -> Result<Vec<Bytes>, Errno> {
        let n = self.n();
        let mut got: Vec<Option<Bytes>> = vec![None; n];
        let mut corrupt = Vec::new();
        let mut tried = vec![false; n];
        let first: Vec<Fut<'_, Got>> = want
            .iter()
            .map(|&c| Box::pin(self.read_checked(c, s, lo, hi)) as Fut<'_, Got>)
            .collect();
        for (&c, g) in want.iter().zip(join_all(first).await) {
            tried[c] = true;
            match g {
                Got::Good(b) => got[c] = Some(b),
                Got::Corrupt => corrupt.push(c),
                Got::Lost => {}
            }
        }
        if want.iter().all(|&c| got[c].is_some()) {
            return Ok(want.iter().map(|&c| got[c].take().expect("read")).collect());
        }
        // Decode: find k good chunks, reading more as reads fail.
        self.metrics.decodes.fetch_add(1, Ordering::Relaxed);
        loop {
            let have = got.iter().filter(|g| g.is_some()).count();
            if have >= self.geo.k {
                break;
            }
            let more: Vec<usize> = (0..n)
                .filter(|&c| !tried[c] && self.readable(c))
                .take(self.geo.k - have)
                .collect();
            if more.is_empty() {
                tracing::error!(
                    "ec: stripe {s}: only {have} of {n} chunks readable, k={} needed",
                    self.geo.k
                );
                return Err(Errno::EIO);
            }
            let futs: Vec<Fut<'_, Got>> = more
                .iter()
                .map(|&c| Box::pin(self.read_checked(c, s, lo, hi)) as Fut<'_, Got>)
                .collect();
            for (&c, g) in more.iter().zip(join_all(futs).await) {
                tried[c] = true;
                match g {
                    Got::Good(b) => got[c] = Some(b),
                    Got::Corrupt => corrupt.push(c),
                    Got::Lost => {}
                }
            }
        }
        let have: Vec<usize> = (0..n)
            .filter(|&c| got[c].is_some())
            .take(self.geo.k)
            .collect();
        let mut missing: Vec<usize> = want.iter().copied().filter(|&c| got[c].is_none()).collect();
        for &c in &corrupt {
            if !missing.contains(&c) {
                missing.push(c);
            }
        }
        let len = (hi - lo) as usize;
        let mut outs: Vec<Vec<u8>> = vec![vec![0u8; len]; missing.len()];
        {
            let srcs: Vec<&[u8]> = have
                .iter()
                .map(|&c| &got[c].as_ref().expect("have")[..])
                .collect();
            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.codec
                .reconstruct(&have, &srcs, &missing, &mut o)
                .map_err(|e| {
                    tracing::error!("ec: stripe {s}: decode failed: {e}");
                    Errno::EIO
                })?;
        }
        for (&c, v) in missing.iter().zip(outs) {
            got[c] = Some(Bytes::from(v));
        }
        for &c in &corrupt {
            self.repair(c, s, lo, got[c].clone().expect("decoded"))
                .await;
        }
        Ok(want
            .iter()
            .map(|&c| got[c].clone().expect("decoded"))
            .collect())
    }

    /// Writes decoded columns back over a chunk that failed its crc.
    async fn repair(&self, c: usize, s: u64, lo: u64, data: Bytes) {
        let sums = crcs(&data);
        let expect: Vec<u32> = (0..sums.len() as u64)
            .map(|i| self.crc(c, s, lo / BLOCK + i))
            .collect();
        if sums != expect {
            // The parity does not give the block the table expects: keep
            // what the parity says and record it, so the table stays true.
            tracing::warn!("ec: child {c}: stripe {s}: decoded data does not match the crc table; rewriting both");
            self.write_meta(c, s, lo, &sums).await;
        }
        let len = data.len() as u64;
        if self
            .child_write(c, self.geo.chunk_off(s) + lo, data)
            .await
            .is_ok()
        {
            self.metrics.repairs.fetch_add(1, Ordering::Relaxed);
            self.metrics
                .repaired_bytes
                .fetch_add(len, Ordering::Relaxed);
            tracing::info!("ec: child {c}: stripe {s}: repaired {len} bytes from parity");
        }
    }

    /// Records crcs for columns from `lo` of chunk `c` of stripe `s`, on
    /// the child and in the table.
    pub async fn write_meta(&self, c: usize, s: u64, lo: u64, sums: &[u32]) {
        let mut b = Vec::with_capacity(sums.len() * 4);
        for v in sums {
            b.extend_from_slice(&v.to_le_bytes());
        }
        if self
            .child_write(c, self.geo.meta_off(s, lo / BLOCK), Bytes::from(b))
            .await
            .is_ok()
        {
            self.set_crcs(c, s, lo, sums);
        }
    }

    /// Columns of one chunk a request touches: `(chunk, lo, hi, at)` where
    /// the request's bytes at `at..` are the chunk's `[lo, hi)`.
    pub fn pieces(&self, off: u64, len: u64) -> Vec<Span> {
        let chunk = self.geo.chunk;
        let mut out = Vec::new();
        let mut done = 0u64;
        while done < len {
            let pos = off + done;
            let col = pos / chunk;
            let s = col / self.geo.k as u64;
            let c = (col % self.geo.k as u64) as usize;
            let lo = pos % chunk;
            let n = (chunk - lo).min(len - done);
            out.push((s, c, lo, lo + n, done as usize));
            done += n;
        }
        out
    }

    /// A read of `[off, off + len)`. Stripes it touches that the
    /// write-back buffer holds are written out first. With a child failed,
    /// the pieces of one stripe are read together (one decode per stripe).
    pub async fn read(&self, off: u64, len: u32) -> Result<Bytes, Errno> {
        self.check_alive()?;
        let unit = self.unit;
        let pieces = self.pieces(off, len as u64);
        let mut stripes: Vec<u64> = pieces.iter().map(|p| p.0).collect();
        stripes.dedup();
        let held: Vec<u64> = stripes
            .iter()
            .copied()
            .filter(|&s| self.wb.has(s))
            .collect();
        if !held.is_empty() {
            self.drain(held).await?;
        }
        let groups: Vec<Vec<Span>> = if self.degraded() > 0 {
            let mut g: Vec<Vec<Span>> = Vec::new();
            for p in pieces {
                match g.last_mut() {
                    Some(v) if v[0].0 == p.0 => v.push(p),
                    _ => g.push(vec![p]),
                }
            }
            g
        } else {
            pieces.into_iter().map(|p| vec![p]).collect()
        };
        let futs: Vec<Fut<'_, Result<Vec<Bytes>, Errno>>> = groups
            .iter()
            .map(|g| {
                Box::pin(async move {
                    let s = g[0].0;
                    let a = g.iter().map(|p| p.2).min().expect("a piece") / unit * unit;
                    let b = g.iter().map(|p| p.3).max().expect("a piece").div_ceil(unit) * unit;
                    let want: Vec<usize> = g.iter().map(|p| p.1).collect();
                    let _g = self.locks[(s % self.geo.slots) as usize].read().await;
                    let v = self.read_cols(s, a, b, &want).await?;
                    Ok(v.into_iter()
                        .zip(g)
                        .map(|(b, p)| b.slice((p.2 - a) as usize..(p.3 - a) as usize))
                        .collect())
                }) as Fut<'_, Result<Vec<Bytes>, Errno>>
            })
            .collect();
        let mut parts = Vec::new();
        for r in join_all(futs).await {
            parts.extend(r?);
        }
        if parts.len() == 1 {
            return Ok(parts.pop().expect("one"));
        }
        let mut out = BytesMut::with_capacity(len as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        Ok(out.freeze())
    }
}
