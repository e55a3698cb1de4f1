//! 128-bit keyed digests for in-process sets of records seen (dedup), and the hasher for maps
//! keyed by them.
//!
//! Two independently seeded hashes make a digest whose collisions are negligible for the sizes
//! a process holds, so a set can keep 16 bytes per record instead of its strings. Seeds are per
//! process: digests are never stored or sent anywhere.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};

/// Digests values with two hashers seeded at construction.
#[derive(Clone, Debug, Default)]
pub struct Digester {
    hashers: [RandomState; 2],
}

impl Digester {
    /// The 128-bit digest of `value`.
    #[must_use]
    pub fn digest(&self, value: impl Hash) -> u128 {
        let [high, low] = self
            .hashers
            .each_ref()
            .map(|hasher| hasher.hash_one(&value));
        (u128::from(high) << 64) | u128::from(low)
    }
}

/// A map keyed by digests.
pub type DigestMap<V> = HashMap<u128, V, BuildHasherDefault<FoldedHasher>>;

/// Hashes a digest by folding its halves: it is already a keyed hash, so hashing it again
/// would only cost time.
#[derive(Default)]
pub struct FoldedHasher(u64);

impl Hasher for FoldedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    #[allow(
        clippy::cast_possible_truncation,
        reason = "folding the halves is the point"
    )]
    fn write_u128(&mut self, digest: u128) {
        self.0 ^= (digest as u64) ^ ((digest >> 64) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_a_digest_and_different_ones_do_not() {
        let digester = Digester::default();
        assert_eq!(digester.digest(("a", 1)), digester.digest(("a", 1)));
        assert_ne!(digester.digest(("a", 1)), digester.digest(("a", 2)));
        assert_ne!(digester.digest(("ab", "c")), digester.digest(("a", "bc")));
    }
}
