//! [`MemoryTimerStore`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::storage::{PartitionScope, StoredTimer, TimerStore};
use prosody_api::{Key, SlabId, SlabSize, StorageError, TimerKind, TimerTime};

/// Timers in memory, indexed per key and per slab like a durable backend, so the slab contract
/// is exercised in mock mode too.
#[derive(Clone, Debug)]
pub struct MemoryTimerStore {
    slab_size: SlabSize,
    partitions: Arc<Mutex<HashMap<PartitionScope, Partition>>>,
}

#[derive(Debug, Default)]
struct Partition {
    by_key: HashMap<(Key, TimerKind), BTreeSet<TimerTime>>,
    by_slab: BTreeMap<SlabId, BTreeSet<StoredTimer>>,
}

impl Partition {
    fn insert(&mut self, size: SlabSize, key: &Key, kind: TimerKind, time: TimerTime) {
        self.by_key
            .entry((key.clone(), kind))
            .or_default()
            .insert(time);
        self.by_slab
            .entry(time.slab(size))
            .or_default()
            .insert(StoredTimer {
                time,
                key: key.clone(),
                kind,
            });
    }

    fn remove(&mut self, size: SlabSize, key: &Key, kind: TimerKind, time: TimerTime) {
        let index = (key.clone(), kind);
        if let Some(times) = self.by_key.get_mut(&index) {
            times.remove(&time);
            if times.is_empty() {
                self.by_key.remove(&index);
            }
        }
        let slab = time.slab(size);
        if let Some(timers) = self.by_slab.get_mut(&slab) {
            timers.remove(&StoredTimer {
                time,
                key: key.clone(),
                kind,
            });
            if timers.is_empty() {
                self.by_slab.remove(&slab);
            }
        }
    }

    fn clear(&mut self, size: SlabSize, key: &Key, kind: TimerKind) {
        let times = self
            .by_key
            .get(&(key.clone(), kind))
            .cloned()
            .unwrap_or_default();
        for time in times {
            self.remove(size, key, kind, time);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

impl MemoryTimerStore {
    /// An empty store bucketing by `slab_size`.
    #[must_use]
    pub fn new(slab_size: SlabSize) -> Self {
        Self {
            slab_size,
            partitions: Arc::default(),
        }
    }

    fn validate(operation: &'static str, time: TimerTime) -> Result<(), StorageError> {
        if time > TimerTime::MAX {
            return Err(StorageError::invalid_request(
                operation,
                format!("timer time {time} is beyond the latest storable time"),
            ));
        }
        Ok(())
    }

    fn with_partition<T>(
        &self,
        scope: &PartitionScope,
        change: impl FnOnce(&mut Partition) -> T,
    ) -> T {
        let mut partitions = self.partitions.lock();
        let partition = partitions.entry(scope.clone()).or_default();
        let result = change(partition);
        if partition.is_empty() {
            partitions.remove(scope);
        }
        result
    }
}

impl Default for MemoryTimerStore {
    fn default() -> Self {
        Self::new(SlabSize::DEFAULT)
    }
}

#[async_trait]
impl TimerStore for MemoryTimerStore {
    fn slab_size(&self) -> SlabSize {
        self.slab_size
    }

    async fn schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        Self::validate("timer.schedule", time)?;
        self.with_partition(scope, |partition| {
            partition.insert(self.slab_size, key, kind, time);
        });
        Ok(())
    }

    async fn clear_and_schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        Self::validate("timer.clear_and_schedule", time)?;
        self.with_partition(scope, |partition| {
            partition.clear(self.slab_size, key, kind);
            partition.insert(self.slab_size, key, kind, time);
        });
        Ok(())
    }

    async fn unschedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        self.with_partition(scope, |partition| {
            partition.remove(self.slab_size, key, kind, time);
        });
        Ok(())
    }

    async fn clear(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<(), StorageError> {
        self.with_partition(scope, |partition| {
            partition.clear(self.slab_size, key, kind);
        });
        Ok(())
    }

    async fn scheduled(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError> {
        let partitions = self.partitions.lock();
        Ok(partitions
            .get(scope)
            .and_then(|partition| partition.by_key.get(&(key.clone(), kind)))
            .map(|times| times.iter().copied().collect())
            .unwrap_or_default())
    }

    async fn slab(
        &self,
        scope: &PartitionScope,
        slab: SlabId,
    ) -> Result<Vec<StoredTimer>, StorageError> {
        let partitions = self.partitions.lock();
        Ok(partitions
            .get(scope)
            .and_then(|partition| partition.by_slab.get(&slab))
            .map(|timers| timers.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn slabs(
        &self,
        scope: &PartitionScope,
        until: SlabId,
    ) -> Result<Vec<SlabId>, StorageError> {
        let partitions = self.partitions.lock();
        Ok(partitions
            .get(scope)
            .map(|partition| {
                partition
                    .by_slab
                    .range(..=until)
                    .map(|(slab, _)| *slab)
                    .collect()
            })
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use prosody_api::Partition as KafkaPartition;

    use super::*;

    #[tokio::test]
    async fn emptied_partitions_are_dropped() {
        let store = MemoryTimerStore::default();
        let scope = PartitionScope::new("g", "t", KafkaPartition(0));
        let key = Key::from("k");
        let time = TimerTime::from_secs(10);
        store
            .schedule(&scope, &key, TimerKind::Application, time)
            .await
            .unwrap();
        store
            .unschedule(&scope, &key, TimerKind::Application, time)
            .await
            .unwrap();
        assert!(store.partitions.lock().is_empty());
    }
}
