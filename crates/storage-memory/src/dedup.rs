//! [`MemoryDedupStore`].
//!
//! Records are kept per partition scope as their 128-bit fingerprints rather than their
//! strings: a consumer inserts one record per handled message, so the strings would cost
//! allocations per insert and lookup and a few hundred bytes per record held. The fingerprint
//! comes with the record ([`DedupRecord::fingerprint`], a keyed digest computed once per
//! message), so a lookup here hashes only the scope; a collision (which would skip a message) is
//! vanishingly unlikely, the same argument as the pipeline's recent set.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use prosody_api::digest::DigestMap;
use prosody_api::storage::{
    DedupRecord, DedupStore, ImmediateDedupStore, LookupCost, PartitionScope, Ttl,
};
use prosody_api::{Clock, StorageError};

use crate::sweep::SweepSchedule;

/// Expiry per record fingerprint, per scope. A scope hashes as its names' hashes, computed when
/// the names were made (see `prosody_api::Topic`); seeded foldhash mixes them.
type Scopes = HashMap<PartitionScope, DigestMap<SystemTime>, foldhash::fast::RandomState>;

/// Independently locked parts of the store. A consumer inserts a record per handled message
/// from every runtime worker at once, and an insert into a large table waits on cache misses
/// while it holds its lock: behind one lock the workers queued for each other (measured on two
/// cores: the store's lock the most contended in the consumer, about a tenth of its CPU in the
/// store). Records are spread over the shards by their fingerprints, which are keyed digests,
/// so the shards fill evenly and two workers rarely meet in one.
const SHARDS: usize = 16;

/// Dedup records in memory, expiring on the given clock.
#[derive(Clone, Debug)]
pub struct MemoryDedupStore {
    clock: Arc<dyn Clock>,
    shards: Arc<[CachePadded<Mutex<Shard>>; SHARDS]>,
}

/// The records whose fingerprints select this shard.
#[derive(Debug)]
struct Shard {
    scopes: Scopes,
    /// Records held over every scope of the shard.
    len: usize,
    sweep: SweepSchedule,
}

impl Shard {
    fn new() -> Self {
        Self {
            scopes: Scopes::default(),
            len: 0,
            // Each shard holds a share of the records, so it is worth sweeping at that share.
            sweep: SweepSchedule::with_minimum(SweepSchedule::MINIMUM / SHARDS),
        }
    }

    fn sweep(&mut self, now: SystemTime) {
        self.scopes.retain(|_, expiries| {
            expiries.retain(|_, expiry| now < *expiry);
            !expiries.is_empty()
        });
        self.len = self.scopes.values().map(HashMap::len).sum();
        self.sweep.swept(self.len);
    }
}

impl MemoryDedupStore {
    /// An empty store judging expiry by `clock`.
    pub fn new(clock: impl Clock + 'static) -> Self {
        Self {
            clock: Arc::new(clock),
            shards: Arc::new(std::array::from_fn(|_| {
                CachePadded::new(Mutex::new(Shard::new()))
            })),
        }
    }

    /// Number of records held, expired or not (for tests of the sweep).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len).sum()
    }

    /// True when no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard of a record: its fingerprint's upper half, which the tables' hasher folds
    /// into the lower, so a shard's records still spread over its tables' buckets.
    fn shard(&self, fingerprint: u128) -> &Mutex<Shard> {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "only the low bits of the upper half select a shard"
        )]
        let index = (fingerprint >> 64) as usize % SHARDS;
        &self.shards[index]
    }
}

/// Everything is in memory behind short locks: nothing ever waits for I/O.
impl ImmediateDedupStore for MemoryDedupStore {
    fn insert_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        let now = self.clock.now();
        let fingerprint = record.fingerprint();
        let mut shard = self.shard(fingerprint).lock();
        let expiries = match shard.scopes.get_mut(scope) {
            Some(expiries) => expiries,
            None => shard.scopes.entry(scope.clone()).or_default(),
        };
        if expiries.insert(fingerprint, ttl.expires_at(now)).is_none() {
            shard.len += 1;
        }
        if shard.sweep.due(shard.len) {
            shard.sweep(now);
        }
        Ok(())
    }

    fn contains_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError> {
        let fingerprint = record.fingerprint();
        // The clock is read only for a record that is there: most lookups miss.
        Ok(self
            .shard(fingerprint)
            .lock()
            .scopes
            .get(scope)
            .and_then(|expiries| expiries.get(&fingerprint))
            .is_some_and(|expiry| self.clock.now() < *expiry))
    }
}

#[async_trait]
impl DedupStore for MemoryDedupStore {
    fn lookup_cost(&self) -> LookupCost {
        LookupCost::InProcess
    }

    fn immediate(&self) -> Option<&dyn ImmediateDedupStore> {
        Some(self)
    }

    async fn insert(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        self.insert_now(scope, record, ttl)
    }

    async fn contains(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError> {
        self.contains_now(scope, record)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prosody_api::{ManualClock, Partition};

    use super::*;

    #[tokio::test]
    async fn expired_records_are_swept_as_the_store_grows() {
        let clock = ManualClock::new();
        let store = MemoryDedupStore::new(clock.clone());
        let scope = PartitionScope::new("g", "t", Partition(0));
        let ttl = Ttl::from_secs(1).unwrap();
        for id in 0..2000 {
            store
                .insert(&scope, &DedupRecord::new("k", id.to_string(), "1"), ttl)
                .await
                .unwrap();
            clock.advance(Duration::from_secs(1));
        }
        assert!(store.len() < 1100, "held {} records", store.len());
    }
}
