//! [`StateStore`] on the `keyed_state` table (and [`crate::published`] reads the same data).
//!
//! # Layout
//!
//! One partition per cell: `(owner, collection, kafka_key)`, the owner being `g:<group>` or
//! `s:<subsystem>` so a group and a subsystem of the same name never meet. The value and the
//! deque bounds are static columns; map entries (kind 1, by entry) and deque items (kind 2, by
//! position) are clustering rows, so scans are ordered slices in either direction and every
//! item read carries the bounds it must be checked against, from the same (isolated) read.
//!
//! # Expiry
//!
//! Each TTL'd datum stores its expiry instant (store clock) and reads filter on it; native TTL
//! only reclaims space (see [`crate::ttl`]). Scans that skip expired rows keep reading until
//! they have a full chunk or the slice is exhausted, so a short chunk is never mistaken for the
//! end.
//!
//! # Apply
//!
//! See [`write`]: plan every cell in memory (validation included), then write each cell's end
//! state as one single-partition batch, several cells as one logged batch, or — when that would
//! exceed Cassandra's batch size limit — through a staged commit.

mod plan;
mod write;

use std::collections::BTreeMap;

use async_trait::async_trait;
use prosody_api::storage::{
    DequeBounds, ScanDirection, ScanRequest, StateNamespace, StateScope, StateStore, StateWrite,
};
use prosody_api::{Clock, Key, StorageError};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;
use serde_json::Value;

pub use write::RecoveryReport;

use crate::CassandraStore;
use crate::errors::corrupt;
use crate::session::Db;
use crate::ttl::{live, millis};

pub(crate) const TABLE: &str = "keyed_state";
const KIND_ENTRY: i8 = 1;
const KIND_ITEM: i8 = 2;

/// The partition key of a cell.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) struct CellKey {
    pub(crate) owner: String,
    pub(crate) collection: String,
    pub(crate) key: String,
}

impl CellKey {
    pub(crate) fn new(scope: &StateScope, key: &Key) -> Self {
        let owner = match &scope.namespace {
            StateNamespace::Group(group) => format!("g:{group}"),
            StateNamespace::Subsystem(subsystem) => format!("s:{subsystem}"),
        };
        Self {
            owner,
            collection: scope.collection.as_str().to_owned(),
            key: key.as_str().to_owned(),
        }
    }

    pub(crate) fn values(&self) -> Vec<Option<CqlValue>> {
        vec![
            Some(CqlValue::Text(self.owner.clone())),
            Some(CqlValue::Text(self.collection.clone())),
            Some(CqlValue::Text(self.key.clone())),
        ]
    }
}

/// The prepared statements of the state store.
#[derive(Debug)]
pub(crate) struct Statements {
    value: PreparedStatement,
    bounds: PreparedStatement,
    entries: PreparedStatement,
    live_entries: PreparedStatement,
    map_forward: PreparedStatement,
    map_forward_after: PreparedStatement,
    map_backward: PreparedStatement,
    map_backward_after: PreparedStatement,
    items: PreparedStatement,
    deque_forward: PreparedStatement,
    deque_backward: PreparedStatement,
    pub(crate) writes: write::Statements,
}

const PK: &str = "owner = ? AND collection = ? AND kafka_key = ?";
const BACKWARD: &str = "ORDER BY kind DESC, entry DESC, position DESC";

impl Statements {
    pub(crate) async fn prepare(db: &Db) -> Result<Self, StorageError> {
        const OP: &str = "state.prepare";
        let cql = |text: String| async move { db.prepare(OP, TABLE, &text).await };
        let entry_columns = "entry, item, expires_at";
        let item_columns = "deque_head, deque_tail, deque_expires_at, position, item, expires_at";
        let (value, bounds, entries, live_entries, map_forward, map_forward_after) = futures::try_join!(
            cql(format!(
                "SELECT val, val_expires_at FROM {{ks}}.keyed_state WHERE {PK} LIMIT 1"
            )),
            cql(format!(
                "SELECT deque_head, deque_tail, deque_expires_at FROM {{ks}}.keyed_state \
                     WHERE {PK} LIMIT 1"
            )),
            cql(format!(
                "SELECT {entry_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 1 \
                     AND entry IN ?"
            )),
            cql(format!(
                "SELECT entry, expires_at FROM {{ks}}.keyed_state WHERE {PK} AND kind = 1"
            )),
            cql(format!(
                "SELECT {entry_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 1 \
                     LIMIT ?"
            )),
            cql(format!(
                "SELECT {entry_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 1 \
                     AND entry > ? LIMIT ?"
            )),
        )?;
        let (map_backward, map_backward_after, items, deque_forward, deque_backward, writes) = futures::try_join!(
            cql(format!(
                "SELECT {entry_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 1 \
                     {BACKWARD} LIMIT ?"
            )),
            cql(format!(
                "SELECT {entry_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 1 \
                     AND entry < ? {BACKWARD} LIMIT ?"
            )),
            cql(format!(
                "SELECT {item_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 2 \
                     AND entry = '' AND position IN ?"
            )),
            cql(format!(
                "SELECT {item_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 2 \
                     AND entry = '' AND position >= ? LIMIT ?"
            )),
            cql(format!(
                "SELECT {item_columns} FROM {{ks}}.keyed_state WHERE {PK} AND kind = 2 \
                     AND entry = '' AND position <= ? {BACKWARD} LIMIT ?"
            )),
            write::Statements::prepare(db),
        )?;
        Ok(Self {
            value,
            bounds,
            entries,
            live_entries,
            map_forward,
            map_forward_after,
            map_backward,
            map_backward_after,
            items,
            deque_forward,
            deque_backward,
            writes,
        })
    }
}

type BoundsRow = (Option<i64>, Option<i64>, Option<i64>);
type ItemRow = (
    Option<i64>,
    Option<i64>,
    Option<i64>,
    i64,
    Option<String>,
    Option<i64>,
);

fn decode(operation: &'static str, json: &str) -> Result<Value, StorageError> {
    serde_json::from_str(json).map_err(|error| {
        corrupt(
            operation,
            TABLE,
            format!("a stored value is not JSON: {error}"),
        )
    })
}

/// The live bounds of a row's static columns.
fn live_bounds(row: &BoundsRow, now: i64) -> Option<DequeBounds> {
    match *row {
        (Some(head), Some(tail), expires) if live(expires, now) => {
            Some(DequeBounds::new(head, tail))
        }
        _ => None,
    }
}

fn chunk_limit(limit: std::num::NonZeroU32) -> i32 {
    i32::try_from(limit.get()).unwrap_or(i32::MAX)
}

impl CassandraStore {
    fn now_millis(&self) -> i64 {
        millis(self.clock.now())
    }

    pub(crate) async fn read_value(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        let cell = CellKey::new(scope, key);
        let rows: Vec<(Option<String>, Option<i64>)> = self
            .shared
            .db
            .rows(operation, TABLE, &self.shared.state.value, cell.values())
            .await?;
        let now = self.now_millis();
        match rows.into_iter().next() {
            Some((Some(json), expires)) if live(expires, now) => decode(operation, &json).map(Some),
            _ => Ok(None),
        }
    }

    pub(crate) async fn read_bounds(
        &self,
        operation: &'static str,
        cell: &CellKey,
    ) -> Result<Option<DequeBounds>, StorageError> {
        let rows: Vec<BoundsRow> = self
            .shared
            .db
            .rows(operation, TABLE, &self.shared.state.bounds, cell.values())
            .await?;
        let now = self.now_millis();
        Ok(rows.first().and_then(|row| live_bounds(row, now)))
    }

    /// The live entries of a map (names only), for keyset limits.
    pub(crate) async fn read_live_entries(
        &self,
        operation: &'static str,
        cell: &CellKey,
    ) -> Result<std::collections::BTreeSet<String>, StorageError> {
        let rows: Vec<(String, Option<i64>)> = self
            .shared
            .db
            .all_rows(
                operation,
                TABLE,
                &self.shared.state.live_entries,
                cell.values(),
            )
            .await?;
        let now = self.now_millis();
        Ok(rows
            .into_iter()
            .filter(|(_, expires)| live(*expires, now))
            .map(|(entry, _)| entry)
            .collect())
    }

    pub(crate) async fn read_entries(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let cell = CellKey::new(scope, key);
        let mut wanted: Vec<&String> = entries.iter().collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut values = cell.values();
        values.push(Some(CqlValue::List(
            wanted
                .iter()
                .map(|entry| CqlValue::Text((*entry).clone()))
                .collect(),
        )));
        let rows: Vec<(String, Option<String>, Option<i64>)> = self
            .shared
            .db
            .rows(operation, TABLE, &self.shared.state.entries, values)
            .await?;
        let now = self.now_millis();
        let mut found = BTreeMap::new();
        for (entry, json, expires) in rows {
            if let (Some(json), true) = (json, live(expires, now)) {
                found.insert(entry, decode(operation, &json)?);
            }
        }
        Ok(entries
            .iter()
            .map(|entry| found.get(entry).cloned())
            .collect())
    }

    pub(crate) async fn read_map_chunk(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        let cell = CellKey::new(scope, key);
        let statements = &self.shared.state;
        let limit = chunk_limit(scan.limit);
        let wanted = usize::try_from(scan.limit.get()).unwrap_or(usize::MAX);
        let mut after = scan.after.clone();
        let mut chunk = Vec::new();
        loop {
            let statement = match (scan.direction, after.is_some()) {
                (ScanDirection::Forward, false) => &statements.map_forward,
                (ScanDirection::Forward, true) => &statements.map_forward_after,
                (ScanDirection::Backward, false) => &statements.map_backward,
                (ScanDirection::Backward, true) => &statements.map_backward_after,
            };
            let mut values = cell.values();
            if let Some(cursor) = &after {
                values.push(Some(CqlValue::Text(cursor.clone())));
            }
            values.push(Some(CqlValue::Int(limit)));
            let rows: Vec<(String, Option<String>, Option<i64>)> = self
                .shared
                .db
                .rows(operation, TABLE, statement, values)
                .await?;
            let exhausted = rows.len() < wanted;
            let now = self.now_millis();
            for (entry, json, expires) in rows {
                after = Some(entry.clone());
                if let (Some(json), true) = (json, live(expires, now))
                    && chunk.len() < wanted
                {
                    chunk.push((entry, decode(operation, &json)?));
                }
            }
            if exhausted || chunk.len() >= wanted {
                return Ok(chunk);
            }
        }
    }

    pub(crate) async fn read_deque_bounds(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        self.read_bounds(operation, &CellKey::new(scope, key)).await
    }

    pub(crate) async fn read_items(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        let cell = CellKey::new(scope, key);
        let mut wanted = positions.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let mut values = cell.values();
        values.push(Some(CqlValue::List(
            wanted.into_iter().map(CqlValue::BigInt).collect(),
        )));
        let rows: Vec<ItemRow> = self
            .shared
            .db
            .rows(operation, TABLE, &self.shared.state.items, values)
            .await?;
        let now = self.now_millis();
        let mut found = BTreeMap::new();
        for (head, tail, bounds_expiry, position, json, expires) in rows {
            let Some(bounds) = live_bounds(&(head, tail, bounds_expiry), now) else {
                continue;
            };
            if let (Some(json), true) = (json, live(expires, now) && bounds.contains(position)) {
                found.insert(position, decode(operation, &json)?);
            }
        }
        Ok(positions
            .iter()
            .map(|position| found.get(position).cloned())
            .collect())
    }

    pub(crate) async fn read_deque_chunk(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        let cell = CellKey::new(scope, key);
        let statements = &self.shared.state;
        let limit = chunk_limit(scan.limit);
        let wanted = usize::try_from(scan.limit.get()).unwrap_or(usize::MAX);
        // Cursors are exclusive; the statements take an inclusive start, one step past it.
        let mut start = match (scan.direction, scan.after) {
            (ScanDirection::Forward, None) => Some(i64::MIN),
            (ScanDirection::Forward, Some(after)) => after.checked_add(1),
            (ScanDirection::Backward, None) => Some(i64::MAX),
            (ScanDirection::Backward, Some(after)) => after.checked_sub(1),
        };
        let mut chunk = Vec::new();
        while let Some(from) = start {
            let statement = match scan.direction {
                ScanDirection::Forward => &statements.deque_forward,
                ScanDirection::Backward => &statements.deque_backward,
            };
            let mut values = cell.values();
            values.push(Some(CqlValue::BigInt(from)));
            values.push(Some(CqlValue::Int(limit)));
            let rows: Vec<ItemRow> = self
                .shared
                .db
                .rows(operation, TABLE, statement, values)
                .await?;
            let exhausted = rows.len() < wanted;
            let now = self.now_millis();
            for (head, tail, bounds_expiry, position, json, expires) in rows {
                let Some(bounds) = live_bounds(&(head, tail, bounds_expiry), now) else {
                    // The whole deque expired: nothing of it is visible.
                    return Ok(Vec::new());
                };
                start = match scan.direction {
                    ScanDirection::Forward => position.checked_add(1),
                    ScanDirection::Backward => position.checked_sub(1),
                };
                if let (Some(json), true) = (json, live(expires, now) && bounds.contains(position))
                    && chunk.len() < wanted
                {
                    chunk.push((position, decode(operation, &json)?));
                }
            }
            if exhausted || chunk.len() >= wanted {
                break;
            }
        }
        Ok(chunk)
    }
}

#[async_trait]
impl StateStore for CassandraStore {
    async fn get_value(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        self.read_value("state.get_value", scope, key).await
    }

    async fn get_map_entries(
        &self,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.read_entries("state.get_map_entries", scope, key, entries)
            .await
    }

    async fn scan_map(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        self.read_map_chunk("state.scan_map", scope, key, scan)
            .await
    }

    async fn get_deque_bounds(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        self.read_deque_bounds("state.get_deque_bounds", scope, key)
            .await
    }

    async fn get_deque_items(
        &self,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.read_items("state.get_deque_items", scope, key, positions)
            .await
    }

    async fn scan_deque(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        self.read_deque_chunk("state.scan_deque", scope, key, scan)
            .await
    }

    async fn apply(&self, writes: &[StateWrite]) -> Result<(), StorageError> {
        self.apply_writes(writes).await
    }
}
