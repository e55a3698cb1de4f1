//! Deferred messages and deferred timers.

use std::fmt::Debug;

use async_trait::async_trait;

use super::PartitionScope;
use crate::error::StorageError;
use crate::key::{Key, Offset};
use crate::timer::TimerTime;

/// A message whose handling failed transiently and was deferred: it is reloaded from Kafka by
/// offset (the topic and partition come from the scope) and retried when its retry timer fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeferredMessage {
    /// Offset of the message in the scope's partition.
    pub offset: Offset,
    /// Failed retries so far; drives the exponential retry delay.
    pub retry_count: u32,
}

/// A timer whose handling failed transiently and was deferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeferredTimer {
    /// The time the timer was scheduled for (its identity).
    pub time: TimerTime,
    /// Failed retries so far.
    pub retry_count: u32,
}

/// Deferred work per key of a partition: the queue of messages (and of timers) that wait behind
/// a failed one so the key's order is kept while the partition's offsets advance.
///
/// Entries do not expire. A message entry is identified by (scope, key, offset) and a timer
/// entry by (scope, key, time); writing an existing identity replaces its retry count (upsert),
/// so every write is idempotent. Messages and timers are independent lists. Calls for one key
/// are serialized by the pipeline; a read sees every write that returned `Ok` before it.
#[async_trait]
pub trait DeferStore: Send + Sync + Debug {
    /// Every key of the scope's partition with deferred messages or timers, in no particular
    /// order. A key whose last entry was removed is no longer listed, except that a store may
    /// keep listing it when a crash interrupted the removal: callers read a listed key's work
    /// before acting on it. The pipeline calls this once per ownership of a partition, so that
    /// every later event of a key with nothing deferred is answered without storage I/O.
    async fn deferred_keys(&self, scope: &PartitionScope) -> Result<Vec<Key>, StorageError>;

    /// Adds the message to the key's deferred queue, or sets its retry count if present.
    async fn defer_message(
        &self,
        scope: &PartitionScope,
        key: &Key,
        message: DeferredMessage,
    ) -> Result<(), StorageError>;

    /// The key's deferred messages in ascending offset order (the order they must be retried).
    async fn deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredMessage>, StorageError>;

    /// Removes one deferred message; a no-op when absent.
    async fn remove_deferred_message(
        &self,
        scope: &PartitionScope,
        key: &Key,
        offset: Offset,
    ) -> Result<(), StorageError>;

    /// Removes every deferred message of the key (excise, or giving up).
    async fn clear_deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError>;

    /// Adds the timer to the key's deferred timers, or sets its retry count if present.
    async fn defer_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        timer: DeferredTimer,
    ) -> Result<(), StorageError>;

    /// The key's deferred timers in ascending time order.
    async fn deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredTimer>, StorageError>;

    /// Removes one deferred timer; a no-op when absent.
    async fn remove_deferred_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        time: TimerTime,
    ) -> Result<(), StorageError>;

    /// Removes every deferred timer of the key.
    async fn clear_deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError>;
}
