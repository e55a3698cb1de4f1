//! Bounded per-key accounts split in independently locked shards: what a layer that updates a
//! key's account on every event keeps them in.
//!
//! Behind one lock the runtime's workers queue for each other on every event, and a full map
//! makes room with a pass over its entries while holding the lock, which stalls every other
//! event for that long. Split by tag, two workers rarely meet in one shard and a pass covers a
//! shard. A small capacity keeps one shard, so what the accounts remember is exactly what it
//! was unsplit.

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use crate::hashing::TagMap;

/// The fewest entries a shard is given: below this, splitting saves nothing worth the larger
/// share of entries forgotten early (each shard makes room on its own).
const MIN_SHARD_CAPACITY: usize = 1024;

/// The most shards: enough that a few workers rarely meet.
const MAX_SHARDS: usize = 16;

/// Accounts by tag (a seeded 64-bit hash standing for a key), at most `capacity` of them over
/// all shards.
pub struct TagShards<V> {
    shards: Box<[CachePadded<Mutex<TagMap<V>>>]>,
    shard_capacity: usize,
}

impl<V> TagShards<V> {
    /// Room for `capacity` accounts (at least one).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let count = (capacity / MIN_SHARD_CAPACITY).clamp(1, MAX_SHARDS);
        Self {
            shards: (0..count)
                .map(|_| CachePadded::new(Mutex::new(TagMap::default())))
                .collect(),
            shard_capacity: capacity / count,
        }
    }

    /// The most accounts one shard may hold; a shard making room keeps no more than this.
    #[must_use]
    pub fn shard_capacity(&self) -> usize {
        self.shard_capacity
    }

    /// The shard holding `tag`'s account, locked. Its upper half chooses: the map folds the
    /// halves together for its buckets, so one shard's tags still spread over all of them.
    pub fn lock(&self, tag: u64) -> MutexGuard<'_, TagMap<V>> {
        let index = (tag >> 32) as usize % self.shards.len();
        self.shards[index].lock()
    }

    /// Accounts held over all shards.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    /// True when no account is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tags held, in no particular order (for tests and diagnostics).
    #[must_use]
    pub fn tags(&self) -> Vec<u64> {
        self.shards
            .iter()
            .flat_map(|shard| shard.lock().keys().copied().collect::<Vec<_>>())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_capacities_keep_one_shard_with_all_of_it() {
        let shards = TagShards::<u8>::new(8);
        assert_eq!(shards.shards.len(), 1);
        assert_eq!(shards.shard_capacity(), 8);
    }

    #[test]
    fn large_capacities_split_without_exceeding_the_total() {
        let shards = TagShards::<u8>::new(8192);
        assert_eq!(shards.shards.len(), 8);
        assert_eq!(shards.shard_capacity(), 1024);
        let huge = TagShards::<u8>::new(1 << 20);
        assert_eq!(huge.shards.len(), MAX_SHARDS);
        assert!(huge.shard_capacity() * MAX_SHARDS <= 1 << 20);
    }

    #[test]
    fn tags_spread_over_the_shards_and_are_found_again() {
        let shards = TagShards::<u64>::new(16 * 1024);
        let tags: Vec<u64> = (0..4096_u64)
            .map(|n| n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        for &tag in &tags {
            shards.lock(tag).insert(tag, tag);
        }
        assert_eq!(shards.len(), tags.len());
        for &tag in &tags {
            assert_eq!(shards.lock(tag).get(&tag), Some(&tag));
        }
        let busiest = shards.shards.iter().map(|shard| shard.lock().len()).max();
        assert!(
            busiest < Some(tags.len() / MAX_SHARDS * 2),
            "one shard holds {busiest:?} of {} tags",
            tags.len()
        );
    }
}
