//! iolift's own region kernels: outs[i] = sum_j c[i][j] * srcs[j] over
//! GF(2^8), byte by byte. Two versions giving the same bytes: a portable
//! table-driven loop, and an AVX2 loop (`avx2.rs`, x86-64, picked at run
//! time) that multiplies 32 bytes at once with two 16-entry lookups per
//! coefficient (one for the low nibble of each byte, one for the high
//! nibble). Each source vector is loaded once and added into up to four
//! outputs held in registers, so a pass reads the data once for four
//! parity chunks. A first row of ones (jerasure's and ISA-L's first
//! parity row) is a plain XOR, and a first column of ones (their parity
//! rows all start with 1) is a copy of source 0 into the accumulators.

use crate::gf;
use crate::matrix::Matrix;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Outputs computed per pass over the sources.
const GROUP: usize = 4;

/// One coefficient's nibble products as the AVX2 kernel loads them: c * x
/// for the low nibble x = 0..16 in both 16-byte lanes, then c * (x << 4)
/// in both lanes.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Tab([u8; 64]);

impl Tab {
    fn new(c: u8) -> Tab {
        let mut t = [0u8; 64];
        for x in 0..16u8 {
            let (l, h) = (gf::mul(c, x), gf::mul(c, x << 4));
            t[x as usize] = l;
            t[16 + x as usize] = l;
            t[32 + x as usize] = h;
            t[48 + x as usize] = h;
        }
        Tab(t)
    }
}

/// A matrix prepared for the native kernels.
pub struct NativePlan {
    rows: usize,
    cols: usize,
    coeffs: Vec<u8>,
    /// Per group of up to GROUP rows, per source j, per row r in the
    /// group: the coefficient's tables.
    tabs: Vec<Tab>,
    /// Per group: its first row is all ones (XOR of the sources).
    xor_first: Vec<bool>,
    /// Per group: source 0's coefficients are all ones.
    ones_col0: Vec<bool>,
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
        let avx2 = simd && avx2_available();
        let mut tabs = Vec::new();
        let mut xor_first = Vec::new();
        let mut ones_col0 = Vec::new();
        if avx2 {
            tabs.reserve(m.rows * m.cols);
            for g in (0..m.rows).step_by(GROUP) {
                let end = (g + GROUP).min(m.rows);
                for j in 0..m.cols {
                    for r in g..end {
                        tabs.push(Tab::new(m.get(r, j)));
                    }
                }
                xor_first.push(m.row(g).iter().all(|&c| c == 1));
                ones_col0.push(m.cols > 0 && (g..end).all(|r| m.get(r, 0) == 1));
            }
        }
        NativePlan {
            rows: m.rows,
            cols: m.cols,
            coeffs: m.data.clone(),
            tabs,
            xor_first,
            ones_col0,
            avx2,
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
        if self.avx2 && self.cols > 0 {
            done = len / 32 * 32;
            let mut base = 0;
            for (g, group) in outs.chunks_mut(GROUP).enumerate() {
                let n = group.len();
                let end = base + n * self.cols;
                let t = &self.tabs[base..end];
                let c0 = self.ones_col0[g];
                base = end;
                // SAFETY: AVX2 was detected; dot checks the lengths.
                unsafe {
                    match (n, self.xor_first[g]) {
                        (1, false) => avx2::dot::<1, false>(t, srcs, group, done, c0),
                        (2, false) => avx2::dot::<2, false>(t, srcs, group, done, c0),
                        (3, false) => avx2::dot::<3, false>(t, srcs, group, done, c0),
                        (_, false) => avx2::dot::<4, false>(t, srcs, group, done, c0),
                        (1, true) => avx2::dot::<1, true>(t, srcs, group, done, c0),
                        (2, true) => avx2::dot::<2, true>(t, srcs, group, done, c0),
                        (3, true) => avx2::dot::<3, true>(t, srcs, group, done, c0),
                        (_, true) => avx2::dot::<4, true>(t, srcs, group, done, c0),
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
        // Lengths: whole 64-byte steps, an odd 32-byte vector at the end,
        // and a tail under 32 bytes for the portable loop. Some matrices
        // are mostly 0 and 1, with all-ones rows at the head of each group
        // of four (the kernel's XOR row) and/or an all-ones first column
        // (its accumulators starting as source 0).
        // (rows, cols, len, mostly 0/1, ones rows, ones column)
        let shapes = [
            (1, 2, 31, false, false, false),
            (4, 8, 4096 + 17, true, true, true),
            (6, 5, 100, false, false, false),
            (3, 12, 64, true, true, false),
            (2, 4, 96, false, false, true),
            (8, 10, 4096 + 32 + 5, true, false, true),
            (4, 6, 1024, false, true, false),
            (4, 12, 4096 + 32, false, true, true),
            (7, 9, 160, false, true, true),
        ];
        for (n, (rows, cols, len, sparse, ones_rows, ones_col)) in shapes.into_iter().enumerate() {
            let mut data = pseudo(rows * cols, 7 + n as u64);
            if sparse {
                for c in data.iter_mut() {
                    *c = match *c % 4 {
                        0 => 0,
                        1 | 2 => 1,
                        _ => *c,
                    };
                }
            }
            if ones_rows {
                for r in (0..rows).step_by(4) {
                    data[r * cols..(r + 1) * cols].fill(1);
                }
            }
            if ones_col {
                for r in 0..rows {
                    data[r * cols] = 1;
                }
            }
            let m = Matrix { rows, cols, data };
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
