//! Durable timers.

use std::fmt::Debug;

use async_trait::async_trait;

use super::PartitionScope;
use crate::error::StorageError;
use crate::key::Key;
use crate::timer::{SlabId, SlabSize, TimerKind, TimerTime};

/// One stored timer, as listed from a slab. Field order is the listing order: by time, then
/// key, then kind, so a loader fires due timers oldest first and deterministically.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoredTimer {
    /// When it is due.
    pub time: TimerTime,
    /// The key it was scheduled for.
    pub key: Key,
    /// Who owns it.
    pub kind: TimerKind,
}

/// Durable timers of the keys of a partition.
///
/// A timer is identified by (scope, key, kind, time); there is at most one per identity, so
/// scheduling the same second twice is one timer (upsert). Timers do not expire: they are
/// removed by `unschedule`/`clear` after they fire or are cancelled.
///
/// Every timer is indexed twice: per key (for the handler's `scheduled()` and
/// `clear_scheduled()`) and per slab of [`TimerStore::slab_size`] seconds (for the loader, which
/// reads only the slabs of the near future). Both indexes must agree once a call returns.
///
/// Concurrency: the pipeline serializes calls per key, but the slab loader runs beside the
/// handlers, so a `slab`/`slabs` call concurrent with a write to the same slab may or may not
/// include that write. Writes that returned `Ok` before a listing started are always included.
#[async_trait]
pub trait TimerStore: Send + Sync + Debug {
    /// The slab width this store buckets by. Fixed for the store's lifetime because it decides
    /// the durable layout.
    fn slab_size(&self) -> SlabSize;

    /// Adds the timer; a no-op when it exists. Times above [`TimerTime::MAX`] are an
    /// `InvalidRequest` error.
    async fn schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError>;

    /// Removes every timer of `kind` for `key` and adds the one at `time`, as one step: a
    /// concurrent `scheduled` sees the old set or `[time]`, never an empty set that stays
    /// empty. This is what makes the handler's `clear_and_schedule` safe to retry.
    async fn clear_and_schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError>;

    /// Removes the timer; a no-op when it does not exist.
    async fn unschedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError>;

    /// Removes every timer of `kind` for `key`; other kinds and keys are untouched.
    async fn clear(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<(), StorageError>;

    /// The times of every timer of `kind` for `key`, ascending, without duplicates.
    async fn scheduled(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError>;

    /// Every timer of every key and kind whose time falls in `slab`
    /// (`slab.start(size) <= time < slab.end(size)`), in [`StoredTimer`] order.
    async fn slab(
        &self,
        scope: &PartitionScope,
        slab: SlabId,
    ) -> Result<Vec<StoredTimer>, StorageError>;

    /// The ids of slabs up to and including `until` that may hold timers, ascending. Every slab
    /// that holds a timer is listed; a backend that cleans its slab index lazily may also list
    /// slabs that became empty, so a caller loads each listed slab and tolerates an empty one.
    async fn slabs(
        &self,
        scope: &PartitionScope,
        until: SlabId,
    ) -> Result<Vec<SlabId>, StorageError>;
}
