//! The hasher of the pipeline's in-memory maps keyed by message key or partition, which are
//! looked up several times per event (key queues, scheduler, monopolization, defer cache).
//!
//! The standard library's `SipHash` was several percent of the consumer's CPU in profiles of the
//! throughput bench. foldhash is much cheaper on short strings and, seeded per map from a
//! random per-process seed, still keeps keys chosen by whoever produces the records from
//! being aimed at one bucket.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};

use prosody_api::digest::FoldedHasher;

/// A `HashMap` with the pipeline's fast seeded hasher. Build it with `KeyMap::default()`.
pub type KeyMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A map keyed by tags: seeded 64-bit hashes standing for keys (the scheduler's and
/// monopolization's per-key accounts). The tags are hashes already, so the map only folds
/// them; a lookup is one probe with no string to compare and nothing is cloned into it.
pub type TagMap<V> = HashMap<u64, V, BuildHasherDefault<FoldedHasher>>;

/// Forgets `count` arbitrary entries of `map`, in one pass over it rather than collecting
/// victims first: how a bounded map of per-key accounts makes room once the entries worth
/// keeping have been kept.
pub fn forget_any<K, V, S: BuildHasher>(map: &mut HashMap<K, V, S>, mut count: usize) {
    if count > 0 {
        map.retain(|_, _| {
            let forget = count > 0;
            count = count.saturating_sub(1);
            !forget
        });
    }
}
