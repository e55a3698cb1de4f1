//! 128-bit keyed digests for in-process sets of records seen (dedup), and the hasher for maps
//! keyed by them.
//!
//! A keyed 128-bit `SipHash` makes a digest whose collisions are negligible for the sizes a
//! process holds, so a set can keep 16 bytes per record instead of its strings. One pass of the
//! 128-bit variant costs half of what two independently seeded 64-bit hashes did (the digest
//! was a few percent of the consumer's CPU in the throughput bench). Keys are random per
//! process: digests are never stored or sent anywhere.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::LazyLock;

use siphasher::sip128::SipHasher13;

/// Digests values with a 128-bit `SipHash` keyed at construction.
#[derive(Clone, Debug)]
pub struct Digester {
    keys: (u64, u64),
}

impl Default for Digester {
    fn default() -> Self {
        // The standard library's per-process random keys, drawn through its hasher: no
        // randomness source of our own to get wrong.
        let state = RandomState::new();
        Self {
            keys: (state.hash_one(0_u8), state.hash_one(1_u8)),
        }
    }
}

/// The process's shared digester, for digests that several components must agree on.
static SHARED: LazyLock<Digester> = LazyLock::new(Digester::default);

impl Digester {
    /// The digester every caller in the process shares: two components digesting the same
    /// value get the same digest, so one can reuse what the other computed.
    #[must_use]
    pub fn shared() -> &'static Self {
        &SHARED
    }

    /// The 128-bit digest of `value`.
    #[must_use]
    pub fn digest(&self, value: impl Hash) -> u128 {
        let mut hasher = Gathering::new(SipHasher13::new_with_keys(self.keys.0, self.keys.1));
        value.hash(&mut hasher);
        hasher.finish128()
    }
}

/// Bytes gathered before `SipHash` sees them: a value's `Hash` makes many small writes (each
/// string is its bytes and a terminator), and `SipHash` pays for every call's partial-block
/// bookkeeping; copying them into one buffer first halves a typical record's digest. The
/// digest is the same either way (`SipHash` of a stream does not depend on how it was split).
struct Gathering {
    buffer: [u8; 128],
    len: usize,
    sip: SipHasher13,
}

impl Gathering {
    fn new(sip: SipHasher13) -> Self {
        Self {
            buffer: [0; 128],
            len: 0,
            sip,
        }
    }

    fn flush(&mut self) {
        self.sip.write(&self.buffer[..self.len]);
        self.len = 0;
    }

    /// The digest of everything written. What is still gathered is hashed in one pass over
    /// whole words (`SipHasher13::hash`), without the streaming writer's carrying of a partial
    /// word between writes: the same digest for a fraction of the instructions.
    fn finish128(self) -> u128 {
        self.sip.hash(&self.buffer[..self.len]).as_u128()
    }
}

impl Hasher for Gathering {
    fn finish(&self) -> u64 {
        // Only `finish128` is used; a 64-bit answer over what was gathered so far would need
        // a copy of the state, so this one is derived the same way.
        let mut sip = self.sip;
        sip.write(&self.buffer[..self.len]);
        sip.finish()
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > self.buffer.len() {
            self.flush();
            if bytes.len() > self.buffer.len() {
                self.sip.write(bytes);
                return;
            }
        }
        self.buffer[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn write_u8(&mut self, byte: u8) {
        // Every string ends with one (its terminator): a store, not a slice copy.
        if self.len == self.buffer.len() {
            self.flush();
        }
        self.buffer[self.len] = byte;
        self.len += 1;
    }
}

/// A map keyed by digests.
pub type DigestMap<V> = HashMap<u128, V, BuildHasherDefault<FoldedHasher>>;

/// A set of digests.
pub type DigestSet = HashSet<u128, BuildHasherDefault<FoldedHasher>>;

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

    fn write_u64(&mut self, value: u64) {
        // A small number kept beside a digest (an epoch, say): mixed in whole.
        self.0 = self.0.rotate_left(8) ^ value;
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
    use siphasher::sip128::Hasher128;

    use super::*;

    #[test]
    fn equal_values_share_a_digest_and_different_ones_do_not() {
        let digester = Digester::default();
        assert_eq!(digester.digest(("a", 1)), digester.digest(("a", 1)));
        assert_ne!(digester.digest(("a", 1)), digester.digest(("a", 2)));
        assert_ne!(digester.digest(("ab", "c")), digester.digest(("a", "bc")));
    }

    #[test]
    fn gathering_writes_first_digests_as_siphash_of_the_whole_stream() {
        let digester = Digester::default();
        let long = "x".repeat(300);
        // Exactly a buffer: its terminator finds the buffer full.
        let full = "y".repeat(128);
        for value in [
            ("a", 1_u32, "b"),
            ("", 0, ""),
            (long.as_str(), 7, long.as_str()),
            (full.as_str(), 8, "z"),
        ] {
            let mut direct = SipHasher13::new_with_keys(digester.keys.0, digester.keys.1);
            value.hash(&mut direct);
            assert_eq!(digester.digest(value), direct.finish128().as_u128());
        }
    }
}
