//! [`DedupStore`] on the `dedup` column family: one key per (partition, key, id, version),
//! whose value is only the expiry header. A re-insert overwrites the expiry, which restarts the
//! TTL; `contains` is one point read (helped by the bloom filter when the record is absent,
//! the common case).
//!
//! Inserts are [`Durability::Buffered`] whatever the store's sync setting, and made on the
//! caller's thread: the pipeline inserts one record per handled message, and an `fsync` each
//! (through the blocking pool, shared by group commit) held a consumer to about 20,000 messages
//! a second on this project's two-core machine (80 us of CPU per message, 59% of it in the
//! kernel); buffered, 90,000-140,000 in passes of 1,000,000 (the throughput bench's
//! `client-rocksdb` subject), and 200,000-240,000 with the family's memtable bloom filter. A
//! dedup record lost to an OS crash lets one redelivery be handled again, which the
//! at-least-once contract allows; a lost timer or deferred record would lose work, so those stay
//! synced.

use async_trait::async_trait;
use prosody_api::StorageError;
use prosody_api::storage::{DedupRecord, DedupStore, PartitionScope, Ttl};
use rocksdb::WriteBatch;

use crate::error::{backend, corrupt};
use crate::families::DEDUP;
use crate::keys;
use crate::store::{Durability, RocksStore};
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
        let inner = &self.inner;
        let expiry = ttl::expiry(Some(ttl), inner.clock.now());
        let mut batch = WriteBatch::default();
        batch.put_cf(
            inner.family(OPERATION, DEDUP)?,
            keys::dedup(scope, record),
            ttl::encode(expiry, &[]),
        );
        inner.commit(OPERATION, batch, Durability::Buffered)
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

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use prosody_api::Partition;
    use prosody_api::storage::{DedupRecord, DedupStore, PartitionScope, Ttl};

    use crate::{RocksOptions, RocksStore};

    /// With synced writes (the default) a write goes to the blocking pool and waits for an
    /// `fsync`; a dedup insert does neither, so it is done the first time its future is polled.
    #[tokio::test]
    async fn dedup_inserts_complete_without_waiting_for_the_disk() {
        let options = RocksOptions::new();
        assert!(options.sync_writes(), "the default this test is about");
        let store = RocksStore::open_temporary(&options).expect("open a store");
        let scope = PartitionScope::new("group", "topic", Partition(0));
        let record = DedupRecord::new("key", "id", "1");
        let ttl = Ttl::from_secs(60).expect("a positive TTL");
        let mut insert = pin!(store.insert(&scope, &record, ttl));
        let polled = insert
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(
            matches!(polled, Poll::Ready(Ok(()))),
            "the insert waited for something"
        );
        assert!(store.contains(&scope, &record).await.expect("a lookup"));
    }
}
