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
/// so that a chunk's blocks of a whole tile are two three-block groups
/// ([`crcs_of_blocks`]; a lone block's crc costs about three times as
/// much per byte).
const TILE: usize = 24 << 10;

/// Appends the stored crc of each 4 KiB block of `b` (a multiple of 4 KiB)
/// to `out` ([`crcs_of_blocks`]).
pub fn block_crcs_into(b: &[u8], out: &mut Vec<u32>) {
    if !b.len().is_multiple_of(BLOCK as usize) {
        out.extend(b.chunks(BLOCK as usize).map(block_crc));
        return;
    }
    let blocks: Vec<&[u8]> = b.chunks(BLOCK as usize).collect();
    crcs_of_blocks(&blocks, out);
}

/// Appends the stored crc of each of `blocks` (each 4 KiB, from anywhere:
/// the blocks of several chunks' tiles) to `out`, in order. Three blocks
/// at a time where the CPU has the crc32 instruction: three independent
/// dependency chains keep the instruction's pipeline full (one block
/// alone waits on each result, about three times the cost per byte); a
/// last group of one or two blocks repeats its last block to make three.
pub fn crcs_of_blocks(blocks: &[&[u8]], out: &mut Vec<u32>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2")
            && blocks.iter().all(|b| b.len() == BLOCK as usize)
        {
            for g in blocks.chunks(3) {
                let last = g.len() - 1;
                // SAFETY: sse4.2 is present, every block is 4 KiB (checked above).
                let (x, y, z) = unsafe { crc3_sse42(g[0], g[1.min(last)], g[2.min(last)]) };
                out.extend_from_slice(&[x, y, z][..g.len()]);
            }
            return;
        }
    }
    out.extend(blocks.iter().map(|b| block_crc(b)));
}

/// The stored crcs of three 4 KiB blocks, each a plain crc32c (initial
/// value and final inversion ~0) XOR the crc32c of a zero block, as
/// [`block_crc`].
///
/// # Safety
/// The CPU must have SSE 4.2 and each block must be 4 KiB long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc3_sse42(p: &[u8], q: &[u8], r: &[u8]) -> (u32, u32, u32) {
    use std::arch::x86_64::_mm_crc32_u64;
    let words = BLOCK as usize / 8;
    debug_assert!(p.len() == BLOCK as usize && q.len() == p.len() && r.len() == p.len());
    let (p, q, r) = (
        p.as_ptr() as *const u64,
        q.as_ptr() as *const u64,
        r.as_ptr() as *const u64,
    );
    let (mut a, mut c, mut d) = (0xffff_ffffu64, 0xffff_ffffu64, 0xffff_ffffu64);
    for i in 0..words {
        // SAFETY: i < words, within each 4 KiB block (the caller's
        // promise); the reads may be unaligned.
        unsafe {
            a = _mm_crc32_u64(a, p.add(i).read_unaligned());
            c = _mm_crc32_u64(c, q.add(i).read_unaligned());
            d = _mm_crc32_u64(d, r.add(i).read_unaligned());
        }
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
/// is cold, the tile is in cache). A parity chunk that is the XOR of the data chunks
/// (`Codec::xor_rows`: the first row of the Vandermonde codes) gets its
/// crcs as the XOR of the data chunks' when all k take part: the stored
/// crc is linear over XOR ([`block_crc`]), so that is exact and saves a
/// sixth of the crc work at k=4, m=2.
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
    // (whole blocks only: the linearity holds for 4 KiB blocks)
    let blocks = tile.is_multiple_of(BLOCK as usize) && len.is_multiple_of(BLOCK as usize);
    let all_data = (0..k).all(|c| parts.contains(&c));
    let codec = &inner.codec;
    let derive = |i: usize| {
        let c = parts[i];
        blocks && all_data && c >= k && codec.is_xor_row(c - k)
    };
    // the per-tile lists live in allocations made once per call (a run's
    // stripes x tiles would otherwise be three mallocs each)
    let mut got: Vec<u32> = Vec::new();
    let mut srcs: Vec<&[u8]> = Vec::with_capacity(k);
    let mut outs_at: Vec<&mut [u8]> = Vec::with_capacity(parity.len());
    let mut blocks_at: Vec<&[u8]> = Vec::new();
    let mut x = 0;
    while x < len {
        let t = tile.min(len - x);
        srcs.clear();
        srcs.extend(data.iter().map(|d| &d[x..x + t]));
        let mut outs: Vec<&mut [u8]> = recycle(std::mem::take(&mut outs_at));
        outs.extend(parity.iter_mut().map(|p| &mut p[x..x + t]));
        inner.codec.encode(&srcs, &mut outs).map_err(|e| {
            tracing::error!("ec: encode failed: {e}");
            Errno::EIO
        })?;
        // the tile's blocks of every chunk whose crcs are computed, in
        // groups of three across chunks (a chunk's 16 blocks at 64K do
        // not split into threes; the tile's blocks of all chunks nearly do)
        let nb = t / BLOCK as usize;
        let mut blocks: Vec<&[u8]> = recycle(std::mem::take(&mut blocks_at));
        for (i, &c) in parts.iter().enumerate() {
            if !derive(i) {
                let b = if c < k { srcs[c] } else { &*outs[c - k] };
                blocks.extend(b.chunks(BLOCK as usize));
            }
        }
        if t.is_multiple_of(BLOCK as usize) {
            got.clear();
            crcs_of_blocks(&blocks, &mut got);
            let mut each = got.chunks(nb);
            for (i, sum) in sums.iter_mut().enumerate() {
                if !derive(i) {
                    sum.extend_from_slice(each.next().expect("a tile's crcs per chunk"));
                }
            }
        } else {
            for (i, &c) in parts.iter().enumerate() {
                if !derive(i) {
                    let b = if c < k { srcs[c] } else { &*outs[c - k] };
                    block_crcs_into(b, &mut sums[i]);
                }
            }
        }
        blocks_at = recycle(blocks);
        outs_at = recycle(outs);
        for i in (0..parts.len()).filter(|&i| derive(i)) {
            let nb = t / BLOCK as usize;
            for b in 0..nb {
                // (every data chunk takes part: where its crcs are in `sums`)
                let v = parts
                    .iter()
                    .enumerate()
                    .filter(|p| *p.1 < k)
                    .fold(0u32, |a, (j, _)| {
                        let s = &sums[j];
                        a ^ s[s.len() - nb + b]
                    });
                sums[i].push(v);
            }
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

/// `v` emptied, as a vector of another element type of the same size in
/// the same allocation (std's in-place collect): per-tile lists of
/// borrowed slices reuse one allocation although each tile's borrows
/// end with the tile. A type of another size gets a fresh allocation.
pub fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
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
    fn recycled_lists_keep_their_allocation() {
        let a = [0u8; 64];
        let b = [1u8; 64];
        let mut v: Vec<&[u8]> = Vec::with_capacity(8);
        v.extend([&a[..], &b[..]]);
        let (ptr, cap) = (v.as_ptr() as usize, v.capacity());
        let mut w: Vec<&mut [u8]> = recycle(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (ptr, cap));
        let mut c = [2u8; 8];
        w.push(&mut c[..]);
        w[0][0] = 9;
        let u: Vec<&[u8]> = recycle(w);
        assert_eq!((u.as_ptr() as usize, u.capacity()), (ptr, cap));
        assert_eq!(c[0], 9);
    }

    #[test]
    fn three_at_a_time_crcs_match_one_at_a_time() {
        let mut b = vec![0u8; 100];
        b.extend(noise(0x9e37_79b9_7f4a_7c15, 7 * BLOCK as usize - 100));
        b[6 * BLOCK as usize..].fill(0);
        let mut got = Vec::new();
        block_crcs_into(&b, &mut got);
        let want: Vec<u32> = b.chunks(BLOCK as usize).map(block_crc).collect();
        assert_eq!(got, want);
        assert_eq!(got[6], 0, "the zero block's stored crc");
        assert_ne!(got[0], got[1]);
    }

    fn noise(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn crcs_of_scattered_blocks_in_groups_match_one_at_a_time() {
        // 1 to 7 blocks from different buffers (groups of three, one or two
        // left over), one at an unaligned start
        let bufs: Vec<Vec<u8>> = (0..7).map(|i| noise(200 + i, BLOCK as usize + 1)).collect();
        for n in 1..=7 {
            let blocks: Vec<&[u8]> = bufs[..n]
                .iter()
                .enumerate()
                .map(|(i, b)| &b[i % 2..i % 2 + BLOCK as usize])
                .collect();
            let want: Vec<u32> = blocks.iter().map(|b| block_crc(b)).collect();
            let mut got = vec![7u32];
            crcs_of_blocks(&blocks, &mut got);
            assert_eq!(got[0], 7);
            assert_eq!(&got[1..], &want[..], "{n} blocks");
        }
    }

    #[test]
    fn the_stored_crc_of_a_xor_is_the_xor_of_the_stored_crcs() {
        // what encode_tiles relies on to derive an all-ones parity row's
        // crcs from the data chunks' (k = 1..5, odd and even)
        let n = 6 * BLOCK as usize;
        for k in 1..=5u64 {
            let chunks: Vec<Vec<u8>> = (0..k).map(|i| noise(100 + i, n)).collect();
            let x: Vec<u8> = (0..n)
                .map(|i| chunks.iter().fold(0, |a, c| a ^ c[i]))
                .collect();
            let mut want = Vec::new();
            block_crcs_into(&x, &mut want);
            let mut got = vec![0u32; 6];
            for c in &chunks {
                let mut s = Vec::new();
                block_crcs_into(c, &mut s);
                got.iter_mut().zip(s).for_each(|(g, v)| *g ^= v);
            }
            assert_eq!(got, want, "k {k}");
        }
    }
}
