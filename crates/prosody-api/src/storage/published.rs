//! Read-only access to published collections.

use std::fmt::Debug;

use async_trait::async_trait;
use serde_json::Value;

use super::state::{DequeBounds, ScanRequest, StateScope};
use crate::error::StorageError;
use crate::key::{CollectionName, Key, Subsystem};

/// A published collection: the subsystem that publishes it and its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublishedScope {
    /// The publishing subsystem.
    pub subsystem: Subsystem,
    /// The collection's durable name.
    pub collection: CollectionName,
}

impl PublishedScope {
    /// A scope from its parts.
    pub fn new(subsystem: impl Into<Subsystem>, collection: impl Into<CollectionName>) -> Self {
        Self {
            subsystem: subsystem.into(),
            collection: collection.into(),
        }
    }

    /// The [`StateScope`] the owner writes this collection under.
    #[must_use]
    pub fn state_scope(&self) -> StateScope {
        StateScope::subsystem(self.subsystem.clone(), self.collection.clone())
    }
}

/// What any client (subscribed or not) may read of a published collection.
///
/// It views exactly the committed data a [`super::StateStore`] of the same backend holds under
/// [`super::StateNamespace::Subsystem`]: same ordering, chunking, TTL and absence rules as the
/// matching `StateStore` reads. It has no write methods because published readers must never
/// write. Readers see only committed batches (pending writes exist only in the owner's
/// runtime), possibly one cell of a batch before another.
#[async_trait]
pub trait PublishedStateView: Send + Sync + Debug {
    /// The live value, or `None`.
    async fn published_value(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError>;

    /// The live values of the given map entries, in the order asked.
    async fn published_map_entries(
        &self,
        scope: &PublishedScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError>;

    /// One chunk of the map's live entries in key order.
    async fn published_map_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError>;

    /// The deque's live bounds, or `None`.
    async fn published_deque_bounds(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError>;

    /// The live items at the given positions, in the order asked.
    async fn published_deque_items(
        &self,
        scope: &PublishedScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError>;

    /// One chunk of the deque's live items in position order.
    async fn published_deque_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError>;
}
