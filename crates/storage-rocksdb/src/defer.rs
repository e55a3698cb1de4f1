//! [`DeferStore`] on the `defer` column family.
//!
//! A key's deferred messages and deferred timers are two adjacent prefixes, ordered by offset
//! and by time, so each listing is one prefix scan and each clear is one range delete. Every
//! write is a single put or delete of an absolute value, so it is idempotent and needs no
//! read first.

use async_trait::async_trait;
use prosody_api::storage::{DeferStore, DeferredMessage, DeferredTimer, PartitionScope};
use prosody_api::{Key, Offset, StorageError, TimerTime};
use rocksdb::WriteBatch;

use crate::error::corrupt;
use crate::families::DEFER;
use crate::keys::{KeyBuf, KeyReader, defer as keys, prefix_end};
use crate::store::{Durability, Inner, RocksStore, finished, prefix};

/// What a write does to one entry or one list.
enum Edit {
    Put(KeyBuf, u32),
    Delete(KeyBuf),
    Clear(KeyBuf),
}

impl Inner {
    fn defer_edit(&self, operation: &'static str, edit: Edit) -> Result<(), StorageError> {
        let family = self.family(operation, DEFER)?;
        let mut batch = WriteBatch::default();
        match edit {
            Edit::Put(key, retry_count) => batch.put_cf(family, key, retry_count.to_be_bytes()),
            Edit::Delete(key) => batch.delete_cf(family, key),
            Edit::Clear(list) => match prefix_end(list.as_bytes()) {
                Some(end) => batch.delete_range_cf(family, list.as_bytes(), &end),
                None => return Err(corrupt(operation, "a deferred list without an end key")),
            },
        }
        self.commit(operation, batch, Durability::Configured)
    }

    /// The keys with entries in the partition: one seek per key, past the key's entries.
    fn deferred_keys(
        &self,
        operation: &'static str,
        scope: &PartitionScope,
    ) -> Result<Vec<Key>, StorageError> {
        let family = self.family(operation, DEFER)?;
        let partition = keys::partition_prefix(scope);
        let mut iterator = self
            .db
            .raw_iterator_cf_opt(family, prefix(partition.as_bytes()));
        iterator.seek_to_first();
        let mut listed = Vec::new();
        while let Some(stored) = iterator.key() {
            let key = KeyReader::after(stored, partition.as_bytes())
                .and_then(|mut reader| reader.str())
                .map_err(|e| corrupt(operation, e))?;
            let next = prefix_end(keys::key_prefix(scope, &key).as_bytes());
            listed.push(Key::from(key));
            match next {
                Some(next) => iterator.seek(next),
                None => break,
            }
        }
        finished(operation, &iterator)?;
        Ok(listed)
    }

    /// Every (number, retry count) of a list, in key order.
    fn deferred<T>(
        &self,
        operation: &'static str,
        list: &KeyBuf,
        mut number: impl FnMut(&mut KeyReader<'_>) -> Result<T, crate::keys::DecodeError>,
    ) -> Result<Vec<(T, u32)>, StorageError> {
        let family = self.family(operation, DEFER)?;
        let mut iterator = self.db.raw_iterator_cf_opt(family, prefix(list.as_bytes()));
        iterator.seek_to_first();
        let mut entries = Vec::new();
        while let Some((stored, value)) = iterator.item() {
            let mut reader =
                KeyReader::after(stored, list.as_bytes()).map_err(|e| corrupt(operation, e))?;
            let number = number(&mut reader).map_err(|e| corrupt(operation, e))?;
            let retry_count = <[u8; 4]>::try_from(value)
                .map(u32::from_be_bytes)
                .map_err(|_| corrupt(operation, "a retry count is not 4 bytes"))?;
            entries.push((number, retry_count));
            iterator.next();
        }
        finished(operation, &iterator)?;
        Ok(entries)
    }
}

impl RocksStore {
    async fn defer_edit(&self, operation: &'static str, edit: Edit) -> Result<(), StorageError> {
        self.write(operation, move |inner| inner.defer_edit(operation, edit))
            .await
    }
}

// The closures passed to `deferred` cannot be method paths: a path names one reader lifetime,
// and `deferred` needs a decoder for any.
#[allow(clippy::redundant_closure_for_method_calls)]
#[async_trait]
impl DeferStore for RocksStore {
    async fn deferred_keys(&self, scope: &PartitionScope) -> Result<Vec<Key>, StorageError> {
        self.inner.deferred_keys("defer.deferred_keys", scope)
    }

    async fn defer_message(
        &self,
        scope: &PartitionScope,
        key: &Key,
        message: DeferredMessage,
    ) -> Result<(), StorageError> {
        let entry = keys::message(scope, key, message.offset);
        self.defer_edit("defer.defer_message", Edit::Put(entry, message.retry_count))
            .await
    }

    async fn deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredMessage>, StorageError> {
        let list = keys::messages(scope, key);
        let entries = self
            .inner
            .deferred("defer.deferred_messages", &list, |reader| reader.i64())?;
        Ok(entries
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
        let entry = keys::message(scope, key, offset);
        self.defer_edit("defer.remove_deferred_message", Edit::Delete(entry))
            .await
    }

    async fn clear_deferred_messages(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError> {
        let list = keys::messages(scope, key);
        self.defer_edit("defer.clear_deferred_messages", Edit::Clear(list))
            .await
    }

    async fn defer_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        timer: DeferredTimer,
    ) -> Result<(), StorageError> {
        let entry = keys::timer(scope, key, timer.time);
        self.defer_edit("defer.defer_timer", Edit::Put(entry, timer.retry_count))
            .await
    }

    async fn deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<Vec<DeferredTimer>, StorageError> {
        let list = keys::timers(scope, key);
        let entries = self
            .inner
            .deferred("defer.deferred_timers", &list, |reader| reader.u64())?;
        Ok(entries
            .into_iter()
            .map(|(secs, retry_count)| DeferredTimer {
                time: TimerTime::from_secs(secs),
                retry_count,
            })
            .collect())
    }

    async fn remove_deferred_timer(
        &self,
        scope: &PartitionScope,
        key: &Key,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        let entry = keys::timer(scope, key, time);
        self.defer_edit("defer.remove_deferred_timer", Edit::Delete(entry))
            .await
    }

    async fn clear_deferred_timers(
        &self,
        scope: &PartitionScope,
        key: &Key,
    ) -> Result<(), StorageError> {
        let list = keys::timers(scope, key);
        self.defer_edit("defer.clear_deferred_timers", Edit::Clear(list))
            .await
    }
}
