//! [`DedupStore`] on one table, `dedup`, one partition per record (lookups are exact, so the
//! whole identity is the partition key and records spread evenly over the cluster).
//!
//! The expiry instant (store clock) is a column that `contains` compares with the clock; the
//! native TTL only reclaims the row later (see [`crate::ttl`]).

use async_trait::async_trait;
use prosody_api::storage::{DedupRecord, DedupStore, PartitionScope, Ttl};
use prosody_api::{Clock, StorageError};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use crate::CassandraStore;
use crate::session::Db;
use crate::ttl::{expires_at, live, millis};

const TABLE: &str = "dedup";

/// The prepared statements of this module.
#[derive(Debug)]
pub(crate) struct Statements {
    insert: PreparedStatement,
    read: PreparedStatement,
}

impl Statements {
    pub(crate) async fn prepare(db: &Db) -> Result<Self, StorageError> {
        const OP: &str = "dedup.prepare";
        let (insert, read) = futures::try_join!(
            db.prepare(
                OP,
                TABLE,
                "INSERT INTO {ks}.dedup (consumer_group, topic, kafka_partition, kafka_key, \
                 message_id, idem_version, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?",
            ),
            db.prepare(
                OP,
                TABLE,
                "SELECT expires_at FROM {ks}.dedup WHERE consumer_group = ? AND topic = ? AND \
                 kafka_partition = ? AND kafka_key = ? AND message_id = ? AND idem_version = ?",
            ),
        )?;
        Ok(Self { insert, read })
    }
}

fn identity(scope: &PartitionScope, record: &DedupRecord<'_>) -> Vec<CqlValue> {
    vec![
        CqlValue::Text(scope.group.as_str().to_owned()),
        CqlValue::Text(scope.topic.as_str().to_owned()),
        CqlValue::Int(scope.partition.0),
        CqlValue::Text(record.key().as_str().to_owned()),
        CqlValue::Text(record.id().to_owned()),
        CqlValue::Text(record.version().to_owned()),
    ]
}

#[async_trait]
impl DedupStore for CassandraStore {
    async fn insert(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        let now = self.clock.now();
        let mut values = identity(scope, record);
        values.extend([
            CqlValue::BigInt(expires_at(Some(ttl), now).unwrap_or(i64::MAX)),
            CqlValue::Int(self.shared.ttl.native(Some(ttl))),
        ]);
        self.shared
            .db
            .execute("dedup.insert", TABLE, &self.shared.dedup.insert, values)
            .await
            .map(drop)
    }

    async fn contains(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError> {
        let rows: Vec<(Option<i64>,)> = self
            .shared
            .db
            .rows(
                "dedup.contains",
                TABLE,
                &self.shared.dedup.read,
                identity(scope, record),
            )
            .await?;
        let now = millis(self.clock.now());
        Ok(rows.first().is_some_and(|(expiry,)| live(*expiry, now)))
    }
}
