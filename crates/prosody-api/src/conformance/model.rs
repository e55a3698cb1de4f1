//! A reference model of keyed state, and reading a cell back from a store for comparison.
//!
//! The model is the contract of [`crate::storage::StateStore`] written as plainly as possible
//! (clone, apply, keep on success), so a property can check a backend against it op by op.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::SystemTime;

use serde_json::Value;

use crate::error::{StorageError, StorageErrorKind};
use crate::key::Key;
use crate::storage::{
    DequeBounds, PublishedScope, PublishedStateView, ScanDirection, ScanRequest, StateOp,
    StateScope, StateStore, StateWrite, Ttl,
};

type Expiry = Option<SystemTime>;

fn live(expiry: Expiry, now: SystemTime) -> bool {
    expiry.is_none_or(|at| now < at)
}

fn expiry(ttl: Option<Ttl>, now: SystemTime) -> Expiry {
    ttl.map(|ttl| ttl.expires_at(now))
}

/// The model of one cell.
#[derive(Clone, Debug, Default)]
pub struct ModelCell {
    value: Option<(Value, Expiry)>,
    map: BTreeMap<String, (Value, Expiry)>,
    bounds: Option<(DequeBounds, Expiry)>,
    items: BTreeMap<i64, (Value, Expiry)>,
}

impl ModelCell {
    /// The live deque bounds.
    pub fn bounds(&self, now: SystemTime) -> Option<DequeBounds> {
        self.bounds
            .filter(|(_, at)| live(*at, now))
            .map(|(bounds, _)| bounds)
    }

    fn apply(&mut self, op: &StateOp, now: SystemTime) -> Result<(), StorageErrorKind> {
        match op {
            StateOp::PutValue { value, ttl } => {
                self.value = Some((value.clone(), expiry(*ttl, now)));
            }
            StateOp::DeleteValue => self.value = None,
            StateOp::PutMapEntry {
                entry,
                value,
                ttl,
                keyset_limit,
            } => {
                let present = self.map.get(entry).is_some_and(|(_, at)| live(*at, now));
                if let (false, Some(limit)) = (present, keyset_limit) {
                    let count = self.map.values().filter(|(_, at)| live(*at, now)).count();
                    if count >= usize::from(limit.get()) {
                        return Err(StorageErrorKind::LimitExceeded);
                    }
                }
                self.map
                    .insert(entry.clone(), (value.clone(), expiry(*ttl, now)));
            }
            StateOp::DeleteMapEntry { entry } => {
                self.map.remove(entry);
            }
            StateOp::ClearMap => self.map.clear(),
            StateOp::SetDequeBounds {
                bounds,
                ttl,
                capacity,
            } => {
                if bounds.head > bounds.tail {
                    return Err(StorageErrorKind::InvalidRequest);
                }
                if self.bounds(now).is_none() {
                    self.items.clear();
                }
                let mut bounds = *bounds;
                if let Some(capacity) = capacity {
                    let capacity = i64::from(capacity.get());
                    if bounds.tail - bounds.head > capacity {
                        bounds.head = bounds.tail - capacity;
                    }
                }
                self.items.retain(|position, _| bounds.contains(*position));
                self.bounds = Some((bounds, expiry(*ttl, now)));
            }
            StateOp::PutDequeItem {
                position,
                item,
                ttl,
            } => {
                if !self.bounds(now).is_some_and(|b| b.contains(*position)) {
                    return Err(StorageErrorKind::InvalidRequest);
                }
                self.items
                    .insert(*position, (item.clone(), expiry(*ttl, now)));
            }
            StateOp::ClearDeque => {
                self.bounds = None;
                self.items.clear();
            }
        }
        Ok(())
    }

    /// What a conforming store returns for this cell at `now`.
    pub fn snapshot(&self, now: SystemTime, entries: &[String]) -> Snapshot {
        let map: Vec<(String, Value)> = self
            .map
            .iter()
            .filter(|(_, (_, at))| live(*at, now))
            .map(|(entry, (value, _))| (entry.clone(), value.clone()))
            .collect();
        let bounds = self.bounds(now);
        let deque: Vec<(i64, Value)> = bounds
            .map(|bounds| {
                self.items
                    .iter()
                    .filter(|(position, (_, at))| bounds.contains(**position) && live(*at, now))
                    .map(|(position, (item, _))| (*position, item.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let positions = probe_positions(bounds);
        Snapshot {
            value: self
                .value
                .as_ref()
                .filter(|(_, at)| live(*at, now))
                .map(|(value, _)| value.clone()),
            map_points: entries
                .iter()
                .map(|entry| {
                    map.iter()
                        .find(|(present, _)| present == entry)
                        .map(|(_, value)| value.clone())
                })
                .collect(),
            map_backward: map.iter().rev().cloned().collect(),
            map_forward: map,
            bounds,
            deque_points: positions
                .iter()
                .map(|position| {
                    deque
                        .iter()
                        .find(|(present, _)| present == position)
                        .map(|(_, item)| item.clone())
                })
                .collect(),
            deque_backward: deque.iter().rev().cloned().collect(),
            deque_forward: deque,
        }
    }
}

/// The model of a whole store.
#[derive(Clone, Debug, Default)]
pub struct Model {
    cells: BTreeMap<(StateScope, Key), ModelCell>,
}

impl Model {
    /// Applies a batch all or nothing, like [`StateStore::apply`].
    pub fn apply(
        &mut self,
        writes: &[StateWrite],
        now: SystemTime,
    ) -> Result<(), StorageErrorKind> {
        let mut next = self.cells.clone();
        for write in writes {
            next.entry((write.scope.clone(), write.key.clone()))
                .or_default()
                .apply(&write.op, now)?;
        }
        self.cells = next;
        Ok(())
    }

    /// One cell (empty if never written).
    pub fn cell(&self, scope: &StateScope, key: &Key) -> ModelCell {
        self.cells
            .get(&(scope.clone(), key.clone()))
            .cloned()
            .unwrap_or_default()
    }
}

/// Every read of one cell, so one comparison checks them all.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Snapshot {
    /// `get_value`.
    pub value: Option<Value>,
    /// `get_map_entries` of the probed entries.
    pub map_points: Vec<Option<Value>>,
    /// The forward scan, paged.
    pub map_forward: Vec<(String, Value)>,
    /// The backward scan, paged.
    pub map_backward: Vec<(String, Value)>,
    /// `get_deque_bounds`.
    pub bounds: Option<DequeBounds>,
    /// `get_deque_items` of every position in and just around the bounds.
    pub deque_points: Vec<Option<Value>>,
    /// The forward scan, paged.
    pub deque_forward: Vec<(i64, Value)>,
    /// The backward scan, paged.
    pub deque_backward: Vec<(i64, Value)>,
}

fn probe_positions(bounds: Option<DequeBounds>) -> Vec<i64> {
    bounds.map_or_else(
        || vec![-1, 0, 1],
        |bounds| ((bounds.head - 1)..=bounds.tail).collect(),
    )
}

/// Where reads of a cell come from: the owner's store or a published view.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// [`StateStore`] reads.
    Store(&'a dyn StateStore, &'a StateScope),
    /// [`PublishedStateView`] reads.
    View(&'a dyn PublishedStateView, &'a PublishedScope),
}

impl Source<'_> {
    pub async fn value(&self, key: &Key) -> Result<Option<Value>, StorageError> {
        match self {
            Self::Store(store, scope) => store.get_value(scope, key).await,
            Self::View(view, scope) => view.published_value(scope, key).await,
        }
    }

    pub async fn map_entries(
        &self,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        match self {
            Self::Store(store, scope) => store.get_map_entries(scope, key, entries).await,
            Self::View(view, scope) => view.published_map_entries(scope, key, entries).await,
        }
    }

    pub async fn map_chunk(
        &self,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        match self {
            Self::Store(store, scope) => store.scan_map(scope, key, scan).await,
            Self::View(view, scope) => view.published_map_scan(scope, key, scan).await,
        }
    }

    pub async fn bounds(&self, key: &Key) -> Result<Option<DequeBounds>, StorageError> {
        match self {
            Self::Store(store, scope) => store.get_deque_bounds(scope, key).await,
            Self::View(view, scope) => view.published_deque_bounds(scope, key).await,
        }
    }

    pub async fn deque_items(
        &self,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        match self {
            Self::Store(store, scope) => store.get_deque_items(scope, key, positions).await,
            Self::View(view, scope) => view.published_deque_items(scope, key, positions).await,
        }
    }

    pub async fn deque_chunk(
        &self,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        match self {
            Self::Store(store, scope) => store.scan_deque(scope, key, scan).await,
            Self::View(view, scope) => view.published_deque_scan(scope, key, scan).await,
        }
    }

    /// Pages a whole map scan in chunks of `limit`, checking each chunk's size, order and
    /// cursor discipline on the way.
    pub async fn map_scan(
        &self,
        key: &Key,
        direction: ScanDirection,
        limit: NonZeroU32,
    ) -> Result<Vec<(String, Value)>, String> {
        let mut all: Vec<(String, Value)> = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let scan = ScanRequest {
                direction,
                after: after.clone(),
                limit,
            };
            let chunk = self
                .map_chunk(key, &scan)
                .await
                .map_err(|error| format!("scan_map {scan:?}: {error}"))?;
            let Some((last, _)) = chunk.last() else {
                return Ok(all);
            };
            check_chunk(&scan, chunk.iter().map(|(entry, _)| entry), chunk.len())?;
            after = Some(last.clone());
            all.extend(chunk);
            if all.len() > 1_000_000 {
                return Err("scan_map does not terminate".into());
            }
        }
    }

    /// Pages a whole deque scan, like [`Source::map_scan`].
    pub async fn deque_scan(
        &self,
        key: &Key,
        direction: ScanDirection,
        limit: NonZeroU32,
    ) -> Result<Vec<(i64, Value)>, String> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let scan = ScanRequest {
                direction,
                after,
                limit,
            };
            let chunk = self
                .deque_chunk(key, &scan)
                .await
                .map_err(|error| format!("scan_deque {scan:?}: {error}"))?;
            let Some((last, _)) = chunk.last() else {
                return Ok(all);
            };
            check_chunk(
                &scan,
                chunk.iter().map(|(position, _)| position),
                chunk.len(),
            )?;
            after = Some(*last);
            all.extend(chunk);
            if all.len() > 1_000_000 {
                return Err("scan_deque does not terminate".into());
            }
        }
    }

    /// Reads every view of the cell; map point reads probe `entries`.
    pub async fn snapshot(&self, key: &Key, entries: &[String]) -> Result<Snapshot, String> {
        let fail = |what: &str, error: StorageError| format!("{what}: {error}");
        let bounds = self
            .bounds(key)
            .await
            .map_err(|e| fail("get_deque_bounds", e))?;
        let two = NonZeroU32::MIN.saturating_add(1);
        let three = NonZeroU32::MIN.saturating_add(2);
        Ok(Snapshot {
            value: self.value(key).await.map_err(|e| fail("get_value", e))?,
            map_points: self
                .map_entries(key, entries)
                .await
                .map_err(|e| fail("get_map_entries", e))?,
            map_forward: self.map_scan(key, ScanDirection::Forward, two).await?,
            map_backward: self.map_scan(key, ScanDirection::Backward, three).await?,
            bounds,
            deque_points: self
                .deque_items(key, &probe_positions(bounds))
                .await
                .map_err(|e| fail("get_deque_items", e))?,
            deque_forward: self.deque_scan(key, ScanDirection::Forward, three).await?,
            deque_backward: self.deque_scan(key, ScanDirection::Backward, two).await?,
        })
    }
}

/// A chunk is within its limit, strictly ordered in the scan direction, and strictly after the
/// cursor.
fn check_chunk<'a, C: Ord + std::fmt::Debug + 'a>(
    scan: &ScanRequest<C>,
    cursors: impl Iterator<Item = &'a C>,
    len: usize,
) -> Result<(), String> {
    if u32::try_from(len).map_or(true, |len| len > scan.limit.get()) {
        return Err(format!("chunk of {len} exceeds the limit of {scan:?}"));
    }
    let mut previous = scan.after.as_ref();
    for cursor in cursors {
        if let Some(previous) = previous {
            let ordered = match scan.direction {
                ScanDirection::Forward => cursor > previous,
                ScanDirection::Backward => cursor < previous,
            };
            if !ordered {
                return Err(format!(
                    "{cursor:?} is out of {:?} order after {previous:?} in {scan:?}",
                    scan.direction
                ));
            }
        }
        previous = Some(cursor);
    }
    Ok(())
}

/// The probed map entries of the properties: every entry they can write plus one never written.
pub fn probe_entries(entries: &[&str]) -> Vec<String> {
    entries
        .iter()
        .map(|entry| (*entry).to_owned())
        .chain(std::iter::once("never-written".to_owned()))
        .collect()
}

/// The kind of a failed apply, to compare with the model's.
pub fn kind_of(result: &Result<(), StorageError>) -> Result<(), StorageErrorKind> {
    match result {
        Ok(()) => Ok(()),
        Err(error) => Err(error.kind()),
    }
}
