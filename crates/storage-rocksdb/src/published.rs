//! [`PublishedStateView`]: the read half of the state store, restricted to subsystem
//! namespaces. It reads the same keys as [`StateStore`](prosody_api::storage::StateStore) reads
//! of [`PublishedScope::state_scope`], through the same code, so ordering, chunking, TTL and
//! absence cannot drift apart; it has no write path because published readers must not write.

use async_trait::async_trait;
use prosody_api::storage::{DequeBounds, PublishedScope, PublishedStateView, ScanRequest};
use prosody_api::{Key, StorageError};
use serde_json::Value;

use crate::store::RocksStore;

#[async_trait]
impl PublishedStateView for RocksStore {
    async fn published_value(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        self.inner
            .state_value("published.value", &scope.state_scope(), key)
    }

    async fn published_map_entries(
        &self,
        scope: &PublishedScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.inner
            .state_map_entries("published.map_entries", &scope.state_scope(), key, entries)
    }

    async fn published_map_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        self.inner
            .state_map_scan("published.map_scan", &scope.state_scope(), key, scan)
    }

    async fn published_deque_bounds(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        self.inner
            .state_deque_bounds("published.deque_bounds", &scope.state_scope(), key)
    }

    async fn published_deque_items(
        &self,
        scope: &PublishedScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.inner.state_deque_items(
            "published.deque_items",
            &scope.state_scope(),
            key,
            positions,
        )
    }

    async fn published_deque_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        self.inner
            .state_deque_scan("published.deque_scan", &scope.state_scope(), key, scan)
    }
}
