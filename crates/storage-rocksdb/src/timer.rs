//! [`TimerStore`] on two column families: timers by key and timers by time.
//!
//! Both indexes change in one `WriteBatch`, so they agree whenever a call returns and a
//! concurrent reader never sees one without the other. `clear` and `clear_and_schedule` read
//! the key's timers and then delete them, so writes of one (key, kind) hold its lock stripe
//! while they read and commit; the pipeline already serializes a key, the stripe makes the
//! contract hold for any caller.

use async_trait::async_trait;
use prosody_api::storage::{PartitionScope, StoredTimer, TimerStore};
use prosody_api::{Key, SlabId, SlabSize, StorageError, TimerKind, TimerTime};
use rocksdb::WriteBatch;

use crate::error::corrupt;
use crate::families::{TIMERS_BY_KEY, TIMERS_BY_TIME};
use crate::keys::{KeyReader, timer as keys};
use crate::store::{Durability, Inner, RocksStore, finished, prefix, range};

fn validate(operation: &'static str, time: TimerTime) -> Result<(), StorageError> {
    if time > TimerTime::MAX {
        return Err(StorageError::invalid_request(
            operation,
            format!("timer time {time} is beyond the latest storable time"),
        ));
    }
    Ok(())
}

impl Inner {
    /// The times of one key's timers of one kind, ascending (key order is time order).
    fn timer_times(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError> {
        let family = self.family(operation, TIMERS_BY_KEY)?;
        let start = keys::by_key_prefix(scope, key, kind);
        let mut iterator = self
            .db
            .raw_iterator_cf_opt(family, prefix(start.as_bytes()));
        iterator.seek_to_first();
        let mut times = Vec::new();
        while let Some(stored) = iterator.key() {
            let mut reader =
                KeyReader::after(stored, start.as_bytes()).map_err(|e| corrupt(operation, e))?;
            times.push(TimerTime::from_secs(
                reader.u64().map_err(|e| corrupt(operation, e))?,
            ));
            iterator.next();
        }
        finished(operation, &iterator)?;
        Ok(times)
    }

    /// Adds the puts of one timer to `batch`.
    fn put_timer(
        &self,
        operation: &'static str,
        batch: &mut WriteBatch,
        timer: (&PartitionScope, &Key, TimerKind, TimerTime),
    ) -> Result<(), StorageError> {
        let (scope, key, kind, time) = timer;
        batch.put_cf(
            self.family(operation, TIMERS_BY_KEY)?,
            keys::by_key(scope, key, kind, time),
            [],
        );
        batch.put_cf(
            self.family(operation, TIMERS_BY_TIME)?,
            keys::by_time(scope, key, kind, time),
            [],
        );
        Ok(())
    }

    /// Adds the deletes of one timer to `batch`.
    fn delete_timer(
        &self,
        operation: &'static str,
        batch: &mut WriteBatch,
        timer: (&PartitionScope, &Key, TimerKind, TimerTime),
    ) -> Result<(), StorageError> {
        let (scope, key, kind, time) = timer;
        batch.delete_cf(
            self.family(operation, TIMERS_BY_KEY)?,
            keys::by_key(scope, key, kind, time),
        );
        batch.delete_cf(
            self.family(operation, TIMERS_BY_TIME)?,
            keys::by_time(scope, key, kind, time),
        );
        Ok(())
    }

    /// Replaces one (key, kind)'s timers: removes them all when `clear`, then adds `add`.
    fn change_timers(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        change: Change,
    ) -> Result<(), StorageError> {
        let id = keys::by_key_prefix(scope, key, kind);
        let _guard = self.lock([id.as_bytes()]);
        let mut batch = WriteBatch::default();
        match change {
            Change::Add(time) => self.put_timer(operation, &mut batch, (scope, key, kind, time))?,
            Change::Remove(time) => {
                self.delete_timer(operation, &mut batch, (scope, key, kind, time))?;
            }
            Change::Clear(then) => {
                for time in self.timer_times(operation, scope, key, kind)? {
                    self.delete_timer(operation, &mut batch, (scope, key, kind, time))?;
                }
                if let Some(time) = then {
                    self.put_timer(operation, &mut batch, (scope, key, kind, time))?;
                }
            }
        }
        self.commit(operation, batch, Durability::Configured)
    }

    /// The timers of `scope` with `from <= time < until`, in [`StoredTimer`] order.
    fn timers_between(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        from: TimerTime,
        until: TimerTime,
    ) -> Result<Vec<StoredTimer>, StorageError> {
        let family = self.family(operation, TIMERS_BY_TIME)?;
        let partition = keys::by_time_prefix(scope);
        let lower = keys::by_time_from(scope, from.as_secs());
        let upper = keys::by_time_from(scope, until.as_secs());
        let mut iterator = self
            .db
            .raw_iterator_cf_opt(family, range(lower.as_bytes(), Some(upper.into_bytes())));
        iterator.seek_to_first();
        let mut timers = Vec::new();
        while let Some(stored) = iterator.key() {
            let decode = || {
                let mut reader = KeyReader::after(stored, partition.as_bytes())?;
                let time = TimerTime::from_secs(reader.u64()?);
                let key = Key::new(reader.str()?);
                let code = reader.tag()?;
                reader.end()?;
                Ok::<_, crate::keys::DecodeError>((time, key, code))
            };
            let (time, key, code) = decode().map_err(|e| corrupt(operation, e))?;
            let kind = TimerKind::from_code(code)
                .ok_or_else(|| corrupt(operation, format!("unknown timer kind {code}")))?;
            timers.push(StoredTimer { time, key, kind });
            iterator.next();
        }
        finished(operation, &iterator)?;
        Ok(timers)
    }

    /// The slabs holding a timer, up to `until`: one seek per non-empty slab, jumping from each
    /// found timer's slab to the start of the next slab.
    fn nonempty_slabs(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        until: SlabId,
    ) -> Result<Vec<SlabId>, StorageError> {
        let family = self.family(operation, TIMERS_BY_TIME)?;
        let size = self.slab_size;
        let partition = keys::by_time_prefix(scope);
        let upper = keys::by_time_from(scope, until.end(size).as_secs());
        let mut iterator = self.db.raw_iterator_cf_opt(
            family,
            range(partition.as_bytes(), Some(upper.into_bytes())),
        );
        iterator.seek_to_first();
        let mut slabs = Vec::new();
        while let Some(stored) = iterator.key() {
            let secs = KeyReader::after(stored, partition.as_bytes())
                .and_then(|mut reader| reader.u64())
                .map_err(|e| corrupt(operation, e))?;
            let slab = TimerTime::from_secs(secs).slab(size);
            slabs.push(slab);
            let next = slab.end(size);
            if next.as_secs() <= secs {
                break;
            }
            iterator.seek(keys::by_time_from(scope, next.as_secs()));
        }
        finished(operation, &iterator)?;
        Ok(slabs)
    }
}

/// A change to one (key, kind)'s timers.
#[derive(Clone, Copy)]
enum Change {
    Add(TimerTime),
    Remove(TimerTime),
    /// Remove every timer, then add the given one.
    Clear(Option<TimerTime>),
}

impl RocksStore {
    async fn change_timers(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        change: Change,
    ) -> Result<(), StorageError> {
        let (scope, key) = (scope.clone(), key.clone());
        self.write(operation, move |inner| {
            inner.change_timers(operation, &scope, &key, kind, change)
        })
        .await
    }
}

#[async_trait]
impl TimerStore for RocksStore {
    fn slab_size(&self) -> SlabSize {
        self.inner.slab_size
    }

    async fn schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        const OPERATION: &str = "timer.schedule";
        validate(OPERATION, time)?;
        self.change_timers(OPERATION, scope, key, kind, Change::Add(time))
            .await
    }

    async fn clear_and_schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        const OPERATION: &str = "timer.clear_and_schedule";
        validate(OPERATION, time)?;
        self.change_timers(OPERATION, scope, key, kind, Change::Clear(Some(time)))
            .await
    }

    async fn unschedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        if time > TimerTime::MAX {
            // Nothing can be stored there, so there is nothing to remove.
            return Ok(());
        }
        self.change_timers("timer.unschedule", scope, key, kind, Change::Remove(time))
            .await
    }

    async fn clear(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<(), StorageError> {
        self.change_timers("timer.clear", scope, key, kind, Change::Clear(None))
            .await
    }

    async fn scheduled(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError> {
        self.inner.timer_times("timer.scheduled", scope, key, kind)
    }

    async fn slab(
        &self,
        scope: &PartitionScope,
        slab: SlabId,
    ) -> Result<Vec<StoredTimer>, StorageError> {
        let size = self.inner.slab_size;
        self.inner
            .timers_between("timer.slab", scope, slab.start(size), slab.end(size))
    }

    async fn slabs(
        &self,
        scope: &PartitionScope,
        until: SlabId,
    ) -> Result<Vec<SlabId>, StorageError> {
        self.inner.nonempty_slabs("timer.slabs", scope, until)
    }
}
