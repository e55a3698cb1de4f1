//! [`TimerStore`] on three tables: `timers_by_key`, `timers_by_slab` and `timer_slabs`.
//!
//! Every change touches several partitions (the key's, the slab's, the slab index), so it is
//! one logged batch: Cassandra's batch log makes it all-or-nothing, and each partition's part
//! is applied in isolation, so a concurrent `scheduled` sees the old or the new set of a key,
//! never a mix. Deletes and inserts in one batch share a timestamp (where a tombstone wins),
//! so a batch never deletes a row it also writes: `clear_and_schedule` keeps the new time out of
//! its deletes.
//!
//! The slab index is cleaned lazily, by native TTL (the slab's end plus the retention), as the
//! trait allows; a listed slab may therefore be empty.

use async_trait::async_trait;
use prosody_api::storage::{PartitionScope, StoredTimer, TimerStore};
use prosody_api::{Clock, Key, SlabId, SlabSize, StorageError, TimerKind, TimerTime};
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use crate::CassandraStore;
use crate::errors::corrupt;
use crate::session::Db;

const BY_KEY: &str = "timers_by_key";
const BY_SLAB: &str = "timers_by_slab";

/// The prepared statements of this module.
#[derive(Debug)]
pub(crate) struct Statements {
    insert_by_key: PreparedStatement,
    insert_by_slab: PreparedStatement,
    insert_slab: PreparedStatement,
    delete_by_key: PreparedStatement,
    delete_by_slab: PreparedStatement,
    delete_kind: PreparedStatement,
    scheduled: PreparedStatement,
    slab: PreparedStatement,
    slabs: PreparedStatement,
}

impl Statements {
    pub(crate) async fn prepare(db: &Db) -> Result<Self, StorageError> {
        const OP: &str = "timer.prepare";
        let (insert_by_key, insert_by_slab, insert_slab, delete_by_key, delete_by_slab) = futures::try_join!(
            db.prepare(
                OP,
                BY_KEY,
                "INSERT INTO {ks}.timers_by_key (consumer_group, topic, kafka_partition, \
                     kafka_key, kind, due_secs) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
            ),
            db.prepare(
                OP,
                BY_SLAB,
                "INSERT INTO {ks}.timers_by_slab (consumer_group, topic, kafka_partition, \
                     slab, due_secs, kafka_key, kind) VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?",
            ),
            db.prepare(
                OP,
                "timer_slabs",
                "INSERT INTO {ks}.timer_slabs (consumer_group, topic, kafka_partition, slab) \
                     VALUES (?, ?, ?, ?) USING TTL ?",
            ),
            db.prepare(
                OP,
                BY_KEY,
                "DELETE FROM {ks}.timers_by_key WHERE consumer_group = ? AND topic = ? AND \
                     kafka_partition = ? AND kafka_key = ? AND kind = ? AND due_secs = ?",
            ),
            db.prepare(
                OP,
                BY_SLAB,
                "DELETE FROM {ks}.timers_by_slab WHERE consumer_group = ? AND topic = ? AND \
                     kafka_partition = ? AND slab = ? AND due_secs = ? AND kafka_key = ? AND \
                     kind = ?",
            ),
        )?;
        let (delete_kind, scheduled, slab, slabs) = futures::try_join!(
            db.prepare(
                OP,
                BY_KEY,
                "DELETE FROM {ks}.timers_by_key WHERE consumer_group = ? AND topic = ? AND \
                 kafka_partition = ? AND kafka_key = ? AND kind = ?",
            ),
            db.prepare(
                OP,
                BY_KEY,
                "SELECT due_secs FROM {ks}.timers_by_key WHERE consumer_group = ? AND topic = ? \
                 AND kafka_partition = ? AND kafka_key = ? AND kind = ?",
            ),
            db.prepare(
                OP,
                BY_SLAB,
                "SELECT due_secs, kafka_key, kind FROM {ks}.timers_by_slab WHERE \
                 consumer_group = ? AND topic = ? AND kafka_partition = ? AND slab = ?",
            ),
            db.prepare(
                OP,
                "timer_slabs",
                "SELECT slab FROM {ks}.timer_slabs WHERE consumer_group = ? AND topic = ? AND \
                 kafka_partition = ? AND slab <= ?",
            ),
        )?;
        Ok(Self {
            insert_by_key,
            insert_by_slab,
            insert_slab,
            delete_by_key,
            delete_by_slab,
            delete_kind,
            scheduled,
            slab,
            slabs,
        })
    }
}

/// A batch under construction: statements and their values, side by side.
struct Writes {
    batch: Batch,
    values: Vec<Vec<CqlValue>>,
}

impl Writes {
    fn new() -> Self {
        let mut batch = Batch::new(BatchType::Logged);
        batch.set_is_idempotent(true);
        Self {
            batch,
            values: Vec::new(),
        }
    }

    fn push(&mut self, statement: &PreparedStatement, values: Vec<CqlValue>) {
        self.batch.append_statement(statement.clone());
        self.values.push(values);
    }
}

fn scope_values(scope: &PartitionScope) -> [CqlValue; 3] {
    [
        CqlValue::Text(scope.group.as_str().to_owned()),
        CqlValue::Text(scope.topic.as_str().to_owned()),
        CqlValue::Int(scope.partition.0),
    ]
}

fn kind_code(kind: TimerKind) -> CqlValue {
    CqlValue::TinyInt(i8::try_from(kind.code()).unwrap_or(i8::MAX))
}

/// A time as stored; `None` beyond [`TimerTime::MAX`] (which no stored timer can have).
fn stored_time(time: TimerTime) -> Option<i64> {
    i64::try_from(time.as_secs()).ok()
}

fn slab_value(slab: SlabId) -> i64 {
    i64::try_from(slab.0).unwrap_or(i64::MAX)
}

impl CassandraStore {
    fn validate(operation: &'static str, time: TimerTime) -> Result<i64, StorageError> {
        stored_time(time).ok_or_else(|| {
            StorageError::invalid_request(
                operation,
                format!("timer time {time} is beyond the latest storable time"),
            )
        })
    }

    fn add_insert(
        &self,
        writes: &mut Writes,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) {
        let statements = &self.shared.timers;
        let size = self.shared.db.config.slab_size;
        let now = TimerTime::from_system_time(self.clock.now());
        let ttl = self.shared.ttl.until(time, now);
        let slab = time.slab(size);
        let slab_ttl = self.shared.ttl.until(slab.end(size), now);
        let secs = stored_time(time).unwrap_or(i64::MAX);
        let mut by_key = scope_values(scope).to_vec();
        by_key.extend([
            CqlValue::Text(key.as_str().to_owned()),
            kind_code(kind),
            CqlValue::BigInt(secs),
            CqlValue::Int(ttl),
        ]);
        writes.push(&statements.insert_by_key, by_key);
        let mut by_slab = scope_values(scope).to_vec();
        by_slab.extend([
            CqlValue::BigInt(slab_value(slab)),
            CqlValue::BigInt(secs),
            CqlValue::Text(key.as_str().to_owned()),
            kind_code(kind),
            CqlValue::Int(ttl),
        ]);
        writes.push(&statements.insert_by_slab, by_slab);
        let mut index = scope_values(scope).to_vec();
        index.extend([CqlValue::BigInt(slab_value(slab)), CqlValue::Int(slab_ttl)]);
        writes.push(&statements.insert_slab, index);
    }

    fn add_delete(
        &self,
        writes: &mut Writes,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        secs: i64,
    ) {
        let statements = &self.shared.timers;
        let size = self.shared.db.config.slab_size;
        let slab = TimerTime::from_secs(secs.unsigned_abs()).slab(size);
        let mut by_key = scope_values(scope).to_vec();
        by_key.extend([
            CqlValue::Text(key.as_str().to_owned()),
            kind_code(kind),
            CqlValue::BigInt(secs),
        ]);
        writes.push(&statements.delete_by_key, by_key);
        let mut by_slab = scope_values(scope).to_vec();
        by_slab.extend([
            CqlValue::BigInt(slab_value(slab)),
            CqlValue::BigInt(secs),
            CqlValue::Text(key.as_str().to_owned()),
            kind_code(kind),
        ]);
        writes.push(&statements.delete_by_slab, by_slab);
    }

    async fn run(&self, operation: &'static str, writes: Writes) -> Result<(), StorageError> {
        if writes.values.is_empty() {
            return Ok(());
        }
        self.shared
            .db
            .batch(operation, BY_KEY, &writes.batch, writes.values)
            .await
    }

    async fn times(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<i64>, StorageError> {
        let mut values = scope_values(scope).to_vec();
        values.extend([CqlValue::Text(key.as_str().to_owned()), kind_code(kind)]);
        let rows: Vec<(i64,)> = self
            .shared
            .db
            .all_rows(operation, BY_KEY, &self.shared.timers.scheduled, values)
            .await?;
        Ok(rows.into_iter().map(|(secs,)| secs).collect())
    }
}

fn decode_time(operation: &'static str, table: &str, secs: i64) -> Result<TimerTime, StorageError> {
    u64::try_from(secs)
        .map(TimerTime::from_secs)
        .map_err(|_| corrupt(operation, table, format!("negative timer time {secs}")))
}

#[async_trait]
impl TimerStore for CassandraStore {
    fn slab_size(&self) -> SlabSize {
        self.shared.db.config.slab_size
    }

    async fn schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        const OP: &str = "timer.schedule";
        Self::validate(OP, time)?;
        let mut writes = Writes::new();
        self.add_insert(&mut writes, scope, key, kind, time);
        self.run(OP, writes).await
    }

    async fn clear_and_schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        const OP: &str = "timer.clear_and_schedule";
        let secs = Self::validate(OP, time)?;
        // Reading then writing is safe because the pipeline serializes calls per key.
        let existing = self.times(OP, scope, key, kind).await?;
        let mut writes = Writes::new();
        for old in existing.into_iter().filter(|old| *old != secs) {
            self.add_delete(&mut writes, scope, key, kind, old);
        }
        self.add_insert(&mut writes, scope, key, kind, time);
        self.run(OP, writes).await
    }

    async fn unschedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        const OP: &str = "timer.unschedule";
        let Some(secs) = stored_time(time) else {
            return Ok(());
        };
        let mut writes = Writes::new();
        self.add_delete(&mut writes, scope, key, kind, secs);
        self.run(OP, writes).await
    }

    async fn clear(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<(), StorageError> {
        const OP: &str = "timer.clear";
        let existing = self.times(OP, scope, key, kind).await?;
        if existing.is_empty() {
            return Ok(());
        }
        let mut writes = Writes::new();
        for old in existing {
            let size = self.shared.db.config.slab_size;
            let slab = TimerTime::from_secs(old.unsigned_abs()).slab(size);
            let mut by_slab = scope_values(scope).to_vec();
            by_slab.extend([
                CqlValue::BigInt(slab_value(slab)),
                CqlValue::BigInt(old),
                CqlValue::Text(key.as_str().to_owned()),
                kind_code(kind),
            ]);
            writes.push(&self.shared.timers.delete_by_slab, by_slab);
        }
        let mut by_key = scope_values(scope).to_vec();
        by_key.extend([CqlValue::Text(key.as_str().to_owned()), kind_code(kind)]);
        writes.push(&self.shared.timers.delete_kind, by_key);
        self.run(OP, writes).await
    }

    async fn scheduled(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError> {
        const OP: &str = "timer.scheduled";
        self.times(OP, scope, key, kind)
            .await?
            .into_iter()
            .map(|secs| decode_time(OP, BY_KEY, secs))
            .collect()
    }

    async fn slab(
        &self,
        scope: &PartitionScope,
        slab: SlabId,
    ) -> Result<Vec<StoredTimer>, StorageError> {
        const OP: &str = "timer.slab";
        if i64::try_from(slab.0).is_err() {
            return Ok(Vec::new());
        }
        let mut values = scope_values(scope).to_vec();
        values.push(CqlValue::BigInt(slab_value(slab)));
        let rows: Vec<(i64, String, i8)> = self
            .shared
            .db
            .all_rows(OP, BY_SLAB, &self.shared.timers.slab, values)
            .await?;
        rows.into_iter()
            .map(|(secs, key, code)| {
                let kind = u8::try_from(code)
                    .ok()
                    .and_then(TimerKind::from_code)
                    .ok_or_else(|| corrupt(OP, BY_SLAB, format!("unknown timer kind {code}")))?;
                Ok(StoredTimer {
                    time: decode_time(OP, BY_SLAB, secs)?,
                    key: Key::from(key),
                    kind,
                })
            })
            .collect()
    }

    async fn slabs(
        &self,
        scope: &PartitionScope,
        until: SlabId,
    ) -> Result<Vec<SlabId>, StorageError> {
        const OP: &str = "timer.slabs";
        let mut values = scope_values(scope).to_vec();
        values.push(CqlValue::BigInt(slab_value(until)));
        let rows: Vec<(i64,)> = self
            .shared
            .db
            .all_rows(OP, "timer_slabs", &self.shared.timers.slabs, values)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(slab,)| u64::try_from(slab).ok().map(SlabId))
            .collect())
    }
}
