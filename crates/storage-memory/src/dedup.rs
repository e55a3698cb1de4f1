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

/// Dedup records in memory, expiring on the given clock.
#[derive(Clone, Debug)]
pub struct MemoryDedupStore {
    clock: Arc<dyn Clock>,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    scopes: Scopes,
    /// Records held over every scope.
    len: usize,
    sweep: SweepSchedule,
}

impl Inner {
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
            inner: Arc::new(Mutex::new(Inner {
                scopes: Scopes::default(),
                len: 0,
                sweep: SweepSchedule::new(),
            })),
        }
    }

    /// Number of records held, expired or not (for tests of the sweep).
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.lock().len
    }

    /// True when no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything is in memory behind one lock: nothing ever waits.
impl ImmediateDedupStore for MemoryDedupStore {
    fn insert_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let expiries = match inner.scopes.get_mut(scope) {
            Some(expiries) => expiries,
            None => inner.scopes.entry(scope.clone()).or_default(),
        };
        if expiries
            .insert(record.fingerprint(), ttl.expires_at(now))
            .is_none()
        {
            inner.len += 1;
        }
        if inner.sweep.due(inner.len) {
            inner.sweep(now);
        }
        Ok(())
    }

    fn contains_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError> {
        // The clock is read only for a record that is there: most lookups miss.
        Ok(self
            .inner
            .lock()
            .scopes
            .get(scope)
            .and_then(|expiries| expiries.get(&record.fingerprint()))
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
