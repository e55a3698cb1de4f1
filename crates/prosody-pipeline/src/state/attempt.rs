//! [`AttemptState`]: the keyed state of one attempt on one key, and [`Cell`], what every
//! handle shares with it.
//!
//! Handles own an `Arc` of the attempt (they are `'static`, so a binding can pass them to
//! another runtime), which is why the attempt carries an *ended* flag: every operation takes
//! the attempt's lock, then checks the flag, and the dispatch sets the flag before it takes
//! the lock to commit or drop the stages. A handle used after its attempt therefore fails with
//! [`ContextError::AttemptEnded`] and changes nothing, whether the attempt succeeded or not.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prosody_api::storage::{StateScope, StateStore, StateWrite};
use prosody_api::{ContextError, Key, StorageError};
use tokio::sync::{Mutex, MutexGuard};

use super::StateRuntime;
use super::definition::{Collection, Identity};
use super::journal::Journal;
use super::stage::Stage;
use crate::timers::StagedTimers;

/// The stages of an attempt, by collection name.
pub(crate) type Stages = HashMap<Arc<str>, Stage>;

#[derive(Debug)]
pub(crate) struct Shared {
    runtime: StateRuntime,
    key: Key,
    ended: AtomicBool,
    stages: Mutex<Stages>,
}

/// The keyed state of one attempt on one key: the pending writes of every collection it
/// touched. Cheap to clone (clones share the attempt).
#[derive(Clone, Debug)]
pub struct AttemptState {
    shared: Arc<Shared>,
}

impl AttemptState {
    pub(crate) fn new(runtime: StateRuntime, key: Key) -> Self {
        Self {
            shared: Arc::new(Shared {
                runtime,
                key,
                ended: AtomicBool::new(false),
                stages: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Ends the attempt: every handle fails from now on.
    pub fn end(&self) {
        // Only ever goes up; release and acquire order it with the attempt's writes without a
        // locked instruction per attempt (x86).
        self.shared.ended.store(true, Ordering::Release);
    }

    /// Ends the attempt and returns the store writes of every collection's pending stage (the
    /// batch to apply atomically when the attempt succeeded).
    pub async fn take_writes(&self) -> Vec<StateWrite> {
        self.end();
        let stages = std::mem::take(&mut *self.shared.stages.lock().await);
        let runtime = &self.shared.runtime;
        let mut writes = Vec::new();
        for (name, stage) in &stages {
            let Some(collection) = runtime.collection(name) else {
                continue;
            };
            let scope = runtime.scope(&collection);
            writes.extend(
                stage
                    .ops(&collection)
                    .into_iter()
                    .map(|op| StateWrite::new(scope.clone(), self.shared.key.clone(), op)),
            );
        }
        writes
    }

    /// Ends the attempt and applies its pending writes in one atomic batch.
    ///
    /// # Errors
    /// The store's error (the attempt should then fail; every op is absolute, so a retry that
    /// applies them again converges).
    pub async fn commit(&self) -> Result<(), StorageError> {
        let writes = self.take_writes().await;
        if writes.is_empty() {
            return Ok(());
        }
        self.shared.runtime.store().apply(&writes).await
    }

    /// Ends the attempt and commits its state and timer writes together: with both, the state
    /// batch carries a journal entry of the timer writes, which are applied next and the entry
    /// deleted (see [`super::journal`]).
    ///
    /// # Errors
    /// The store's error. After the state batch landed, an error leaves the journal entry for
    /// the key's next attempt or the recovery sweep to finish.
    pub async fn commit_with(&self, timers: &StagedTimers<'_>) -> Result<(), StorageError> {
        let mut writes = self.take_writes().await;
        if writes.is_empty() {
            return timers.commit().await;
        }
        let (topic, partition, key, pending) = timers.pending();
        let store = self.shared.runtime.store();
        if pending.is_empty() {
            return store.apply(&writes).await;
        }
        let journal = self.shared.runtime.journal();
        let entry = Journal::entry(topic, partition, key, pending);
        writes.push(journal.record(&entry)?);
        store.apply(&writes).await?;
        timers.discard();
        journal.finish(timers.runtime(), &entry).await
    }

    /// Stages a clear of every registered collection of the key: what `on_excise` needs.
    ///
    /// # Errors
    /// [`ContextError::AttemptEnded`], or a store error when a `readUncommitted` collection is
    /// written through.
    pub async fn clear_all(&self) -> Result<(), ContextError> {
        let runtime = self.shared.runtime.clone();
        for collection in runtime.collections() {
            let cell = self.cell(&collection.name, collection.identity)?;
            let mut stages = cell.lock().await?;
            let stage = cell.stage(&mut stages);
            *stage = Stage::cleared(&collection);
            cell.written(&mut stages).await?;
        }
        Ok(())
    }

    /// Binds collection `name` for this attempt, checking it was registered as `requested`.
    ///
    /// # Errors
    /// [`ContextError::AttemptEnded`], [`ContextError::Unregistered`] or
    /// [`ContextError::Mismatch`].
    pub(crate) fn cell(&self, name: &str, requested: Identity) -> Result<Cell, ContextError> {
        self.shared.live()?;
        let collection = self
            .shared
            .runtime
            .collection(name)
            .ok_or_else(|| ContextError::Unregistered(name.to_owned()))?;
        if collection.identity != requested {
            return Err(ContextError::Mismatch {
                name: name.to_owned(),
                registered: collection.identity.to_string(),
                requested: requested.to_string(),
            });
        }
        Ok(Cell {
            scope: self.shared.runtime.scope(&collection),
            name: Arc::from(name),
            collection,
            shared: self.shared.clone(),
        })
    }
}

impl Shared {
    fn live(&self) -> Result<(), ContextError> {
        if self.ended.load(Ordering::Acquire) {
            Err(ContextError::AttemptEnded)
        } else {
            Ok(())
        }
    }
}

/// One collection of one attempt: what a handle holds.
#[derive(Debug, Clone)]
pub(crate) struct Cell {
    shared: Arc<Shared>,
    pub(crate) collection: Arc<Collection>,
    pub(crate) scope: StateScope,
    name: Arc<str>,
}

impl Cell {
    /// The attempt's stages, once the attempt is known to be live. Hold the guard for the whole
    /// operation, store reads included, so the attempt cannot end half way through a write.
    pub(crate) async fn lock(&self) -> Result<MutexGuard<'_, Stages>, ContextError> {
        let stages = self.shared.stages.lock().await;
        self.shared.live()?;
        Ok(stages)
    }

    /// This collection's stage, created untouched on first use.
    pub(crate) fn stage<'a>(&self, stages: &'a mut Stages) -> &'a mut Stage {
        stages
            .entry(self.name.clone())
            .or_insert_with(|| Stage::empty(&self.collection))
    }

    /// This collection's stage if the attempt touched it.
    pub(crate) fn staged<'a>(&self, stages: &'a Stages) -> Option<&'a Stage> {
        stages.get(&self.name)
    }

    pub(crate) fn runtime(&self) -> &StateRuntime {
        &self.shared.runtime
    }

    pub(crate) fn store(&self) -> &Arc<dyn StateStore> {
        self.shared.runtime.store()
    }

    pub(crate) fn key(&self) -> &Key {
        &self.shared.key
    }

    /// Applies this collection's pending writes now and forgets them (`commit()`).
    async fn flush(&self, stages: &mut Stages) -> Result<(), ContextError> {
        if let Some(stage) = stages.get(&self.name) {
            let writes: Vec<StateWrite> = stage
                .ops(&self.collection)
                .into_iter()
                .map(|op| StateWrite::new(self.scope.clone(), self.key().clone(), op))
                .collect();
            if !writes.is_empty() {
                self.store().apply(&writes).await?;
            }
            stages.remove(&self.name);
        }
        Ok(())
    }

    /// `commit()` of every handle kind: applies this collection's pending writes now.
    pub(crate) async fn commit(&self) -> Result<(), ContextError> {
        let mut stages = self.lock().await?;
        self.flush(&mut stages).await
    }

    /// `rollback()` of every handle kind: drops this collection's pending writes.
    pub(crate) async fn rollback(&self) -> Result<(), ContextError> {
        self.lock().await?.remove(&self.name);
        Ok(())
    }

    /// After a write: a `readUncommitted` collection writes through at once.
    pub(crate) async fn written(&self, stages: &mut Stages) -> Result<(), ContextError> {
        if self.collection.read_uncommitted {
            self.flush(stages).await
        } else {
            Ok(())
        }
    }
}
