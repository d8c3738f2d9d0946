//! Parity and block crcs of a stripe's column ranges, in one pass.
//!
//! The k data column ranges are encoded into m parity column ranges a tile
//! of columns at a time (`TILE`), and each tile's 4 KiB block crcs (of the
//! data and the parity chunks taking part) are computed right after it is
//! encoded, while the tile is in the first-level caches. Runs of whole
//! stripes (run.rs) also copy each data tile into the child's gathered
//! write buffer (or, for `memory:` children, the chunk's new page) in
//! the same pass. With `device=gpu`, whole chunks are
//! encoded on the offload engine instead.

use super::layout::{block_crc, crcs, BLOCK};
use super::Inner;
use crate::backend::memory::copy_to_page;
use crate::block::Errno;
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// Columns encoded and checksummed per pass (then the next tile): the
/// k + m column tiles stay in the second-level cache. Six 4 KiB blocks,
/// so that every block crc of a tile is one of a three-block group
/// ([`block_crcs_into`]; a lone block's crc costs about three times as
/// much per byte).
const TILE: usize = 24 << 10;

/// Appends the stored crc of each 4 KiB block of `b` (a multiple of 4 KiB)
/// to `out`. Three blocks at a time where the CPU has the crc32
/// instruction: three independent dependency chains keep the
/// instruction's pipeline full (one block alone waits on each result).
pub fn block_crcs_into(b: &[u8], out: &mut Vec<u32>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            let mut it = b.chunks_exact(3 * BLOCK as usize);
            for three in &mut it {
                // SAFETY: sse4.2 is present (checked above).
                let (x, y, z) = unsafe { crc3_sse42(three) };
                out.extend_from_slice(&[x, y, z]);
            }
            out.extend(it.remainder().chunks(BLOCK as usize).map(block_crc));
            return;
        }
    }
    out.extend(b.chunks(BLOCK as usize).map(block_crc));
}

/// The stored crcs of three consecutive 4 KiB blocks (`b` is 12 KiB),
/// each a plain crc32c (initial value and final inversion ~0) XOR the
/// crc32c of a zero block, as [`block_crc`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc3_sse42(b: &[u8]) -> (u32, u32, u32) {
    use std::arch::x86_64::_mm_crc32_u64;
    let n = BLOCK as usize;
    let w = |x: &[u8]| u64::from_le_bytes(x.try_into().expect("8 bytes"));
    let (mut a, mut c, mut d) = (0xffff_ffffu64, 0xffff_ffffu64, 0xffff_ffffu64);
    let (p, q, r) = (&b[..n], &b[n..2 * n], &b[2 * n..3 * n]);
    for ((x, y), z) in p
        .chunks_exact(8)
        .zip(q.chunks_exact(8))
        .zip(r.chunks_exact(8))
    {
        a = _mm_crc32_u64(a, w(x));
        c = _mm_crc32_u64(c, w(y));
        d = _mm_crc32_u64(d, w(z));
    }
    let zero = zero_block_crc();
    (!(a as u32) ^ zero, !(c as u32) ^ zero, !(d as u32) ^ zero)
}

/// crc32c of a zero 4 KiB block.
fn zero_block_crc() -> u32 {
    static ZERO: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ZERO.get_or_init(|| crc32c::crc32c(&[0u8; BLOCK as usize]))
}

/// One pass over stripe column ranges: encodes `data` (k ranges of the same
/// length) into `parity` (m ranges), a tile at a time; after each tile
/// appends the block crcs of the chunks `parts` to `sums` (in `parts`'
/// order) and, for data chunk c with `copy[c]` set (a buffer as long as
/// the range), copies the tile there (with streaming stores: the buffer
/// is cold, the tile is in cache).
pub fn encode_tiles(
    inner: &Inner,
    data: &[&[u8]],
    parity: &mut [&mut [u8]],
    parts: &[usize],
    sums: &mut [Vec<u32>],
    copy: &mut [Option<&mut [u8]>],
) -> Result<(), Errno> {
    let k = inner.geo.k;
    let len = data.first().map_or(0, |d| d.len());
    let unit = inner.unit as usize;
    let tile = (TILE / unit).max(1) * unit;
    let mut x = 0;
    while x < len {
        let t = tile.min(len - x);
        let srcs: Vec<&[u8]> = data.iter().map(|d| &d[x..x + t]).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[x..x + t]).collect();
        inner.codec.encode(&srcs, &mut outs).map_err(|e| {
            tracing::error!("ec: encode failed: {e}");
            Errno::EIO
        })?;
        for (&c, sum) in parts.iter().zip(sums.iter_mut()) {
            let b = if c < k { srcs[c] } else { &*outs[c - k] };
            block_crcs_into(b, sum);
        }
        for (c, to) in copy.iter_mut().enumerate() {
            if let Some(to) = to {
                copy_to_page(&mut to[x..x + t], srcs[c]);
            }
        }
        x += t;
    }
    Ok(())
}

impl Inner {
    /// The m parity column ranges of the k data column ranges `data` (each
    /// `len` bytes), and the block crcs of the chunks `parts`, in `parts`'
    /// order. On the CPU both are done in one pass, a tile of columns at a
    /// time while it is in cache; with `device=gpu`, whole chunks are
    /// encoded on the offload engine.
    pub async fn encode(
        &self,
        data: &[Bytes],
        len: usize,
        parts: &[usize],
    ) -> Result<(Vec<Bytes>, Vec<Vec<u32>>), Errno> {
        let (k, m) = (self.geo.k, self.geo.m);
        if let Some(g) = &self.gpu {
            if len as u64 == self.geo.chunk {
                self.metrics.offloaded.fetch_add(1, Ordering::Relaxed);
                let stripe: Vec<u8> = data.iter().flat_map(|d| d.iter().copied()).collect();
                let p = Bytes::from(g.encode(&stripe).await?);
                let parity: Vec<Bytes> = (0..m).map(|j| p.slice(j * len..(j + 1) * len)).collect();
                let sums = parts
                    .iter()
                    .map(|&c| crcs(if c < k { &data[c] } else { &parity[c - k] }))
                    .collect();
                return Ok((parity, sums));
            }
        }
        let mut parity: Vec<Vec<u8>> = (0..m).map(|_| self.pool.get(len)).collect();
        let mut sums: Vec<Vec<u32>> = parts
            .iter()
            .map(|_| Vec::with_capacity(len / BLOCK as usize))
            .collect();
        {
            let srcs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
            encode_tiles(self, &srcs, &mut outs, parts, &mut sums, &mut [])?;
        }
        Ok((
            parity.into_iter().map(|p| self.pool.lend(p)).collect(),
            sums,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_at_a_time_crcs_match_one_at_a_time() {
        let mut b = vec![0u8; 7 * BLOCK as usize];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for v in b.iter_mut().skip(100) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *v = x as u8;
        }
        b[6 * BLOCK as usize..].fill(0);
        let mut got = Vec::new();
        block_crcs_into(&b, &mut got);
        let want: Vec<u32> = b.chunks(BLOCK as usize).map(block_crc).collect();
        assert_eq!(got, want);
        assert_eq!(got[6], 0, "the zero block's stored crc");
        assert_ne!(got[0], got[1]);
    }
}
