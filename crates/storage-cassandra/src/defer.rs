//! [`DeferStore`] on two tables. `deferred`: one partition per key of a partition scope, with
//! messages (kind 0, id = offset) and timers (kind 1, id = due second) as clustering rows, so
//! each list is one ordered slice and each clear is one range delete. `deferred_keys`: one
//! partition per partition scope listing its keys with work, written before a key's entries
//! and deleted once a removal left the key with none (checked with a one-row read, on the
//! removal path only), so a crash between the two leaves an extra key listed, never a missing
//! one.
//!
//! Entries do not expire in the trait's contract; the native TTL is the retention, refreshed on
//! every write, so only work abandoned for the whole retention is reclaimed.

use async_trait::async_trait;
use prosody_api::storage::{DeferStore, DeferredMessage, DeferredTimer, PartitionScope};
use prosody_api::{Key, Offset, StorageError, TimerTime};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use crate::CassandraStore;
use crate::errors::corrupt;
use crate::session::Db;

const TABLE: &str = "deferred";
const KEYS_TABLE: &str = "deferred_keys";
const MESSAGE: i8 = 0;
const TIMER: i8 = 1;

/// The prepared statements of this module.
#[derive(Debug)]
pub(crate) struct Statements {
    upsert: PreparedStatement,
    list: PreparedStatement,
    remove: PreparedStatement,
    clear: PreparedStatement,
    any: PreparedStatement,
    index: PreparedStatement,
    unindex: PreparedStatement,
    keys: PreparedStatement,
}

impl Statements {
    pub(crate) async fn prepare(db: &Db) -> Result<Self, StorageError> {
        const OP: &str = "defer.prepare";
        let (upsert, list, remove, clear) = futures::try_join!(
            db.prepare(
                OP,
                TABLE,
                "INSERT INTO {ks}.deferred (consumer_group, topic, kafka_partition, kafka_key, \
                 kind, id, retry_count) VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?",
            ),
            db.prepare(
                OP,
                TABLE,
                "SELECT id, retry_count FROM {ks}.deferred WHERE consumer_group = ? AND \
                 topic = ? AND kafka_partition = ? AND kafka_key = ? AND kind = ?",
            ),
            db.prepare(
                OP,
                TABLE,
                "DELETE FROM {ks}.deferred WHERE consumer_group = ? AND topic = ? AND \
                 kafka_partition = ? AND kafka_key = ? AND kind = ? AND id = ?",
            ),
            db.prepare(
                OP,
                TABLE,
                "DELETE FROM {ks}.deferred WHERE consumer_group = ? AND topic = ? AND \
                 kafka_partition = ? AND kafka_key = ? AND kind = ?",
            ),
        )?;
        let (any, index, unindex, keys) = futures::try_join!(
            db.prepare(
                OP,
                TABLE,
                "SELECT kind FROM {ks}.deferred WHERE consumer_group = ? AND topic = ? AND \
                 kafka_partition = ? AND kafka_key = ? LIMIT 1",
            ),
            db.prepare(
                OP,
                KEYS_TABLE,
                "INSERT INTO {ks}.deferred_keys (consumer_group, topic, kafka_partition, \
                 kafka_key) VALUES (?, ?, ?, ?) USING TTL ?",
            ),
            db.prepare(
                OP,
                KEYS_TABLE,
                "DELETE FROM {ks}.deferred_keys WHERE consumer_group = ? AND topic = ? AND \
                 kafka_partition = ? AND kafka_key = ?",
            ),
            db.prepare(
                OP,
                KEYS_TABLE,
                "SELECT kafka_key FROM {ks}.deferred_keys WHERE consumer_group = ? AND \
                 topic = ? AND kafka_partition = ?",
            ),
        )?;
        Ok(Self {
            upsert,
            list,
            remove,
            clear,
            any,
            index,
            unindex,
            keys,
        })
    }
}

fn partition(scope: &PartitionScope) -> Vec<CqlValue> {
    vec![
        CqlValue::Text(scope.group.as_str().to_owned()),
        CqlValue::Text(scope.topic.as_str().to_owned()),
        CqlValue::Int(scope.partition.0),
    ]
}

fn key_of(scope: &PartitionScope, key: &Key) -> Vec<CqlValue> {
    let mut values = partition(scope);
    values.push(CqlValue::Text(key.as_str().to_owned()));
    values
}

fn cell(scope: &PartitionScope, key: &Key, kind: i8) -> Vec<CqlValue> {
    let mut values = key_of(scope, key);
    values.push(CqlValue::TinyInt(kind));
    values
}

impl CassandraStore {
    async fn defer_upsert(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: i8,
        id: i64,
        retry_count: u32,
    ) -> Result<(), StorageError> {
        let mut index = key_of(scope, key);
        index.push(CqlValue::Int(self.shared.ttl.index_retention()));
        self.shared
            .db
            .execute(operation, KEYS_TABLE, &self.shared.defer.index, index)
            .await?;
        let mut values = cell(scope, key, kind);
        values.extend([
            CqlValue::BigInt(id),
            CqlValue::BigInt(i64::from(retry_count)),
            CqlValue::Int(self.shared.ttl.retention()),
        ]);
        self.shared
            .db
            .execute(operation, TABLE, &self.shared.defer.upsert, values)
            .await
            .map(drop)
    }

    async fn defer_list(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: i8,
    ) -> Result<Vec<(i64, u32)>, StorageError> {
        let rows: Vec<(i64, i64)> = self
            .shared
            .db
            .all_rows(
                operation,
                TABLE,
                &self.shared.defer.list,
                cell(scope, key, kind),
            )
            .await?;
        rows.into_iter()
            .map(|(id, retries)| {
                u32::try_from(retries)
                    .map(|retries| (id, retries))
                    .map_err(|_| corrupt(operation, TABLE, format!("retry count {retries}")))
            })
            .collect()
    }

    async fn defer_remove(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: i8,
        id: i64,
    ) -> Result<(), StorageError> {
        let mut values = cell(scope, key, kind);
        values.push(CqlValue::BigInt(id));
        self.shared
            .db
            .execute(operation, TABLE, &self.shared.defer.remove, values)
            .await?;
        self.unindex_if_empty(operation, scope, key).await
    }

    /// Drops the key from `deferred_keys` when a removal left it no entries. Safe without a
    /// lightweight transaction: calls for one key are serialized by the pipeline, and only the
    /// partition's owner writes.
    async fn unindex_if_empty(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError> {
        let left: Vec<(i8,)> = self
            .shared
            .db
            .all_rows(operation, TABLE, &self.shared.defer.any, key_of(scope, key))
            .await?;
        if !left.is_empty() {
            return Ok(());
        }
        self.shared
            .db
            .execute(
                operation,
                KEYS_TABLE,
                &self.shared.defer.unindex,
                key_of(scope, key),
            )
            .await
            .map(drop)
    }

    async fn defer_clear(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
        key: &Key,
        kind: i8,
    ) -> Result<(), StorageError> {
        self.shared
            .db
            .execute(
                operation,
                TABLE,
                &self.shared.defer.clear,
                cell(scope, key, kind),
            )
            .await?;
        self.unindex_if_empty(operation, scope, key).await
    }
}

fn timer_id(operation: &'static str, time: TimerTime) -> Result<i64, StorageError> {
    i64::try_from(time.as_secs()).map_err(|_| {
        StorageError::invalid_request(
            operation,
            format!("timer time {time} is beyond the latest storable time"),
        )
    })
}

#[async_trait]
impl DeferStore for CassandraStore {
    async fn deferred_keys(&self, scope: &PartitionScope) -> Result<Vec<Key>, StorageError> {
        let rows: Vec<(String,)> = self
            .shared
            .db
            .all_rows(
                "defer.deferred_keys",
                KEYS_TABLE,
                &self.shared.defer.keys,
                partition(scope),
            )
            .await?;
        Ok(rows.into_iter().map(|(key,)| Key::from(key)).collect())
    }

    async fn defer_message(
        &self,
        scope: &PartitionScope,
        key: &Key,
        message: DeferredMessage,
    ) -> Result<(), StorageError> {
        self.defer_upsert(
            "defer.defer_message",
            scope,
            key,
            MESSAGE,
            message.offset.0,
            message.retry_count,
        )
        .await
    }

    async fn deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredMessage>, StorageError> {
        Ok(self
            .defer_list("defer.deferred_messages", scope, key, MESSAGE)
            .await?
            .into_iter()
            .map(|(offset, retry_count)| DeferredMessage {
                offset: Offset(offset),
                retry_count,
            })
            .collect())
    }

    async fn remove_deferred_message(
        &self,
        scope: &PartitionScope,
        key: &Key,
        offset: Offset,
    ) -> Result<(), StorageError> {
        self.defer_remove(
            "defer.remove_deferred_message",
            scope,
            key,
            MESSAGE,
            offset.0,
        )
        .await
    }

    async fn clear_deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError> {
        self.defer_clear("defer.clear_deferred_messages", scope, key, MESSAGE)
            .await
    }

    async fn defer_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        timer: DeferredTimer,
    ) -> Result<(), StorageError> {
        const OP: &str = "defer.defer_timer";
        let id = timer_id(OP, timer.time)?;
        self.defer_upsert(OP, scope, key, TIMER, id, timer.retry_count)
            .await
    }

    async fn deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredTimer>, StorageError> {
        const OP: &str = "defer.deferred_timers";
        self.defer_list(OP, scope, key, TIMER)
            .await?
            .into_iter()
            .map(|(secs, retry_count)| {
                let secs = u64::try_from(secs)
                    .map_err(|_| corrupt(OP, TABLE, format!("negative timer time {secs}")))?;
                Ok(DeferredTimer {
                    time: TimerTime::from_secs(secs),
                    retry_count,
                })
            })
            .collect()
    }

    async fn remove_deferred_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        const OP: &str = "defer.remove_deferred_timer";
        // A time beyond what can be stored was never stored: removing it is a no-op.
        let Ok(id) = timer_id(OP, time) else {
            return Ok(());
        };
        self.defer_remove(OP, scope, key, TIMER, id).await
    }

    async fn clear_deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError> {
        self.defer_clear("defer.clear_deferred_timers", scope, key, TIMER)
            .await
    }
}
