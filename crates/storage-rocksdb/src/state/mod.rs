//! [`StateStore`] on the `state` column family: reads and scans here, the atomic batch in
//! [`apply`].
//!
//! # Consistency of reads
//!
//! The trait requires a read to see, per cell, all or none of a concurrent batch. A
//! `WriteBatch` becomes visible atomically, so a read is consistent when it reads at one
//! sequence number: point reads of several keys go through one `MultiGet` (which reads at one
//! sequence number), and a deque scan, which reads the bounds and then the items, reads both
//! from one snapshot.
//!
//! # Deque items and their bounds
//!
//! Items exist only inside the deque's bounds: setting bounds deletes the items left outside,
//! and an item may only be written inside them. Reads still check each item against the
//! bounds, so an item whose bounds expired (or were dropped by compaction) is never visible;
//! such items are deleted the next time the deque gets bounds. Items of a deque that expires
//! and is never written again stay on disk, since a compaction filter sees one key at a time
//! and cannot know that an item's bounds are gone.

mod apply;
pub(crate) mod codec;

use async_trait::async_trait;
use prosody_api::storage::{
    DequeBounds, ScanDirection, ScanRequest, StateScope, StateStore, StateWrite,
};
use prosody_api::{Key, StorageError};
use rocksdb::{DBRawIterator, ReadOptions};
use serde_json::Value;

use crate::error::{backend, corrupt};
use crate::families::STATE;
use crate::keys::{Cell, KeyBuf, KeyReader, prefix_end};
use crate::store::{Inner, RocksStore, finished, range};

use codec::{decode_bounds, decode_json};

impl Inner {
    pub(crate) fn state_value(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        let family = self.family(operation, STATE)?;
        let stored = self
            .db
            .get_pinned_cf(family, Cell::new(scope, key).value())
            .map_err(|error| backend(operation, error))?;
        match stored {
            Some(stored) => decode_json(operation, &stored, self.now_millis()),
            None => Ok(None),
        }
    }

    pub(crate) fn state_map_entries(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let family = self.family(operation, STATE)?;
        let cell = Cell::new(scope, key);
        let keys: Vec<_> = entries.iter().map(|entry| cell.map_entry(entry)).collect();
        let now = self.now_millis();
        self.db
            .batched_multi_get_cf(family, &keys, false)
            .into_iter()
            .map(
                |stored| match stored.map_err(|error| backend(operation, error))? {
                    Some(stored) => decode_json(operation, &stored, now),
                    None => Ok(None),
                },
            )
            .collect()
    }

    pub(crate) fn state_map_scan(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        let family = self.family(operation, STATE)?;
        let cell = Cell::new(scope, key);
        let map = cell.map();
        let cursor = scan.after.as_deref().map(|after| cell.map_entry(after));
        let read = match (scan.direction, &cursor) {
            (ScanDirection::Forward, Some(cursor)) => {
                range(cursor.as_bytes(), prefix_end(map.as_bytes()))
            }
            (ScanDirection::Backward, Some(cursor)) => {
                range(map.as_bytes(), Some(cursor.as_bytes().to_vec()))
            }
            (_, None) => range(map.as_bytes(), prefix_end(map.as_bytes())),
        };
        let now = self.now_millis();
        let iterator = self.db.raw_iterator_cf_opt(family, read);
        // A forward scan starts at the cursor's own key (the lower bound is inclusive), which is
        // skipped; a backward scan's upper bound already excludes it.
        let skip = cursor.as_ref().map(KeyBuf::as_bytes);
        collect(operation, iterator, scan, skip, |stored_key, stored| {
            let Some(value) = decode_json(operation, stored, now)? else {
                return Ok(None);
            };
            let entry = KeyReader::after(stored_key, map.as_bytes())
                .and_then(|mut reader| reader.str())
                .map_err(|error| corrupt(operation, error))?;
            Ok(Some((entry, value)))
        })
    }

    pub(crate) fn state_deque_bounds(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        let family = self.family(operation, STATE)?;
        let stored = self
            .db
            .get_pinned_cf(family, Cell::new(scope, key).bounds())
            .map_err(|error| backend(operation, error))?;
        match stored {
            Some(stored) => decode_bounds(operation, &stored, self.now_millis()),
            None => Ok(None),
        }
    }

    pub(crate) fn state_deque_items(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        let family = self.family(operation, STATE)?;
        let cell = Cell::new(scope, key);
        // The bounds and the items in one MultiGet: one consistent read.
        let keys: Vec<_> = std::iter::once(cell.bounds())
            .chain(positions.iter().map(|&position| cell.item(position)))
            .collect();
        let now = self.now_millis();
        let mut found = self
            .db
            .batched_multi_get_cf(family, &keys, false)
            .into_iter();
        let bounds = match found.next() {
            Some(stored) => match stored.map_err(|error| backend(operation, error))? {
                Some(stored) => decode_bounds(operation, &stored, now)?,
                None => None,
            },
            None => None,
        };
        let Some(bounds) = bounds else {
            return Ok(vec![None; positions.len()]);
        };
        positions
            .iter()
            .zip(found)
            .map(
                |(&position, stored)| match stored.map_err(|error| backend(operation, error))? {
                    Some(stored) if bounds.contains(position) => {
                        decode_json(operation, &stored, now)
                    }
                    _ => Ok(None),
                },
            )
            .collect()
    }

    pub(crate) fn state_deque_scan(
        &self,
        operation: &'static str,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        let family = self.family(operation, STATE)?;
        let cell = Cell::new(scope, key);
        let snapshot = self.db.snapshot();
        let now = self.now_millis();
        let bounds = match snapshot
            .get_pinned_cf(family, cell.bounds())
            .map_err(|error| backend(operation, error))?
        {
            Some(stored) => decode_bounds(operation, &stored, now)?,
            None => None,
        };
        let Some(bounds) = bounds else {
            return Ok(Vec::new());
        };
        // Positions to visit, `low..high`, within the bounds and strictly past the cursor.
        let (low, high) = match (scan.direction, scan.after) {
            (ScanDirection::Forward, Some(after)) => {
                (after.saturating_add(1).max(bounds.head), bounds.tail)
            }
            (ScanDirection::Backward, Some(after)) => (bounds.head, after.min(bounds.tail)),
            (_, None) => (bounds.head, bounds.tail),
        };
        if low >= high {
            return Ok(Vec::new());
        }
        let items = cell.items();
        let read: ReadOptions = range(
            cell.item(low).as_bytes(),
            Some(cell.item(high).into_bytes()),
        );
        let iterator = snapshot.raw_iterator_cf_opt(family, read);
        collect(operation, iterator, scan, None, |stored_key, stored| {
            let Some(value) = decode_json(operation, stored, now)? else {
                return Ok(None);
            };
            let position = KeyReader::after(stored_key, items.as_bytes())
                .and_then(|mut reader| reader.i64())
                .map_err(|error| corrupt(operation, error))?;
            Ok(Some((position, value)))
        })
    }
}

/// Up to `scan.limit` decoded entries of a bounded iterator in the scan's direction; `decode`
/// returns `None` for an entry to skip (expired).
fn collect<C, T>(
    operation: &'static str,
    mut iterator: DBRawIterator<'_>,
    scan: &ScanRequest<C>,
    skip: Option<&[u8]>,
    mut decode: impl FnMut(&[u8], &[u8]) -> Result<Option<T>, StorageError>,
) -> Result<Vec<T>, StorageError> {
    let limit = usize::try_from(scan.limit.get()).unwrap_or(usize::MAX);
    let forward = scan.direction == ScanDirection::Forward;
    if forward {
        iterator.seek_to_first();
    } else {
        iterator.seek_to_last();
    }
    let mut found = Vec::new();
    while found.len() < limit {
        let Some((key, value)) = iterator.item() else {
            break;
        };
        if skip != Some(key)
            && let Some(entry) = decode(key, value)?
        {
            found.push(entry);
        }
        if forward {
            iterator.next();
        } else {
            iterator.prev();
        }
    }
    finished(operation, &iterator)?;
    Ok(found)
}

#[async_trait]
impl StateStore for RocksStore {
    async fn get_value(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        self.inner.state_value("state.get_value", scope, key)
    }

    async fn get_map_entries(
        &self,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.inner
            .state_map_entries("state.get_map_entries", scope, key, entries)
    }

    async fn scan_map(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        self.inner
            .state_map_scan("state.scan_map", scope, key, scan)
    }

    async fn get_deque_bounds(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        self.inner
            .state_deque_bounds("state.get_deque_bounds", scope, key)
    }

    async fn get_deque_items(
        &self,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.inner
            .state_deque_items("state.get_deque_items", scope, key, positions)
    }

    async fn scan_deque(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        self.inner
            .state_deque_scan("state.scan_deque", scope, key, scan)
    }

    async fn apply(&self, writes: &[StateWrite]) -> Result<(), StorageError> {
        if writes.is_empty() {
            return Ok(());
        }
        let writes = writes.to_vec();
        self.write(apply::OPERATION, move |inner| apply::apply(inner, &writes))
            .await
    }
}
