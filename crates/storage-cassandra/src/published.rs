//! [`PublishedStateView`]: the read half of the state store, addressed by subsystem.
//!
//! Published collections are written by their owner under `StateScope::subsystem`, which lands
//! in the same `keyed_state` partitions this view reads, so there is no copy to keep in sync
//! and readers see exactly the committed batches (per cell all or nothing). The view has no
//! write path by construction.

use async_trait::async_trait;
use prosody_api::storage::{DequeBounds, PublishedScope, PublishedStateView, ScanRequest};
use prosody_api::{Key, StorageError};
use serde_json::Value;

use crate::CassandraStore;

#[async_trait]
impl PublishedStateView for CassandraStore {
    async fn published_value(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        self.read_value("published.value", &scope.state_scope(), key)
            .await
    }

    async fn published_map_entries(
        &self,
        scope: &PublishedScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.read_entries("published.map_entries", &scope.state_scope(), key, entries)
            .await
    }

    async fn published_map_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        self.read_map_chunk("published.map_scan", &scope.state_scope(), key, scan)
            .await
    }

    async fn published_deque_bounds(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        self.read_deque_bounds("published.deque_bounds", &scope.state_scope(), key)
            .await
    }

    async fn published_deque_items(
        &self,
        scope: &PublishedScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.read_items(
            "published.deque_items",
            &scope.state_scope(),
            key,
            positions,
        )
        .await
    }

    async fn published_deque_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        self.read_deque_chunk("published.deque_scan", &scope.state_scope(), key, scan)
            .await
    }
}
