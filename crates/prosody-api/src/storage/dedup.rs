//! Durable deduplication records.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use super::{PartitionScope, Ttl};
use crate::error::StorageError;
use crate::key::Key;

/// A processed message's identity: its key, its payload `id` and the client's
/// `idempotenceVersion`. Bumping the version makes every earlier record irrelevant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DedupRecord {
    /// The message key.
    pub key: Key,
    /// The payload's `id` field.
    pub id: String,
    /// The idempotence version. Shared: it is the same for every record a subscription makes,
    /// and a copy per handled message was an allocation on the hot path.
    pub version: Arc<str>,
}

impl DedupRecord {
    /// A record from its parts.
    pub fn new(key: impl Into<Key>, id: impl Into<String>, version: impl Into<Arc<str>>) -> Self {
        Self {
            key: key.into(),
            id: id.into(),
            version: version.into(),
        }
    }
}

/// The durable tier of deduplication: which messages a partition has already handled.
///
/// Records are identified by (scope, key, id, version), all four compared exactly. A record
/// exists from a successful `insert` until its TTL elapses on the store's clock.
#[async_trait]
pub trait DedupStore: Send + Sync + Debug {
    /// Records the message as handled for `ttl` from now. Re-inserting an existing record
    /// restarts its TTL (the latest insert wins), which is idempotent for retries.
    async fn insert(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord,
        ttl: Ttl,
    ) -> Result<(), StorageError>;

    /// True when the record was inserted and has not expired. A `contains` concurrent with an
    /// `insert` of the same record may answer either way.
    async fn contains(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord,
    ) -> Result<bool, StorageError>;
}
