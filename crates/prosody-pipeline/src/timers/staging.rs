//! [`StagedTimers`]: the timer writes of one attempt, held back until the attempt succeeds.

use std::collections::BTreeSet;

use parking_lot::Mutex;
use prosody_api::storage::StoredTimer;
use prosody_api::{Key, Partition, StorageError, TimerKind, TimerTime, Topic};

use super::Timers;
use super::queue::TimerWrite;

/// The timer writes of one attempt on one key. Reads see the staged writes; the store sees
/// them only when the dispatch [commits](Self::commit) after the attempt succeeded, so a
/// failed attempt leaves no timer behind and its retry does not add a second one.
///
/// It borrows the timers runtime and the event's topic and key, for the attempt is over before
/// the dispatch ends: shares of them, taken for every event, moved their reference counts
/// between the cores handling events.
#[derive(Debug)]
pub struct StagedTimers<'a> {
    timers: &'a Timers,
    topic: &'a Topic,
    partition: Partition,
    key: &'a Key,
    /// The timer whose firing this attempt handles: it is removed when the event completes.
    fired: Option<StoredTimer>,
    writes: Mutex<Vec<TimerWrite>>,
}

impl<'a> StagedTimers<'a> {
    pub(crate) fn new(
        timers: &'a Timers,
        topic: &'a Topic,
        partition: Partition,
        key: &'a Key,
        fired: Option<StoredTimer>,
    ) -> Self {
        Self {
            timers,
            topic,
            partition,
            key,
            fired,
            writes: Mutex::new(Vec::new()),
        }
    }

    /// Stages a write of the key's timers.
    ///
    /// # Errors
    /// An invalid-request error for a time no backend can store, reported now rather than at
    /// commit, where the handler could no longer react to it.
    pub fn stage(&self, write: TimerWrite) -> Result<(), StorageError> {
        if let TimerWrite::Schedule(_, time) | TimerWrite::ClearAndSchedule(_, time) = write
            && time > TimerTime::MAX
        {
            return Err(StorageError::invalid_request(
                "timer.schedule",
                format!("timer time {time} is beyond the latest storable time"),
            ));
        }
        self.writes.lock().push(write);
        Ok(())
    }

    /// The key's times of `kind` as they will be after a commit: the store's, minus the timer
    /// being fired, with the staged writes applied.
    ///
    /// # Errors
    /// The store's error.
    pub async fn scheduled(&self, kind: TimerKind) -> Result<Vec<TimerTime>, StorageError> {
        // The scope is built here, on the rare read, rather than for every attempt: it clones
        // the group and topic names, whose reference counts every worker shares.
        let scope = self.timers.scope(self.topic, self.partition);
        let stored = self
            .timers
            .store()
            .scheduled(&scope, self.key, kind)
            .await?;
        let mut times: BTreeSet<TimerTime> = stored.into_iter().collect();
        if let Some(fired) = self.fired.as_ref().filter(|fired| fired.kind == kind) {
            times.remove(&fired.time);
        }
        for write in self.writes.lock().iter() {
            match *write {
                TimerWrite::Schedule(of, time) if of == kind => {
                    times.insert(time);
                }
                TimerWrite::Unschedule(of, time) if of == kind => {
                    times.remove(&time);
                }
                TimerWrite::Clear(of) if of == kind => times.clear(),
                TimerWrite::ClearAndSchedule(of, time) if of == kind => {
                    times.clear();
                    times.insert(time);
                }
                _ => {}
            }
        }
        Ok(times.into_iter().collect())
    }

    /// The writes a [`commit`](Self::commit) would apply, in its order (the fired timer's
    /// removal first), and where: what a commit journal records so a commit interrupted after
    /// its state landed can be finished by someone else.
    #[must_use]
    pub fn pending(&self) -> (Topic, Partition, Key, Vec<TimerWrite>) {
        let mut writes: Vec<TimerWrite> = self
            .fired
            .iter()
            .map(|fired| TimerWrite::Unschedule(fired.kind, fired.time))
            .collect();
        writes.extend(self.writes.lock().iter().cloned());
        (self.topic.clone(), self.partition, self.key.clone(), writes)
    }

    /// The timers runtime the writes go to.
    #[must_use]
    pub fn runtime(&self) -> &Timers {
        self.timers
    }

    /// True when a commit would do nothing: no write was staged and no fired timer awaits its
    /// removal. Asked by the only holder (the attempt's owner, once its handler is done), so
    /// the writes are read without taking their lock.
    #[must_use]
    pub fn is_empty(&mut self) -> bool {
        self.fired.is_none() && self.writes.get_mut().is_empty()
    }

    /// Forgets the staged writes: a commit journal entry carries them now.
    pub fn discard(&self) {
        self.writes.lock().clear();
    }

    /// Applies the attempt's effects in order: the fired timer (if any) is removed, then the
    /// staged writes land; each is mirrored into the partition's timer manager once stored.
    /// Every write is idempotent, so after a failure the event can be retried from scratch.
    ///
    /// # Errors
    /// The store's error; the writes not yet applied are dropped with the attempt.
    pub async fn commit(&self) -> Result<(), StorageError> {
        let writes = std::mem::take(&mut *self.writes.lock());
        self.remove_fired().await?;
        for write in writes {
            self.write(&write).await?;
        }
        Ok(())
    }

    /// Ends an event whose handling was given up (a permanent failure): the staged writes are
    /// dropped, and the fired timer (if any) is removed so it does not fire again.
    ///
    /// # Errors
    /// The store's error.
    pub async fn give_up(&self) -> Result<(), StorageError> {
        self.writes.lock().clear();
        self.remove_fired().await
    }

    async fn remove_fired(&self) -> Result<(), StorageError> {
        match &self.fired {
            Some(fired) => {
                self.write(&TimerWrite::Unschedule(fired.kind, fired.time))
                    .await
            }
            None => Ok(()),
        }
    }

    async fn write(&self, write: &TimerWrite) -> Result<(), StorageError> {
        self.timers
            .write_now(self.topic, self.partition, self.key, write)
            .await
    }
}
