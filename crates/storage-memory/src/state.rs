//! [`MemoryStateStore`]: keyed state and its published view.

use std::collections::{BTreeMap, HashMap};
use std::num::{NonZeroU16, NonZeroU32};
use std::ops::Bound;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use parking_lot::RwLock;
use prosody_api::storage::{
    DequeBounds, PublishedScope, PublishedStateView, ScanDirection, ScanRequest, StateOp,
    StateScope, StateStore, StateWrite, Ttl,
};
use prosody_api::{Clock, Key, StorageError};
use serde_json::Value;

use crate::sweep::SweepSchedule;

const APPLY: &str = "state.apply";

/// Keyed state in memory. Also implements [`PublishedStateView`] over the data it holds under
/// subsystem namespaces, so one instance serves owners and published readers.
#[derive(Clone, Debug)]
pub struct MemoryStateStore {
    clock: Arc<dyn Clock>,
    inner: Arc<RwLock<Inner>>,
}

#[derive(Debug)]
struct Inner {
    cells: HashMap<(StateScope, Key), Cell>,
    sweep: SweepSchedule,
}

#[derive(Clone, Debug)]
struct Entry {
    value: Value,
    expires: Option<SystemTime>,
}

impl Entry {
    fn new(value: &Value, ttl: Option<Ttl>, now: SystemTime) -> Self {
        Self {
            value: value.clone(),
            expires: ttl.map(|ttl| ttl.expires_at(now)),
        }
    }

    fn live(&self, now: SystemTime) -> bool {
        self.expires.is_none_or(|at| now < at)
    }
}

#[derive(Clone, Debug)]
struct Deque {
    bounds: DequeBounds,
    expires: Option<SystemTime>,
    items: BTreeMap<i64, Entry>,
}

/// All data of one (collection, key): the store does not know the collection's kind, so the
/// three kinds live side by side (see the trait docs).
#[derive(Clone, Debug, Default)]
struct Cell {
    value: Option<Entry>,
    map: BTreeMap<String, Entry>,
    deque: Option<Deque>,
}

impl Cell {
    fn live_deque(&self, now: SystemTime) -> Option<&Deque> {
        self.deque
            .as_ref()
            .filter(|deque| deque.expires.is_none_or(|at| now < at))
    }

    /// Drops whatever has expired; true when nothing is left.
    fn sweep(&mut self, now: SystemTime) -> bool {
        if self.value.as_ref().is_some_and(|entry| !entry.live(now)) {
            self.value = None;
        }
        self.map.retain(|_, entry| entry.live(now));
        if self.live_deque(now).is_none() {
            self.deque = None;
        }
        if let Some(deque) = &mut self.deque {
            deque.items.retain(|_, entry| entry.live(now));
        }
        self.value.is_none() && self.map.is_empty() && self.deque.is_none()
    }

    fn apply(&mut self, op: &StateOp, now: SystemTime) -> Result<(), StorageError> {
        match op {
            StateOp::PutValue { value, ttl } => {
                self.value = Some(Entry::new(value, *ttl, now));
            }
            StateOp::DeleteValue => self.value = None,
            StateOp::PutMapEntry {
                entry,
                value,
                ttl,
                keyset_limit,
            } => self.put_map_entry(entry, Entry::new(value, *ttl, now), *keyset_limit, now)?,
            StateOp::DeleteMapEntry { entry } => {
                self.map.remove(entry);
            }
            StateOp::ClearMap => self.map.clear(),
            StateOp::SetDequeBounds {
                bounds,
                ttl,
                capacity,
            } => {
                self.set_deque_bounds(*bounds, ttl.map(|ttl| ttl.expires_at(now)), *capacity, now)?;
            }
            StateOp::PutDequeItem {
                position,
                item,
                ttl,
            } => self.put_deque_item(*position, Entry::new(item, *ttl, now), now)?,
            StateOp::ClearDeque => self.deque = None,
        }
        Ok(())
    }

    fn put_map_entry(
        &mut self,
        entry: &str,
        value: Entry,
        keyset_limit: Option<NonZeroU16>,
        now: SystemTime,
    ) -> Result<(), StorageError> {
        let present = self
            .map
            .get(entry)
            .is_some_and(|existing| existing.live(now));
        if let (false, Some(limit)) = (present, keyset_limit) {
            let live = self
                .map
                .values()
                .filter(|existing| existing.live(now))
                .count();
            if live >= usize::from(limit.get()) {
                return Err(StorageError::limit_exceeded(
                    APPLY,
                    format!(
                        "map already holds its keyset limit of {limit} entries; cannot add `{entry}`"
                    ),
                ));
            }
        }
        self.map.insert(entry.to_owned(), value);
        Ok(())
    }

    fn set_deque_bounds(
        &mut self,
        mut bounds: DequeBounds,
        expires: Option<SystemTime>,
        capacity: Option<NonZeroU32>,
        now: SystemTime,
    ) -> Result<(), StorageError> {
        if bounds.head > bounds.tail {
            return Err(StorageError::invalid_request(
                APPLY,
                format!("inverted deque bounds {}..{}", bounds.head, bounds.tail),
            ));
        }
        if let Some(capacity) = capacity
            && bounds.len() > u64::from(capacity.get())
        {
            bounds.head = bounds.tail.saturating_sub(i64::from(capacity.get()));
        }
        // Items of an expired deque died with it: new bounds start from nothing.
        let mut items = match self.deque.take() {
            Some(deque) if deque.expires.is_none_or(|at| now < at) => deque.items,
            _ => BTreeMap::new(),
        };
        items.retain(|position, _| bounds.contains(*position));
        self.deque = Some(Deque {
            bounds,
            expires,
            items,
        });
        Ok(())
    }

    fn put_deque_item(
        &mut self,
        position: i64,
        item: Entry,
        now: SystemTime,
    ) -> Result<(), StorageError> {
        let inside = self
            .live_deque(now)
            .is_some_and(|deque| deque.bounds.contains(position));
        let (Some(deque), true) = (&mut self.deque, inside) else {
            return Err(StorageError::invalid_request(
                APPLY,
                format!("deque item at {position} is outside the deque's bounds"),
            ));
        };
        deque.items.insert(position, item);
        Ok(())
    }
}

/// One chunk of live entries after `after` in `direction`.
fn chunk<C: Ord + Clone>(
    entries: &BTreeMap<C, Entry>,
    scan: &ScanRequest<C>,
    now: SystemTime,
    keep: impl Fn(&C) -> bool,
) -> Vec<(C, Value)> {
    let limit = usize::try_from(scan.limit.get()).unwrap_or(usize::MAX);
    let pick = |(cursor, entry): (&C, &Entry)| {
        (entry.live(now) && keep(cursor)).then(|| (cursor.clone(), entry.value.clone()))
    };
    match (scan.direction, &scan.after) {
        (ScanDirection::Forward, after) => {
            let start = after.as_ref().map_or(Bound::Unbounded, Bound::Excluded);
            entries
                .range((start, Bound::Unbounded))
                .filter_map(pick)
                .take(limit)
                .collect()
        }
        (ScanDirection::Backward, after) => {
            let end = after.as_ref().map_or(Bound::Unbounded, Bound::Excluded);
            entries
                .range((Bound::Unbounded, end))
                .rev()
                .filter_map(pick)
                .take(limit)
                .collect()
        }
    }
}

impl MemoryStateStore {
    /// An empty store judging TTL by `clock`.
    pub fn new(clock: impl Clock + 'static) -> Self {
        Self {
            clock: Arc::new(clock),
            inner: Arc::new(RwLock::new(Inner {
                cells: HashMap::new(),
                sweep: SweepSchedule::new(),
            })),
        }
    }

    /// Number of cells held (for tests of the sweep).
    #[must_use]
    pub fn cell_count(&self) -> usize {
        self.inner.read().cells.len()
    }

    fn read<T: Default>(
        &self,
        scope: &StateScope,
        key: &Key,
        read: impl FnOnce(&Cell, SystemTime) -> T,
    ) -> T {
        let now = self.clock.now();
        self.inner
            .read()
            .cells
            .get(&(scope.clone(), key.clone()))
            .map(|cell| read(cell, now))
            .unwrap_or_default()
    }

    fn value(&self, scope: &StateScope, key: &Key) -> Option<Value> {
        self.read(scope, key, |cell, now| {
            cell.value
                .as_ref()
                .filter(|entry| entry.live(now))
                .map(|entry| entry.value.clone())
        })
    }

    fn map_entries(&self, scope: &StateScope, key: &Key, entries: &[String]) -> Vec<Option<Value>> {
        let found = self.read(scope, key, |cell, now| {
            entries
                .iter()
                .map(|entry| {
                    cell.map
                        .get(entry)
                        .filter(|found| found.live(now))
                        .map(|found| found.value.clone())
                })
                .collect::<Vec<_>>()
        });
        if found.is_empty() {
            vec![None; entries.len()]
        } else {
            found
        }
    }

    fn map_scan(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Vec<(String, Value)> {
        self.read(scope, key, |cell, now| {
            chunk(&cell.map, scan, now, |_| true)
        })
    }

    fn deque_bounds(&self, scope: &StateScope, key: &Key) -> Option<DequeBounds> {
        self.read(scope, key, |cell, now| {
            cell.live_deque(now).map(|deque| deque.bounds)
        })
    }

    fn deque_items(&self, scope: &StateScope, key: &Key, positions: &[i64]) -> Vec<Option<Value>> {
        let found = self.read(scope, key, |cell, now| {
            let Some(deque) = cell.live_deque(now) else {
                return Vec::new();
            };
            positions
                .iter()
                .map(|position| {
                    deque
                        .items
                        .get(position)
                        .filter(|item| deque.bounds.contains(*position) && item.live(now))
                        .map(|item| item.value.clone())
                })
                .collect()
        });
        if found.is_empty() {
            vec![None; positions.len()]
        } else {
            found
        }
    }

    fn deque_scan(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Vec<(i64, Value)> {
        self.read(scope, key, |cell, now| {
            cell.live_deque(now)
                .map(|deque| {
                    chunk(&deque.items, scan, now, |position| {
                        deque.bounds.contains(*position)
                    })
                })
                .unwrap_or_default()
        })
    }
}

#[async_trait]
impl StateStore for MemoryStateStore {
    async fn get_value(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        Ok(self.value(scope, key))
    }

    async fn get_map_entries(
        &self,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        Ok(self.map_entries(scope, key, entries))
    }

    async fn scan_map(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        Ok(self.map_scan(scope, key, scan))
    }

    async fn get_deque_bounds(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        Ok(self.deque_bounds(scope, key))
    }

    async fn get_deque_items(
        &self,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        Ok(self.deque_items(scope, key, positions))
    }

    async fn scan_deque(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        Ok(self.deque_scan(scope, key, scan))
    }

    async fn apply(&self, writes: &[StateWrite]) -> Result<(), StorageError> {
        let now = self.clock.now();
        let mut inner = self.inner.write();
        // Work on copies of the touched cells and swap them in only if every op succeeded:
        // that is the all-or-nothing contract, and the write lock makes it isolated too.
        let mut staged: HashMap<(StateScope, Key), Cell> = HashMap::new();
        for write in writes {
            let index = (write.scope.clone(), write.key.clone());
            let cell = staged
                .entry(index)
                .or_insert_with_key(|index| inner.cells.get(index).cloned().unwrap_or_default());
            cell.apply(&write.op, now)?;
        }
        for (index, mut cell) in staged {
            if cell.sweep(now) {
                inner.cells.remove(&index);
            } else {
                inner.cells.insert(index, cell);
            }
        }
        if inner.sweep.due(inner.cells.len()) {
            inner.cells.retain(|_, cell| !cell.sweep(now));
            let len = inner.cells.len();
            inner.sweep.swept(len);
        }
        Ok(())
    }
}

#[async_trait]
impl PublishedStateView for MemoryStateStore {
    async fn published_value(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        Ok(self.value(&scope.state_scope(), key))
    }

    async fn published_map_entries(
        &self,
        scope: &PublishedScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        Ok(self.map_entries(&scope.state_scope(), key, entries))
    }

    async fn published_map_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        Ok(self.map_scan(&scope.state_scope(), key, scan))
    }

    async fn published_deque_bounds(
        &self,
        scope: &PublishedScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        Ok(self.deque_bounds(&scope.state_scope(), key))
    }

    async fn published_deque_items(
        &self,
        scope: &PublishedScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        Ok(self.deque_items(&scope.state_scope(), key, positions))
    }

    async fn published_deque_scan(
        &self,
        scope: &PublishedScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        Ok(self.deque_scan(&scope.state_scope(), key, scan))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prosody_api::ManualClock;
    use prosody_api::storage::Ttl;
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn expired_cells_are_swept_as_the_store_grows() {
        let clock = ManualClock::new();
        let store = MemoryStateStore::new(clock.clone());
        let scope = StateScope::group("g", "c");
        for index in 0..3000 {
            let write = StateWrite::new(
                scope.clone(),
                format!("key-{index}"),
                StateOp::PutValue {
                    value: json!(index),
                    ttl: Ttl::from_secs(1),
                },
            );
            store.apply(&[write]).await.unwrap();
            clock.advance(Duration::from_secs(1));
        }
        assert!(
            store.cell_count() <= 1024,
            "held {} cells",
            store.cell_count()
        );
    }

    #[tokio::test]
    async fn a_batch_that_empties_a_cell_drops_it() {
        let store = MemoryStateStore::new(ManualClock::new());
        let scope = StateScope::group("g", "c");
        let write = |op| StateWrite::new(scope.clone(), "k", op);
        store
            .apply(&[write(StateOp::PutValue {
                value: json!(1),
                ttl: None,
            })])
            .await
            .unwrap();
        assert_eq!(store.cell_count(), 1);
        store.apply(&[write(StateOp::DeleteValue)]).await.unwrap();
        assert_eq!(store.cell_count(), 0);
    }
}
