//! [`Rng`]: the seeded pseudo-random generator of the test suites.
//!
//! xorshift64* (Vigna): a 64-bit xorshift state whose output is multiplied
//! by an odd constant. The seed is spread over the state by a multiply with
//! the golden-ratio constant and forced odd, so every seed (0 included)
//! gives a usable, distinct stream. Fast and good enough to pick offsets,
//! sizes, weights and mutations; not for cryptography.
//!
//! The same seed gives the same stream on every machine and every run:
//! tests print their seed so that a failure can be replayed.

use std::ops::Range;

/// Seeded pseudo-random generator (xorshift64*); see the module docs.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next 32 random bits (the high half of [`Self::next_u64`], the
    /// better half of xorshift64*'s output).
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A number in `0..n`; 0 when `n` is 0 (so that callers may pass an
    /// empty length). Reduced by modulo: the bias, below n / 2^64, does not
    /// matter to a test.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// An index in `0..len`; 0 when `len` is 0. [`Self::below`] for `usize`.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// A number in `r` (start included, end excluded); `r.start` when the
    /// range is empty.
    pub fn range(&mut self, r: Range<u64>) -> u64 {
        r.start + self.below(r.end.saturating_sub(r.start))
    }

    /// True with probability `num / den` (`den` > 0).
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        assert!(den > 0, "chance: den must be > 0");
        self.below(den) < num
    }

    /// A float in `[0, 1)` with 53 random bits.
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Fills `buf` with random bytes: each [`Self::next_u64`] gives 8 bytes,
    /// little-endian (the last word is cut to what is left).
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let w = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }

    /// `n` random bytes (as [`Self::fill`]).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }

    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.index(i + 1);
            v.swap(i, j);
        }
    }

    /// A random element of `v`; None when it is empty.
    pub fn choose<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.index(v.len())])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..64).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        let b: Vec<u64> = (0..64).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        for seed in [0u64, 1, 8, u64::MAX] {
            let mut r = Rng::new(seed);
            let c: Vec<u64> = (0..64).map(|_| r.next_u64()).collect();
            assert_ne!(a, c, "seed {seed} gave seed 7's stream");
        }
        // Seed 0 is not a stuck state.
        let mut z = Rng::new(0);
        let first = z.next_u64();
        assert!((0..100).any(|_| z.next_u64() != first));
        assert_ne!(Rng::new(0).next_u64(), Rng::new(1).next_u64());
    }

    #[test]
    fn below_index_range_stay_in_bounds_and_reach_every_value() {
        let mut r = Rng::new(3);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let v = r.below(10);
            assert!(v < 10);
            seen[v as usize] += 1;
        }
        // Roughly uniform: each value about 1000 times.
        for (v, &n) in seen.iter().enumerate() {
            assert!((800..1200).contains(&n), "value {v} drawn {n} times");
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.index(0), 0);
        assert_eq!(r.below(1), 0);
        for _ in 0..1000 {
            let v = r.range(100..105);
            assert!((100..105).contains(&v), "{v}");
            assert!(r.index(3) < 3);
        }
        assert_eq!(r.range(9..9), 9);
        let hits = (0..10_000).filter(|_| r.chance(1, 4)).count();
        assert!(
            (2200..2800).contains(&hits),
            "chance 1/4 hit {hits} of 10000"
        );
    }

    #[test]
    fn f64_is_in_unit_interval_and_spread() {
        let mut r = Rng::new(11);
        let v: Vec<f64> = (0..10_000).map(|_| r.f64()).collect();
        assert!(v.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!((0.47..0.53).contains(&mean), "mean {mean}");
        assert!(v.iter().any(|&x| x < 0.01) && v.iter().any(|&x| x > 0.99));
    }

    #[test]
    fn fill_is_the_word_stream_little_endian() {
        let mut words = Rng::new(5);
        let want: Vec<u8> = (0..3)
            .flat_map(|_| words.next_u64().to_le_bytes())
            .take(21)
            .collect();
        let mut r = Rng::new(5);
        let mut got = vec![0u8; 21];
        r.fill(&mut got);
        assert_eq!(got, want);
        assert_eq!(Rng::new(5).bytes(21), want);
        assert_ne!(Rng::new(6).bytes(21), want);
    }

    #[test]
    fn shuffle_permutes_and_choose_picks_members() {
        let mut r = Rng::new(9);
        let mut v: Vec<u32> = (0..100).collect();
        r.shuffle(&mut v);
        assert_ne!(v, (0..100).collect::<Vec<_>>(), "shuffle left the order");
        let mut s = v.clone();
        s.sort_unstable();
        assert_eq!(s, (0..100).collect::<Vec<_>>(), "shuffle lost elements");
        let empty: [u32; 0] = [];
        assert_eq!(r.choose(&empty), None);
        let pick: Vec<u32> = (0..200).map(|_| *r.choose(&[1, 2, 3]).unwrap()).collect();
        for want in [1, 2, 3] {
            assert!(pick.contains(&want), "{want} never chosen");
        }
    }
}
