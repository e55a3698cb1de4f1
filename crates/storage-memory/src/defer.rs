//! [`MemoryDeferStore`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::storage::{DeferStore, DeferredMessage, DeferredTimer, PartitionScope};
use prosody_api::{Key, Offset, StorageError, TimerTime};

/// Seeded foldhash rather than `SipHash`: the pipeline asks for every key it has not cached,
/// and hashing the scope's strings with `SipHash` showed in the consumer's profile.
type Keys = HashMap<(PartitionScope, Key), Deferred, foldhash::fast::RandomState>;

/// Deferred messages and timers in memory.
#[derive(Clone, Debug, Default)]
pub struct MemoryDeferStore {
    keys: Arc<Mutex<Keys>>,
}

#[derive(Debug, Default)]
struct Deferred {
    messages: BTreeMap<Offset, u32>,
    timers: BTreeMap<TimerTime, u32>,
}

impl MemoryDeferStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn change(&self, scope: &PartitionScope, key: &Key, change: impl FnOnce(&mut Deferred)) {
        let mut keys = self.keys.lock();
        let index = (scope.clone(), key.clone());
        let deferred = keys.entry(index.clone()).or_default();
        change(deferred);
        if deferred.messages.is_empty() && deferred.timers.is_empty() {
            keys.remove(&index);
        }
    }

    fn read<T: Default>(
        &self,
        scope: &PartitionScope,
        key: &Key,
        read: impl FnOnce(&Deferred) -> T,
    ) -> T {
        self.keys
            .lock()
            .get(&(scope.clone(), key.clone()))
            .map(read)
            .unwrap_or_default()
    }
}

#[async_trait]
impl DeferStore for MemoryDeferStore {
    async fn deferred_keys(&self, scope: &PartitionScope) -> Result<Vec<Key>, StorageError> {
        // A scan of every scope's keys: the pipeline asks once per ownership of a partition,
        // and a map per scope would cost every other call a second lookup.
        Ok(self
            .keys
            .lock()
            .keys()
            .filter(|(stored, _)| stored == scope)
            .map(|(_, key)| key.clone())
            .collect())
    }

    async fn defer_message(
        &self,
        scope: &PartitionScope,
        key: &Key,
        message: DeferredMessage,
    ) -> Result<(), StorageError> {
        self.change(scope, key, |deferred| {
            deferred
                .messages
                .insert(message.offset, message.retry_count);
        });
        Ok(())
    }

    async fn deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredMessage>, StorageError> {
        Ok(self.read(scope, key, |deferred| {
            deferred
                .messages
                .iter()
                .map(|(&offset, &retry_count)| DeferredMessage {
                    offset,
                    retry_count,
                })
                .collect()
        }))
    }

    async fn remove_deferred_message(
        &self,
        scope: &PartitionScope,
        key: &Key,
        offset: Offset,
    ) -> Result<(), StorageError> {
        self.change(scope, key, |deferred| {
            deferred.messages.remove(&offset);
        });
        Ok(())
    }

    async fn clear_deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError> {
        self.change(scope, key, |deferred| deferred.messages.clear());
        Ok(())
    }

    async fn defer_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        timer: DeferredTimer,
    ) -> Result<(), StorageError> {
        self.change(scope, key, |deferred| {
            deferred.timers.insert(timer.time, timer.retry_count);
        });
        Ok(())
    }

    async fn deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredTimer>, StorageError> {
        Ok(self.read(scope, key, |deferred| {
            deferred
                .timers
                .iter()
                .map(|(&time, &retry_count)| DeferredTimer { time, retry_count })
                .collect()
        }))
    }

    async fn remove_deferred_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        self.change(scope, key, |deferred| {
            deferred.timers.remove(&time);
        });
        Ok(())
    }

    async fn clear_deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError> {
        self.change(scope, key, |deferred| deferred.timers.clear());
        Ok(())
    }
}
