//! [`MemoryDedupStore`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::storage::{DedupRecord, DedupStore, PartitionScope, Ttl};
use prosody_api::{Clock, StorageError};

use crate::sweep::SweepSchedule;

/// Dedup records in memory, expiring on the given clock.
#[derive(Clone, Debug)]
pub struct MemoryDedupStore {
    clock: Arc<dyn Clock>,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    expiries: HashMap<(PartitionScope, DedupRecord), SystemTime>,
    sweep: SweepSchedule,
}

impl MemoryDedupStore {
    /// An empty store judging expiry by `clock`.
    pub fn new(clock: impl Clock + 'static) -> Self {
        Self {
            clock: Arc::new(clock),
            inner: Arc::new(Mutex::new(Inner {
                expiries: HashMap::new(),
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
        let mut inner = self.inner.lock();
        inner
            .expiries
            .insert((scope.clone(), record.clone()), ttl.expires_at(now));
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
        Ok(self
            .inner
            .lock()
            .expiries
            .get(&(scope.clone(), record.clone()))
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
