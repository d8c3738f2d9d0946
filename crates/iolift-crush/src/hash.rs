//! Bob Jenkins' hashes as used by Ceph: `crush_hash32_*` (rjenkins1, 1996
//! mix) and `ceph_str_hash_rjenkins` (lookup2 string hash).
//!
//! All arithmetic is on `u32` with wrap-around; negative ids are hashed as
//! their two's-complement bit pattern.

const SEED: u32 = 1_315_423_911;
const XC: u32 = 231_232;
const YC: u32 = 1_232;

#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 13);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 8);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 13);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 12);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 16);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 5);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 3);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 10);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 15);
}

/// `crush_hash32_rjenkins1(a)`.
pub fn hash32(a: u32) -> u32 {
    let (mut a, mut b, mut h) = (a, a, SEED ^ a);
    let (mut x, mut y) = (XC, YC);
    mix(&mut b, &mut x, &mut h);
    mix(&mut y, &mut a, &mut h);
    h
}

/// `crush_hash32_rjenkins1_2(a, b)`.
#[inline(always)]
pub fn hash32_2(a: u32, b: u32) -> u32 {
    let (mut a, mut b, mut h) = (a, b, SEED ^ a ^ b);
    let (mut x, mut y) = (XC, YC);
    mix(&mut a, &mut b, &mut h);
    mix(&mut x, &mut a, &mut h);
    mix(&mut b, &mut y, &mut h);
    h
}

/// `crush_hash32_rjenkins1_3(a, b, c)`.
#[inline(always)]
pub fn hash32_3(a: u32, b: u32, c: u32) -> u32 {
    let (mut a, mut b, mut c, mut h) = (a, b, c, SEED ^ a ^ b ^ c);
    let (mut x, mut y) = (XC, YC);
    mix(&mut a, &mut b, &mut h);
    mix(&mut c, &mut x, &mut h);
    mix(&mut y, &mut a, &mut h);
    mix(&mut b, &mut x, &mut h);
    mix(&mut y, &mut c, &mut h);
    h
}

/// `crush_hash32_rjenkins1_4(a, b, c, d)`.
#[inline(always)]
pub fn hash32_4(a: u32, b: u32, c: u32, d: u32) -> u32 {
    let (mut a, mut b, mut c, mut d, mut h) = (a, b, c, d, SEED ^ a ^ b ^ c ^ d);
    let (mut x, mut y) = (XC, YC);
    mix(&mut a, &mut b, &mut h);
    mix(&mut c, &mut d, &mut h);
    mix(&mut a, &mut x, &mut h);
    mix(&mut y, &mut b, &mut h);
    mix(&mut c, &mut x, &mut h);
    mix(&mut y, &mut d, &mut h);
    h
}

/// `crush_hash32_rjenkins1_5(a, b, c, d, e)`.
pub fn hash32_5(a: u32, b: u32, c: u32, d: u32, e: u32) -> u32 {
    let (mut a, mut b, mut c, mut d, mut e) = (a, b, c, d, e);
    let mut h = SEED ^ a ^ b ^ c ^ d ^ e;
    let (mut x, mut y) = (XC, YC);
    mix(&mut a, &mut b, &mut h);
    mix(&mut c, &mut d, &mut h);
    mix(&mut e, &mut x, &mut h);
    mix(&mut y, &mut a, &mut h);
    mix(&mut b, &mut x, &mut h);
    mix(&mut y, &mut c, &mut h);
    mix(&mut d, &mut x, &mut h);
    mix(&mut y, &mut e, &mut h);
    h
}

/// Lanes of the many-input hashes below: the mapper hashes every item of
/// a bucket with the same (x, r), so it computes them side by side. Plain
/// per-lane loops that the compiler turns into SIMD (SSE2: two 4-lane
/// registers per value); results equal the scalar hashes lane by lane.
pub const LANES: usize = 8;

type Lanes = [u32; LANES];

#[inline(always)]
fn mix_n<const N: usize>(a: &mut [u32; N], b: &mut [u32; N], c: &mut [u32; N]) {
    for i in 0..N {
        mix(&mut a[i], &mut b[i], &mut c[i]);
    }
}

/// `hash32_3(a[i], b[i], c[i])` for every lane `i` of `N`: the general
/// form of [`hash32_3_lanes`] (any lane count, any argument varying).
/// Compiled inside a function with wider vector units enabled (AVX2), the
/// same loops use them.
#[inline(always)]
pub fn hash32_3_n<const N: usize>(a: [u32; N], b: [u32; N], c: [u32; N]) -> [u32; N] {
    let (mut a, mut b, mut c) = (a, b, c);
    let mut h = [0; N];
    for i in 0..N {
        h[i] = SEED ^ a[i] ^ b[i] ^ c[i];
    }
    let (mut x, mut y) = ([XC; N], [YC; N]);
    mix_n(&mut a, &mut b, &mut h);
    mix_n(&mut c, &mut x, &mut h);
    mix_n(&mut y, &mut a, &mut h);
    mix_n(&mut b, &mut x, &mut h);
    mix_n(&mut y, &mut c, &mut h);
    h
}

/// `hash32_4(a[i], b[i], c[i], d[i])` for every lane `i` of `N`.
#[inline(always)]
pub fn hash32_4_n<const N: usize>(a: [u32; N], b: [u32; N], c: [u32; N], d: [u32; N]) -> [u32; N] {
    let (mut a, mut b, mut c, mut d) = (a, b, c, d);
    let mut h = [0; N];
    for i in 0..N {
        h[i] = SEED ^ a[i] ^ b[i] ^ c[i] ^ d[i];
    }
    let (mut x, mut y) = ([XC; N], [YC; N]);
    mix_n(&mut a, &mut b, &mut h);
    mix_n(&mut c, &mut d, &mut h);
    mix_n(&mut a, &mut x, &mut h);
    mix_n(&mut y, &mut b, &mut h);
    mix_n(&mut c, &mut x, &mut h);
    mix_n(&mut y, &mut d, &mut h);
    h
}

/// `hash32_3(a, b[i], c)` for every lane `i`.
#[inline(always)]
pub fn hash32_3_lanes(a: u32, b: &Lanes, c: u32) -> Lanes {
    hash32_3_n([a; LANES], *b, [c; LANES])
}

/// `hash32_4(a, b[i], c, d)` for every lane `i`.
#[inline(always)]
pub fn hash32_4_lanes(a: u32, b: &Lanes, c: u32, d: u32) -> Lanes {
    hash32_4_n([a; LANES], *b, [c; LANES], [d; LANES])
}

/// `ceph_str_hash_rjenkins`: lookup2 over the bytes with initval 0.
pub fn str_hash_rjenkins(key: &[u8]) -> u32 {
    let mut a: u32 = 0x9e37_79b9;
    let mut b: u32 = 0x9e37_79b9;
    let mut c: u32 = 0;
    let mut k = key;
    let word = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    while k.len() >= 12 {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        mix(&mut a, &mut b, &mut c);
        k = &k[12..];
    }
    c = c.wrapping_add(key.len() as u32);
    // Tail: bytes 8..10 go to c above its low byte, 4..7 to b, 0..3 to a.
    for (i, &byte) in k.iter().enumerate() {
        let v = byte as u32;
        match i {
            0..=3 => a = a.wrapping_add(v << (8 * i)),
            4..=7 => b = b.wrapping_add(v << (8 * (i - 4))),
            _ => c = c.wrapping_add(v << (8 * (i - 7))),
        }
    }
    mix(&mut a, &mut b, &mut c);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct() {
        assert_eq!(hash32_2(1, 2), hash32_2(1, 2));
        assert_ne!(hash32_2(1, 2), hash32_2(2, 1));
        assert_ne!(hash32_3(0, 0, 0), hash32_3(0, 0, 1));
        assert_ne!(hash32_4(0, 0, 0, 0), hash32_4(1, 0, 0, 0));
        assert_ne!(str_hash_rjenkins(b"foo"), str_hash_rjenkins(b"bar"));
    }

    #[test]
    fn lanes_equal_scalar() {
        let mut v = 0x1234_5678u32;
        for _ in 0..10_000 {
            let mut b = [0u32; LANES];
            for l in b.iter_mut() {
                v = v.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *l = v;
            }
            let (a, c, d) = (v.rotate_left(7), v ^ 0xdead_beef, v.rotate_right(3));
            let h3 = hash32_3_lanes(a, &b, c);
            let h4 = hash32_4_lanes(a, &b, c, d);
            for i in 0..LANES {
                assert_eq!(h3[i], hash32_3(a, b[i], c));
                assert_eq!(h4[i], hash32_4(a, b[i], c, d));
            }
            // Every argument varying, other lane counts.
            let (b4, c4, d4) = (
                [b[0], b[1], b[2], b[3]],
                [b[4], b[5], b[6], b[7]],
                [a, c, d, v],
            );
            let h3 = hash32_3_n(d4, b4, c4);
            let h4 = hash32_4_n(c4, d4, b4, c4);
            for i in 0..4 {
                assert_eq!(h3[i], hash32_3(d4[i], b4[i], c4[i]));
                assert_eq!(h4[i], hash32_4(c4[i], d4[i], b4[i], c4[i]));
            }
            let b16: [u32; 16] = std::array::from_fn(|i| b[i % 8].rotate_left(i as u32));
            let h16 = hash32_4_n([a; 16], b16, [c; 16], b16);
            for i in 0..16 {
                assert_eq!(h16[i], hash32_4(a, b16[i], c, b16[i]));
            }
        }
    }
}
