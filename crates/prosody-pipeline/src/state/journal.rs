//! The commit journal: how an attempt's state writes and timer writes commit together.
//!
//! State and timers live behind two traits, so no single store call covers both. An attempt
//! that has both therefore adds a journal entry (its timer writes, where and when) to its
//! atomic state batch: once that batch lands, the journal says the commit happened and which
//! timer writes must follow. The dispatch then applies the timer writes (idempotent) and
//! deletes the entry. If it fails or the process dies in between, the entry stays:
//!
//! - in the same process, the next attempt on that key finishes it first
//!   ([`Journal::finish_known`]), so a retry never sees the state without the timers;
//! - otherwise the recovery sweep ([`Journal::sweep`]), run every `stateRecoveryDelaySeconds`,
//!   finishes every entry older than that delay (younger ones may be commits in flight).
//!
//! Attempts with only state writes or only timer writes need no entry: one atomic batch, or
//! idempotent timer writes retried with the event.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use prosody_api::storage::{
    ScanDirection, ScanRequest, StateOp, StateScope, StateStore, StateWrite,
};
use prosody_api::{ConsumerGroup, Key, Partition, StorageError, Topic};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::definition::RESERVED_PREFIX;
use crate::timers::{TimerWrite, Timers};

/// One interrupted-or-in-flight commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Topic of the event.
    pub topic: Topic,
    /// Partition of the event.
    pub partition: i32,
    /// Key of the event.
    pub key: Key,
    /// When the batch was staged (ms since the epoch).
    pub staged_at_ms: u64,
    /// The timer writes to apply, in order.
    pub timers: Vec<TimerWrite>,
}

impl Entry {
    fn name(&self) -> String {
        // Unit separators: none of the three parts is ambiguous once joined.
        format!("{}\u{1f}{}\u{1f}{}", self.topic, self.partition, self.key)
    }
}

/// The journal of one consumer group, in its state store.
#[derive(Debug, Clone)]
pub struct Journal {
    store: Arc<dyn StateStore>,
    scope: StateScope,
    cell: Key,
    /// Entries this process left behind (commit failed after the state landed).
    unfinished: Arc<Unfinished>,
}

/// The names of the entries this process left behind, and how many there are, readable without
/// the lock: every attempt asks before it runs, and nearly always there are none, so the
/// common answer costs no lock that every core takes and no entry name formatted.
#[derive(Debug, Default)]
struct Unfinished {
    names: Mutex<HashSet<String>>,
    count: AtomicUsize,
}

impl Unfinished {
    fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    fn contains(&self, name: &str) -> bool {
        self.names.lock().contains(name)
    }

    /// Records whether the entry `name` is left behind.
    fn set(&self, name: String, left_behind: bool) {
        let mut names = self.names.lock();
        if left_behind {
            names.insert(name);
        } else {
            names.remove(&name);
        }
        self.count.store(names.len(), Ordering::Release);
    }
}

const CHUNK: NonZeroU32 = NonZeroU32::new(256).unwrap();

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

impl Journal {
    /// The journal of `group` in `store`.
    pub fn new(store: Arc<dyn StateStore>, group: &ConsumerGroup) -> Self {
        Self {
            store,
            scope: StateScope::group(group.clone(), format!("{RESERVED_PREFIX}_commit_journal")),
            cell: Key::from("journal"),
            unfinished: Arc::default(),
        }
    }

    /// A new entry for a commit staged now.
    #[must_use]
    pub fn entry(topic: Topic, partition: Partition, key: Key, timers: Vec<TimerWrite>) -> Entry {
        Entry {
            topic,
            partition: partition.0,
            key,
            staged_at_ms: now_ms(),
            timers,
        }
    }

    /// The write that records `entry`, to add to the attempt's state batch.
    ///
    /// # Errors
    /// When the entry cannot be encoded (it always can).
    pub fn record(&self, entry: &Entry) -> Result<StateWrite, StorageError> {
        let value = serde_json::to_value(entry)
            .map_err(|error| StorageError::backend("state.journal", error.to_string()))?;
        Ok(StateWrite::new(
            self.scope.clone(),
            self.cell.clone(),
            StateOp::PutMapEntry {
                entry: entry.name(),
                value,
                ttl: None,
                keyset_limit: None,
            },
        ))
    }

    /// Applies the entry's timer writes and deletes it. On failure the entry is remembered so
    /// the key's next attempt in this process finishes it first.
    ///
    /// # Errors
    /// The timer or state store's error.
    pub async fn finish(&self, timers: &Timers, entry: &Entry) -> Result<(), StorageError> {
        let result = self.apply_and_delete(timers, entry).await;
        self.unfinished.set(entry.name(), result.is_err());
        result
    }

    async fn apply_and_delete(&self, timers: &Timers, entry: &Entry) -> Result<(), StorageError> {
        let partition = Partition(entry.partition);
        for write in &entry.timers {
            timers
                .write_now(&entry.topic, partition, &entry.key, write)
                .await?;
        }
        self.store
            .apply(&[StateWrite::new(
                self.scope.clone(),
                self.cell.clone(),
                StateOp::DeleteMapEntry {
                    entry: entry.name(),
                },
            )])
            .await
    }

    /// True when this process left an entry behind: only then may an attempt have one to
    /// finish first (see [`Self::finish_known`]).
    #[must_use]
    pub fn has_unfinished(&self) -> bool {
        !self.unfinished.is_empty()
    }

    /// Before an attempt on `key`: finishes the key's entry if this process left one behind.
    ///
    /// # Errors
    /// The store's error: the attempt must not run on half a commit.
    pub async fn finish_known(
        &self,
        timers: &Timers,
        topic: &Topic,
        partition: Partition,
        key: &Key,
    ) -> Result<(), StorageError> {
        if !self.has_unfinished() {
            return Ok(());
        }
        let name = format!("{topic}\u{1f}{}\u{1f}{key}", partition.0);
        if !self.unfinished.contains(&name) {
            return Ok(());
        }
        let stored = self
            .store
            .get_map_entries(&self.scope, &self.cell, std::slice::from_ref(&name))
            .await?
            .pop()
            .flatten();
        match stored.map(serde_json::from_value::<Entry>) {
            Some(Ok(entry)) => self.finish(timers, &entry).await,
            Some(Err(error)) => Err(StorageError::backend("state.journal", error.to_string())),
            None => {
                self.unfinished.set(name, false);
                Ok(())
            }
        }
    }

    /// Finishes every entry staged more than `delay` ago; returns how many.
    ///
    /// # Errors
    /// The store's error reading the journal; failures finishing one entry are logged and the
    /// entry is left for the next sweep.
    pub async fn sweep(&self, timers: &Timers, delay: Duration) -> Result<usize, StorageError> {
        let cutoff = now_ms().saturating_sub(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        let mut due = Vec::new();
        let mut after = None;
        loop {
            let chunk = self
                .store
                .scan_map(
                    &self.scope,
                    &self.cell,
                    &ScanRequest {
                        direction: ScanDirection::Forward,
                        after: after.take(),
                        limit: CHUNK,
                    },
                )
                .await?;
            let Some((last, _)) = chunk.last() else {
                break;
            };
            after = Some(last.clone());
            due.extend(
                chunk
                    .into_iter()
                    .filter_map(|(_, value)| serde_json::from_value::<Entry>(value).ok())
                    .filter(|entry| entry.staged_at_ms <= cutoff),
            );
        }
        let mut finished = 0;
        for entry in &due {
            let outcome = self.finish(timers, entry).await;
            if let Err(error) = outcome {
                warn!(key = %entry.key, %error, "recovery sweep: commit not finished");
            } else {
                finished += 1;
            }
        }
        if finished > 0 {
            info!(finished, "recovery sweep finished interrupted commits");
        }
        Ok(finished)
    }
}

#[cfg(test)]
mod tests {
    use prosody_api::storage::{PartitionScope, TimerStore};
    use prosody_api::{SlabSize, SystemClock, TimerKind, TimerTime};
    use storage_memory::{MemoryStateStore, MemoryTimerStore};

    use super::*;
    use crate::timers::TimerSettings;

    #[test]
    fn entries_left_behind_are_counted_as_they_are_left_and_finished() {
        let unfinished = Unfinished::default();
        assert!(unfinished.is_empty());
        unfinished.set("a".to_owned(), true);
        unfinished.set("b".to_owned(), true);
        unfinished.set("a".to_owned(), true);
        assert!(!unfinished.is_empty() && unfinished.contains("a") && unfinished.contains("b"));
        unfinished.set("a".to_owned(), false);
        assert!(!unfinished.is_empty(), "b is still left behind");
        unfinished.set("b".to_owned(), false);
        assert!(unfinished.is_empty() && !unfinished.contains("b"));
    }

    #[tokio::test]
    async fn the_sweep_finishes_old_entries_and_leaves_young_ones() {
        let state: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(SystemClock));
        let timer_store: Arc<dyn TimerStore> = Arc::new(MemoryTimerStore::new(SlabSize::default()));
        let timers = Timers::new(
            timer_store.clone(),
            "g",
            Arc::new(SystemClock),
            TimerSettings::default(),
        );
        let journal = Journal::new(state.clone(), &ConsumerGroup::from("g"));
        let time = TimerTime::from_secs(4_000_000_000);
        let entry = Journal::entry(
            Topic::from("t"),
            Partition(3),
            Key::from("k"),
            vec![TimerWrite::ClearAndSchedule(TimerKind::Application, time)],
        );
        // The process died right after the state batch (which carried the entry) landed.
        state
            .apply(&[journal.record(&entry).unwrap()])
            .await
            .unwrap();

        assert_eq!(
            journal
                .sweep(&timers, Duration::from_secs(3_600))
                .await
                .unwrap(),
            0
        );
        let scope = PartitionScope::new("g", "t", Partition(3));
        let scheduled = || timer_store.scheduled(&scope, &entry.key, TimerKind::Application);
        assert!(
            scheduled().await.unwrap().is_empty(),
            "a young entry may be in flight"
        );

        assert_eq!(journal.sweep(&timers, Duration::ZERO).await.unwrap(), 1);
        assert_eq!(scheduled().await.unwrap(), vec![time]);
        assert_eq!(
            journal.sweep(&timers, Duration::ZERO).await.unwrap(),
            0,
            "entry deleted"
        );
    }
}
