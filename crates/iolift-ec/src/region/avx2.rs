//! The AVX2 dot product: outs[r] = sum_j c[r][j] * srcs[j] for up to
//! [`GROUP`](super::GROUP) rows in one pass over the sources. Each 32-byte
//! vector of a source is loaded once, split into its low and high nibbles,
//! and added into every row's accumulator with two `vpshufb` lookups (the
//! products of the coefficient with each nibble value). A first row whose
//! coefficients are all 1 (the first parity row of jerasure's and ISA-L's
//! matrices, the XOR of the data) is one XOR per vector instead. The loop
//! takes 64 bytes (two vectors) per source per step, so each table load
//! serves two vectors; a 32-byte step finishes lengths that are an odd
//! number of vectors. Each source is prefetched a few cache lines ahead,
//! which helps when the chunks come from L3 or memory (1 MiB chunks).
//! There are no branches in the loop: with eight accumulators, four nibble
//! vectors and two tables live, the sixteen AVX2 registers are just enough
//! (a data-dependent branch per coefficient made the compiler spill).
//! Only called after `is_x86_feature_detected!("avx2")`.

use super::Tab;
use std::arch::x86_64::*;

/// How far ahead (bytes) each source is prefetched: eight 64-byte steps.
const PREFETCH: usize = 512;

/// The nibbles of `v`: (low, high), each byte 0..16.
#[inline(always)]
unsafe fn split(v: __m256i, mask: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_and_si256(v, mask),
        _mm256_and_si256(_mm256_srli_epi64(v, 4), mask),
    )
}

/// c * v for the coefficient whose nibble products are `t`, with `v`
/// already split.
#[inline(always)]
unsafe fn mul(t: &Tab, (lo, hi): (__m256i, __m256i)) -> __m256i {
    let tl = _mm256_load_si256(t.0.as_ptr() as *const __m256i);
    let th = _mm256_load_si256(t.0.as_ptr().add(32) as *const __m256i);
    _mm256_xor_si256(_mm256_shuffle_epi8(tl, lo), _mm256_shuffle_epi8(th, hi))
}

/// outs[r][..len] for N rows; `len` is a multiple of 32. `tabs[j * N + r]`
/// is row r's coefficient for source j. With `XOR`, row 0's coefficients
/// are all 1 and its tables are not read. With `col0`, source 0's
/// coefficients are all 1 (every row of jerasure's and ISA-L's Vandermonde
/// parity starts with 1): the accumulators start as source 0.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn dot<const N: usize, const XOR: bool>(
    tabs: &[Tab],
    srcs: &[&[u8]],
    outs: &mut [&mut [u8]],
    len: usize,
    col0: bool,
) {
    assert_eq!(len % 32, 0);
    assert!(!srcs.is_empty());
    assert_eq!(tabs.len(), N * srcs.len());
    assert_eq!(outs.len(), N);
    assert!(srcs.iter().all(|s| s.len() >= len));
    assert!(outs.iter().all(|o| o.len() >= len));
    let mask = _mm256_set1_epi8(0x0f);
    let mut optr = [std::ptr::null_mut::<u8>(); N];
    for (p, o) in optr.iter_mut().zip(outs.iter_mut()) {
        *p = o.as_mut_ptr();
    }
    let first = usize::from(XOR);
    let from = usize::from(col0);
    let mut pos = 0;
    while pos + 64 <= len {
        let mut a0 = [_mm256_setzero_si256(); N];
        let mut a1 = [_mm256_setzero_si256(); N];
        if col0 {
            let p = srcs[0].as_ptr().add(pos);
            a0 = [_mm256_loadu_si256(p as *const __m256i); N];
            a1 = [_mm256_loadu_si256(p.add(32) as *const __m256i); N];
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
        }
        for (j, s) in srcs.iter().enumerate().skip(from) {
            let p = s.as_ptr().add(pos);
            let v0 = _mm256_loadu_si256(p as *const __m256i);
            let v1 = _mm256_loadu_si256(p.add(32) as *const __m256i);
            // A hint only: an address past the end does not fault.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
            if XOR {
                a0[0] = _mm256_xor_si256(a0[0], v0);
                a1[0] = _mm256_xor_si256(a1[0], v1);
            }
            let (s0, s1) = (split(v0, mask), split(v1, mask));
            let t = tabs.get_unchecked(j * N..j * N + N);
            for r in first..N {
                a0[r] = _mm256_xor_si256(a0[r], mul(&t[r], s0));
                a1[r] = _mm256_xor_si256(a1[r], mul(&t[r], s1));
            }
        }
        for r in 0..N {
            _mm256_storeu_si256(optr[r].add(pos) as *mut __m256i, a0[r]);
            _mm256_storeu_si256(optr[r].add(pos + 32) as *mut __m256i, a1[r]);
        }
        pos += 64;
    }
    if pos < len {
        let mut a = [_mm256_setzero_si256(); N];
        if col0 {
            a = [_mm256_loadu_si256(srcs[0].as_ptr().add(pos) as *const __m256i); N];
        }
        for (j, s) in srcs.iter().enumerate().skip(from) {
            let v = _mm256_loadu_si256(s.as_ptr().add(pos) as *const __m256i);
            if XOR {
                a[0] = _mm256_xor_si256(a[0], v);
            }
            let sv = split(v, mask);
            for r in first..N {
                a[r] = _mm256_xor_si256(a[r], mul(&tabs[j * N + r], sv));
            }
        }
        for r in 0..N {
            _mm256_storeu_si256(optr[r].add(pos) as *mut __m256i, a[r]);
        }
    }
}
