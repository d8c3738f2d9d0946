//! Keys, values and random numbers of the benchmark, in db_bench's shape:
//! 16-byte decimal keys, values cut from a pool of compressible bytes
//! (half of each 100 bytes random, half a repeat of it), a fast seeded
//! generator.

/// db_bench's key: the number as 16 decimal digits.
pub fn key(k: u64) -> [u8; 16] {
    let mut b = [b'0'; 16];
    let mut v = k;
    for i in (0..16).rev() {
        b[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    b
}

/// xorshift64*: fast, seeded, good enough to pick keys.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The value pool: 1 MiB, or more for large values.
pub struct Values {
    pool: Vec<u8>,
    size: usize,
}

impl Values {
    pub fn new(size: usize, seed: u64) -> Values {
        let len = (1 << 20).max(2 * size + 1);
        let mut rng = Rng::new(seed ^ 0x5EED);
        let mut pool = Vec::with_capacity(len + 100);
        while pool.len() < len {
            let half: Vec<u8> = (0..50).map(|_| b' ' + (rng.below(95) as u8)).collect();
            pool.extend_from_slice(&half);
            pool.extend_from_slice(&half);
        }
        pool.truncate(len);
        Values { pool, size }
    }

    /// The value written with tag `tag` (each write has its own tag): a
    /// slice of the pool chosen by the tag, the tag in its first 4 bytes.
    pub fn value(&self, tag: u32) -> Vec<u8> {
        let span = (self.pool.len() - self.size) as u64;
        let at = (tag as u64).wrapping_mul(2_654_435_761) % span.max(1);
        let mut v = self.pool[at as usize..at as usize + self.size].to_vec();
        let t = tag.to_le_bytes();
        let n = self.size.min(4);
        v[..n].copy_from_slice(&t[..n]);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_values_and_rng() {
        assert_eq!(&key(1234), b"0000000000001234");
        assert_eq!(&key(0), b"0000000000000000");
        let v = Values::new(100, 1);
        assert_eq!(v.value(7).len(), 100);
        assert_eq!(v.value(7), v.value(7));
        assert_ne!(v.value(7), v.value(8));
        assert_eq!(&v.value(7)[..4], &7u32.to_le_bytes());
        let mut r = Rng::new(3);
        let draws: Vec<u64> = (0..1000).map(|_| r.below(10)).collect();
        assert!((0..10).all(|d| draws.contains(&d)), "covers 0..10");
        assert_eq!(Values::new(3, 1).value(0x0102_0304), vec![4, 3, 2]);
    }
}
