//! [`MemoryDedupStore`].
//!
//! Records are kept as 128-bit digests of (scope, record) rather than their strings: a
//! consumer inserts one record per handled message, so the strings would cost five
//! allocations per insert, five more per lookup (to build the owned key), and a few hundred
//! bytes per record held. Two independently seeded 64-bit hashes make a collision (which would
//! skip a message) vanishingly unlikely, the same argument as the pipeline's dedup cache.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::digest::{DigestMap, Digester};
use prosody_api::storage::{DedupRecord, DedupStore, PartitionScope, Ttl};
use prosody_api::{Clock, StorageError};

use crate::sweep::SweepSchedule;

/// Dedup records in memory, expiring on the given clock.
#[derive(Clone, Debug)]
pub struct MemoryDedupStore {
    clock: Arc<dyn Clock>,
    /// Outside the lock: digesting is most of an operation's work, and every partition's
    /// handlers share this one lock.
    digester: Digester,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    expiries: DigestMap<SystemTime>,
    sweep: SweepSchedule,
}

impl MemoryDedupStore {
    fn digest(&self, scope: &PartitionScope, record: &DedupRecord) -> u128 {
        let fields = (
            scope.group.as_str(),
            scope.topic.as_str(),
            scope.partition.0,
            record.key.as_str(),
            record.id.as_str(),
            &*record.version,
        );
        self.digester.digest(fields)
    }
}

impl MemoryDedupStore {
    /// An empty store judging expiry by `clock`.
    pub fn new(clock: impl Clock + 'static) -> Self {
        Self {
            clock: Arc::new(clock),
            digester: Digester::default(),
            inner: Arc::new(Mutex::new(Inner {
                expiries: DigestMap::default(),
                sweep: SweepSchedule::new(),
            })),
        }
    }

    /// Number of records held, expired or not (for tests of the sweep).
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.lock().expiries.len()
    }

    /// True when no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl DedupStore for MemoryDedupStore {
    async fn insert(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        let now = self.clock.now();
        let digest = self.digest(scope, record);
        let mut inner = self.inner.lock();
        inner.expiries.insert(digest, ttl.expires_at(now));
        if inner.sweep.due(inner.expiries.len()) {
            inner.expiries.retain(|_, expiry| now < *expiry);
            let len = inner.expiries.len();
            inner.sweep.swept(len);
        }
        Ok(())
    }

    async fn contains(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord,
    ) -> Result<bool, StorageError> {
        let now = self.clock.now();
        let digest = self.digest(scope, record);
        Ok(self
            .inner
            .lock()
            .expiries
            .get(&digest)
            .is_some_and(|expiry| now < *expiry))
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
