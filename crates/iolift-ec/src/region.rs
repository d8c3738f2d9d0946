//! iolift's own region kernels: outs[i] = sum_j c[i][j] * srcs[j] over
//! GF(2^8), byte by byte. Two versions giving the same bytes: a portable
//! table-driven loop, and an AVX2 loop (x86-64, picked at run time) that
//! multiplies 32 bytes at once with two 16-entry lookups per coefficient
//! (one for the low nibble of each byte, one for the high nibble). Each
//! source vector is loaded once and added into up to four outputs held in
//! registers, so a pass reads the data once for four parity chunks.

use crate::gf;
use crate::matrix::Matrix;

/// Outputs computed per pass over the sources.
const GROUP: usize = 4;

/// A matrix prepared for the native kernels.
pub struct NativePlan {
    rows: usize,
    cols: usize,
    coeffs: Vec<u8>,
    /// Per group of up to GROUP rows, per source j, per row in the group:
    /// 16 products c*x for the low nibble x, then 16 for the high nibble.
    nibbles: Vec<[u8; 32]>,
    avx2: bool,
}

pub fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl NativePlan {
    /// `simd`: use AVX2 when the CPU has it.
    pub fn new(m: &Matrix, simd: bool) -> NativePlan {
        let mut nibbles = Vec::with_capacity(m.rows * m.cols);
        for g in (0..m.rows).step_by(GROUP) {
            let end = (g + GROUP).min(m.rows);
            for j in 0..m.cols {
                for r in g..end {
                    let c = m.get(r, j);
                    let mut t = [0u8; 32];
                    for x in 0..16u8 {
                        t[x as usize] = gf::mul(c, x);
                        t[16 + x as usize] = gf::mul(c, x << 4);
                    }
                    nibbles.push(t);
                }
            }
        }
        NativePlan {
            rows: m.rows,
            cols: m.cols,
            coeffs: m.data.clone(),
            nibbles,
            avx2: simd && avx2_available(),
        }
    }

    pub fn uses_avx2(&self) -> bool {
        self.avx2
    }

    pub fn run(&self, srcs: &[&[u8]], outs: &mut [&mut [u8]]) {
        assert_eq!(srcs.len(), self.cols);
        assert_eq!(outs.len(), self.rows);
        let len = srcs.first().map_or(0, |s| s.len());
        assert!(srcs.iter().all(|s| s.len() == len));
        assert!(outs.iter().all(|s| s.len() == len));
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            done = len / 32 * 32;
            let mut base = 0;
            for group in outs.chunks_mut(GROUP) {
                let n = group.len();
                let tables = &self.nibbles[base..base + n * self.cols];
                base += n * self.cols;
                // SAFETY: AVX2 was detected; slices are bounds-checked
                // inside for [0, done).
                unsafe {
                    match n {
                        1 => avx2::dot::<1>(tables, srcs, group, done),
                        2 => avx2::dot::<2>(tables, srcs, group, done),
                        3 => avx2::dot::<3>(tables, srcs, group, done),
                        _ => avx2::dot::<4>(tables, srcs, group, done),
                    }
                }
            }
        }
        if done < len {
            self.scalar(srcs, outs, done);
        }
    }

    /// The portable loop over bytes [from, len).
    fn scalar(&self, srcs: &[&[u8]], outs: &mut [&mut [u8]], from: usize) {
        for (i, out) in outs.iter_mut().enumerate() {
            let out = &mut out[from..];
            for (j, src) in srcs.iter().enumerate() {
                let t = &gf::MUL[self.coeffs[i * self.cols + j] as usize];
                let src = &src[from..];
                if j == 0 {
                    for (d, s) in out.iter_mut().zip(src) {
                        *d = t[*s as usize];
                    }
                } else {
                    for (d, s) in out.iter_mut().zip(src) {
                        *d ^= t[*s as usize];
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// outs[r][..len] = sum_j c[r][j] * srcs[j][..len] for N rows; len is a
    /// multiple of 32. `tables[j * N + r]` holds row r's nibble products
    /// for source j.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot<const N: usize>(
        tables: &[[u8; 32]],
        srcs: &[&[u8]],
        outs: &mut [&mut [u8]],
        len: usize,
    ) {
        debug_assert_eq!(len % 32, 0);
        assert_eq!(tables.len(), N * srcs.len());
        assert_eq!(outs.len(), N);
        for s in srcs {
            assert!(s.len() >= len);
        }
        for o in outs.iter() {
            assert!(o.len() >= len);
        }
        // Broadcast each 16-byte table to both 128-bit lanes once.
        let mut lo: Vec<__m256i> = Vec::with_capacity(tables.len());
        let mut hi: Vec<__m256i> = Vec::with_capacity(tables.len());
        for t in tables {
            let l = _mm_loadu_si128(t.as_ptr() as *const __m128i);
            let h = _mm_loadu_si128(t.as_ptr().add(16) as *const __m128i);
            lo.push(_mm256_broadcastsi128_si256(l));
            hi.push(_mm256_broadcastsi128_si256(h));
        }
        let mask = _mm256_set1_epi8(0x0f);
        let optr: Vec<*mut u8> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        let sptr: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr()).collect();
        let mut pos = 0;
        while pos < len {
            let mut acc = [_mm256_setzero_si256(); N];
            for (j, sp) in sptr.iter().enumerate() {
                let v = _mm256_loadu_si256(sp.add(pos) as *const __m256i);
                let vl = _mm256_and_si256(v, mask);
                let vh = _mm256_and_si256(_mm256_srli_epi64(v, 4), mask);
                for (r, a) in acc.iter_mut().enumerate() {
                    let t = j * N + r;
                    let p = _mm256_xor_si256(
                        _mm256_shuffle_epi8(*lo.get_unchecked(t), vl),
                        _mm256_shuffle_epi8(*hi.get_unchecked(t), vh),
                    );
                    *a = _mm256_xor_si256(*a, p);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_si256(optr[r].add(pos) as *mut __m256i, *a);
            }
            pos += 32;
        }
    }
}

/// outs packets = bit-matrix product of srcs packets, as jerasure's
/// Cauchy techniques encode: each chunk is a run of blocks of 8 packets of
/// `packetsize` bytes; in each block, packet l of output i is the XOR of the
/// source packets x of chunk j for which bit (i*8+l, j*8+x) is set.
pub struct BitPlan {
    /// For each output bit row: the (source, packet) pairs to XOR.
    terms: Vec<Vec<(usize, usize)>>,
    rows: usize,
    cols: usize,
    packetsize: usize,
}

impl BitPlan {
    pub fn new(m: &Matrix, packetsize: usize) -> BitPlan {
        let bits = crate::matrix::to_bitmatrix(m);
        let terms = bits
            .iter()
            .map(|row| {
                row.iter()
                    .enumerate()
                    .filter(|(_, &on)| on)
                    .map(|(c, _)| (c / 8, c % 8))
                    .collect()
            })
            .collect();
        BitPlan {
            terms,
            rows: m.rows,
            cols: m.cols,
            packetsize,
        }
    }

    /// Chunk lengths must be multiples of 8 * packetsize.
    pub fn block(&self) -> usize {
        8 * self.packetsize
    }

    pub fn run(&self, srcs: &[&[u8]], outs: &mut [&mut [u8]]) {
        assert_eq!(srcs.len(), self.cols);
        assert_eq!(outs.len(), self.rows);
        let len = srcs.first().map_or(0, |s| s.len());
        let ps = self.packetsize;
        let block = self.block();
        assert_eq!(len % block, 0);
        for b in (0..len).step_by(block) {
            for (i, out) in outs.iter_mut().enumerate() {
                for l in 0..8 {
                    let d = &mut out[b + l * ps..b + (l + 1) * ps];
                    let terms = &self.terms[i * 8 + l];
                    match terms.split_first() {
                        None => d.fill(0),
                        Some((&(j, x), rest)) => {
                            d.copy_from_slice(&srcs[j][b + x * ps..b + (x + 1) * ps]);
                            for &(j, x) in rest {
                                xor_into(d, &srcs[j][b + x * ps..b + (x + 1) * ps]);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[inline]
fn xor_into(d: &mut [u8], s: &[u8]) {
    for (a, b) in d.iter_mut().zip(s) {
        *a ^= *b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(m: &Matrix, srcs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        (0..m.rows)
            .map(|i| {
                (0..srcs[0].len())
                    .map(|p| (0..m.cols).fold(0u8, |acc, j| acc ^ gf::mul(m.get(i, j), srcs[j][p])))
                    .collect()
            })
            .collect()
    }

    fn pseudo(n: usize, seed: u64) -> Vec<u8> {
        iolift_testkit::random_bytes(n, seed)
    }

    #[test]
    fn native_matches_definition() {
        for (rows, cols, len) in [(1, 2, 31), (4, 8, 4096 + 17), (6, 5, 100), (3, 12, 64)] {
            let m = Matrix {
                rows,
                cols,
                data: pseudo(rows * cols, 7),
            };
            let srcs: Vec<Vec<u8>> = (0..cols).map(|j| pseudo(len, j as u64 + 1)).collect();
            let want = slow(&m, &srcs);
            for simd in [false, true] {
                let plan = NativePlan::new(&m, simd);
                let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
                let mut outs = vec![vec![0xaau8; len]; rows];
                let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|s| s.as_mut_slice()).collect();
                plan.run(&refs, &mut o);
                assert_eq!(outs, want, "rows={rows} cols={cols} len={len} simd={simd}");
            }
        }
    }
}
