//! Words of 16 and 32 bits: jerasure's `reed_sol_van` and `reed_sol_r6_op`
//! with w = 16 or 32. The field is GF(2^16) with x^16 + x^12 + x^3 + x + 1
//! (0x1100b) or GF(2^32) with x^32 + x^22 + x^2 + x + 1 (0x400007), the
//! polynomials gf-complete uses by default; a chunk is a run of
//! little-endian words, each multiplied as one field element.

use crate::matrix::Field;

/// GF(2^w) for w = 16 or 32.
#[derive(Clone, Copy, Debug)]
pub struct Wide {
    pub w: usize,
    /// The reducing polynomial without its x^w bit.
    poly: u32,
}

impl Wide {
    pub fn new(w: usize) -> Wide {
        let poly = match w {
            16 => 0x100b,
            32 => 0x0040_0007,
            _ => panic!("GF(2^{w}) is not supported"),
        };
        Wide { w, poly }
    }

    fn top(&self) -> u32 {
        1u32 << (self.w - 1)
    }

    /// Bytes per word.
    pub fn bytes(&self) -> usize {
        self.w / 8
    }
}

impl Field for Wide {
    fn mul(&self, mut a: u32, mut b: u32) -> u32 {
        let mut r = 0u32;
        let mask = if self.w == 32 {
            u32::MAX
        } else {
            (1u32 << self.w) - 1
        };
        while b != 0 {
            if b & 1 != 0 {
                r ^= a;
            }
            let carry = a & self.top() != 0;
            a = (a << 1) & mask;
            if carry {
                a ^= self.poly;
            }
            b >>= 1;
        }
        r
    }

    /// a^(2^w - 2).
    fn inv(&self, a: u32) -> u32 {
        assert!(a != 0, "GF(2^w): zero has no inverse");
        let mut e: u64 = (1u64 << self.w) - 2;
        let (mut r, mut x) = (1u32, a);
        while e != 0 {
            if e & 1 != 0 {
                r = self.mul(r, x);
            }
            x = self.mul(x, x);
            e >>= 1;
        }
        r
    }
}

/// jerasure's RAID-6 Q row in GF(2^w): 2^j.
pub fn r6_rows(f: &Wide, k: usize) -> Vec<u32> {
    let mut rows = vec![1u32; 2 * k];
    let mut p = 1u32;
    for q in rows[k..].iter_mut() {
        *q = p;
        p = f.mul(p, 2);
    }
    rows
}

/// A rows x cols matrix over GF(2^w) prepared for chunks: per coefficient,
/// w/8 tables of 256 products (c times byte b in byte position i), so a
/// word is multiplied with w/8 lookups.
pub struct WidePlan {
    rows: usize,
    cols: usize,
    bytes: usize,
    tables: Vec<[u32; 256]>,
}

impl WidePlan {
    pub fn new(f: &Wide, rows: usize, cols: usize, coeffs: &[u32]) -> WidePlan {
        assert_eq!(coeffs.len(), rows * cols);
        let bytes = f.bytes();
        let mut tables = Vec::with_capacity(coeffs.len() * bytes);
        for &c in coeffs {
            for i in 0..bytes {
                let mut t = [0u32; 256];
                for (b, e) in t.iter_mut().enumerate() {
                    *e = f.mul(c, (b as u32) << (8 * i));
                }
                tables.push(t);
            }
        }
        WidePlan {
            rows,
            cols,
            bytes,
            tables,
        }
    }

    /// Word size in bytes: chunk lengths must be multiples of it.
    pub fn word(&self) -> usize {
        self.bytes
    }

    pub fn run(&self, srcs: &[&[u8]], outs: &mut [&mut [u8]]) {
        assert_eq!(srcs.len(), self.cols);
        assert_eq!(outs.len(), self.rows);
        let n = self.bytes;
        let len = srcs.first().map_or(0, |s| s.len());
        assert!(len.is_multiple_of(n));
        for (i, out) in outs.iter_mut().enumerate() {
            for (p, dst) in out.chunks_exact_mut(n).enumerate() {
                let mut acc = 0u32;
                for (j, src) in srcs.iter().enumerate() {
                    let t = &self.tables[(i * self.cols + j) * n..(i * self.cols + j + 1) * n];
                    for (b, tb) in src[p * n..(p + 1) * n].iter().zip(t) {
                        acc ^= tb[*b as usize];
                    }
                }
                dst.copy_from_slice(&acc.to_le_bytes()[..n]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverses_and_tables() {
        for w in [16, 32] {
            let f = Wide::new(w);
            for a in [1u32, 2, 3, 0x1234, 0xfffe, 0xdead] {
                assert_eq!(f.mul(a, f.inv(a)), 1, "w={w} a={a}");
            }
            let c = 0x9abc;
            let plan = WidePlan::new(&f, 1, 1, &[c]);
            let x = 0x4321u32;
            let src = x.to_le_bytes();
            let mut out = vec![0u8; f.bytes()];
            plan.run(&[&src[..f.bytes()]], &mut [&mut out[..]]);
            let mut want = [0u8; 4];
            want.copy_from_slice(&f.mul(c, x).to_le_bytes());
            assert_eq!(out, &want[..f.bytes()]);
        }
    }
}
