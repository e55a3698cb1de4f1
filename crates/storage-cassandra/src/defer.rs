//! [`DeferStore`] on one table, `deferred`: one partition per key of a partition scope, with
//! messages (kind 0, id = offset) and timers (kind 1, id = due second) as clustering rows, so
//! each list is one ordered slice and each clear is one range delete.
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
const MESSAGE: i8 = 0;
const TIMER: i8 = 1;

/// The prepared statements of this module.
#[derive(Debug)]
pub(crate) struct Statements {
    upsert: PreparedStatement,
    list: PreparedStatement,
    remove: PreparedStatement,
    clear: PreparedStatement,
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
        Ok(Self {
            upsert,
            list,
            remove,
            clear,
        })
    }
}

fn cell(scope: &PartitionScope, key: &Key, kind: i8) -> Vec<CqlValue> {
    vec![
        CqlValue::Text(scope.group.as_str().to_owned()),
        CqlValue::Text(scope.topic.as_str().to_owned()),
        CqlValue::Int(scope.partition.0),
        CqlValue::Text(key.as_str().to_owned()),
        CqlValue::TinyInt(kind),
    ]
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
            .await
            .map(drop)
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
