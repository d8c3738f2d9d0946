//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1
//! (0x11d), the field both jerasure (through gf-complete) and ISA-L use for
//! w = 8. All tables are built at compile time.

/// The reducing polynomial, with its x^8 bit.
pub const POLY: u16 = 0x11d;

const fn build_exp_log() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // exp[510], exp[511] are never read: log sums stay below 509.
    (exp, log)
}

const EXP_LOG: ([u8; 512], [u8; 256]) = build_exp_log();
/// `EXP[i]` = 2^i, for i in 0..510 (doubled so sums of two logs need no reduction).
pub static EXP: [u8; 512] = EXP_LOG.0;
/// `LOG[x]` = i with 2^i = x, for x != 0 (`LOG[0]` is meaningless).
pub static LOG: [u8; 256] = EXP_LOG.1;

const fn build_mul() -> [[u8; 256]; 256] {
    let (exp, log) = build_exp_log();
    let mut t = [[0u8; 256]; 256];
    let mut a = 1;
    while a < 256 {
        let mut b = 1;
        while b < 256 {
            t[a][b] = exp[log[a] as usize + log[b] as usize];
            b += 1;
        }
        a += 1;
    }
    t
}

/// Full product table: `MUL[a][b]` = a * b.
pub static MUL: [[u8; 256]; 256] = build_mul();

/// a * b.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

/// The multiplicative inverse of a non-zero element.
///
/// # Panics
/// On zero, which has no inverse.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "GF(2^8): zero has no inverse");
    EXP[255 - LOG[a as usize] as usize]
}

/// a / b for b != 0.
#[inline]
pub fn div(a: u8, b: u8) -> u8 {
    mul(a, inv(b))
}

/// Number of ones in the 8x8 bit matrix that multiplies by `e` (the sum of
/// the popcounts of e * 2^x for x in 0..8); jerasure's cauchy_good picks
/// coefficients that make this small, because each one costs an XOR of a
/// packet.
pub fn n_ones(e: u8) -> u32 {
    let mut n = 0;
    let mut v = e;
    for _ in 0..8 {
        n += v.count_ones();
        v = mul(v, 2);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less multiply reduced by POLY, bit by bit: the definition.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut r = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                r ^= a;
            }
            let hi = a & 0x80 != 0;
            a <<= 1;
            if hi {
                a ^= (POLY & 0xff) as u8;
            }
            b >>= 1;
        }
        r
    }

    #[test]
    fn tables_match_definition() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn inverses() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "{a}");
            assert_eq!(div(mul(a, 77), 77), a);
        }
    }

    #[test]
    fn generator_has_order_255() {
        let mut seen = [false; 256];
        for &e in &EXP[..255] {
            assert!(!seen[e as usize], "2 is not a generator");
            seen[e as usize] = true;
        }
        assert!(!seen[0]);
    }
}
