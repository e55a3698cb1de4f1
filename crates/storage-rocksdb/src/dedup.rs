//! [`DedupStore`] on the `dedup` column family: one key per (partition, key, id, version),
//! whose value is only the expiry header. A re-insert overwrites the expiry, which restarts the
//! TTL; `contains` is one point read (helped by the bloom filter when the record is absent,
//! the common case).

use async_trait::async_trait;
use prosody_api::StorageError;
use prosody_api::storage::{DedupRecord, DedupStore, PartitionScope, Ttl};
use rocksdb::WriteBatch;

use crate::error::{backend, corrupt};
use crate::families::DEDUP;
use crate::keys;
use crate::store::RocksStore;
use crate::ttl;

#[async_trait]
impl DedupStore for RocksStore {
    async fn insert(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        const OPERATION: &str = "dedup.insert";
        let key = keys::dedup(scope, record);
        self.write(OPERATION, move |inner| {
            let expiry = ttl::expiry(Some(ttl), inner.clock.now());
            let mut batch = WriteBatch::default();
            batch.put_cf(
                inner.family(OPERATION, DEDUP)?,
                key,
                ttl::encode(expiry, &[]),
            );
            inner.commit(OPERATION, batch)
        })
        .await
    }

    async fn contains(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError> {
        const OPERATION: &str = "dedup.contains";
        let inner = &self.inner;
        let stored = inner
            .db
            .get_pinned_cf(inner.family(OPERATION, DEDUP)?, keys::dedup(scope, record))
            .map_err(|error| backend(OPERATION, error))?;
        let Some(stored) = stored else {
            return Ok(false);
        };
        let (expiry, _) =
            ttl::decode(&stored).ok_or_else(|| corrupt(OPERATION, "dedup record header"))?;
        Ok(ttl::live(expiry, inner.now_millis()))
    }
}
