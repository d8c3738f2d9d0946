//! A hasher for block numbers: one multiplication per key (Fibonacci
//! hashing). Block caches look a block number up on every read and write,
//! where the default SipHash shows in profiles; the keys are block numbers
//! (small, often clustered integers), which hashbrown's probing copes with.
//! Used by AccelFS's per-file cache and by the block cache stage.

use std::hash::{BuildHasherDefault, Hasher};

/// Multiplier of Fibonacci hashing (2^64 divided by the golden ratio).
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hasher; build maps with [`BlockHash`].
#[derive(Default, Clone, Copy)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(MUL);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(MUL);
    }
}

/// `HashMap<u64, V, BlockHash>`: a map keyed by block numbers.
pub type BlockHash = BuildHasherDefault<BlockHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_blocks_hash_apart() {
        let h = BlockHash::default();
        let hashes: HashSet<u64> = (0..4096u64).map(|n| h.hash_one(n)).collect();
        assert_eq!(hashes.len(), 4096, "no two block numbers collide");
        // the top bits (hashbrown's control bytes) differ between neighbours
        assert_ne!(h.hash_one(1u64) >> 57, h.hash_one(2u64) >> 57);
    }
}
