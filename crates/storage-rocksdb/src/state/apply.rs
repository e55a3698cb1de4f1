//! [`StateStore::apply`](prosody_api::storage::StateStore::apply): a batch of staged writes as
//! one atomic `WriteBatch`.
//!
//! Ops are translated in order into the `WriteBatch`, whose own order makes later ops win
//! (a put after a range delete survives it). Three ops must first look at the cell: a put into
//! a keyset-limited map (is the entry new, and how many live entries are there?), new deque
//! bounds (which items fall outside?) and a deque item (is it inside the bounds?). They read
//! the stored cell once and then track the batch's own changes in a small per-cell view, so a
//! later op sees the earlier ones. A rejected op returns before anything is written, which is
//! the all-or-nothing contract.
//!
//! The read-then-write would race with another batch on the same cell, so a batch holds the
//! lock stripes of every cell it touches from the first read to the commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::num::{NonZeroU16, NonZeroU32};
use std::time::SystemTime;

use prosody_api::StorageError;
use prosody_api::storage::{DequeBounds, StateOp, StateWrite, Ttl};
use rocksdb::{ColumnFamily, WriteBatch};
use serde_json::Value;

use super::codec::{decode_bounds, encode_bounds, encode_json, is_live};
use crate::error::{backend, corrupt};
use crate::families::STATE;
use crate::keys::{Cell, KeyReader, prefix_end};
use crate::store::{Durability, Inner, finished, prefix};
use crate::ttl;

/// The operation name of every apply error.
pub const OPERATION: &str = "state.apply";

/// Ranges of positions at most this long are deleted key by key; longer ones with one range
/// tombstone. Pops, shifts and evictions remove one item, and a point delete costs reads
/// nothing later, whereas every range tombstone is consulted by reads until compacted.
const POINT_DELETE_MAX: i128 = 64;

/// Applies `writes` atomically (see the module docs).
pub fn apply(inner: &Inner, writes: &[StateWrite]) -> Result<(), StorageError> {
    let cells: Vec<Cell> = writes
        .iter()
        .map(|write| Cell::new(&write.scope, &write.key))
        .collect();
    let _guards = inner.lock(cells.iter().map(Cell::as_bytes));
    let now = inner.clock.now();
    let mut staging = Staging {
        inner,
        family: inner.family(OPERATION, STATE)?,
        now,
        now_millis: ttl::millis(now),
        batch: WriteBatch::default(),
        views: HashMap::new(),
    };
    for (write, cell) in writes.iter().zip(&cells) {
        staging.op(cell, &write.op)?;
    }
    let batch = staging.batch;
    inner.commit(OPERATION, batch, Durability::Configured)
}

/// What the batch so far has done to one cell, as far as later ops need to know.
#[derive(Default)]
struct View {
    map: MapView,
    /// Loaded on the first deque op.
    deque: Option<DequeView>,
}

#[derive(Default)]
struct MapView {
    /// A `ClearMap` in this batch hides every stored entry.
    cleared: bool,
    /// Entries written in this batch: live (put) or not (deleted).
    pending: BTreeMap<String, bool>,
    /// The stored live entries, loaded on the first limited put.
    stored: Option<BTreeSet<String>>,
}

struct DequeView {
    /// The live bounds, stored or set by this batch.
    bounds: Option<DequeBounds>,
    /// True when no item can exist on disk (cleared in this batch).
    no_items: bool,
}

struct Staging<'a> {
    inner: &'a Inner,
    family: &'a ColumnFamily,
    now: SystemTime,
    now_millis: u64,
    batch: WriteBatch,
    views: HashMap<Vec<u8>, View>,
}

impl Staging<'_> {
    fn op(&mut self, cell: &Cell, op: &StateOp) -> Result<(), StorageError> {
        match op {
            StateOp::PutValue { value, ttl } => {
                let stored = self.encode(value, *ttl)?;
                self.batch.put_cf(self.family, cell.value(), stored);
            }
            StateOp::DeleteValue => self.batch.delete_cf(self.family, cell.value()),
            StateOp::PutMapEntry {
                entry,
                value,
                ttl,
                keyset_limit,
            } => {
                if let Some(limit) = keyset_limit {
                    self.check_keyset(cell, entry, *limit)?;
                }
                let stored = self.encode(value, *ttl)?;
                self.view(cell).map.pending.insert(entry.clone(), true);
                self.batch
                    .put_cf(self.family, cell.map_entry(entry), stored);
            }
            StateOp::DeleteMapEntry { entry } => {
                self.view(cell).map.pending.insert(entry.clone(), false);
                self.batch.delete_cf(self.family, cell.map_entry(entry));
            }
            StateOp::ClearMap => {
                let map = &mut self.view(cell).map;
                map.cleared = true;
                map.pending.clear();
                self.delete_prefix(&cell.map())?;
            }
            StateOp::SetDequeBounds {
                bounds,
                ttl,
                capacity,
            } => self.set_bounds(cell, *bounds, *ttl, *capacity)?,
            StateOp::PutDequeItem {
                position,
                item,
                ttl,
            } => {
                let inside = self
                    .deque(cell)?
                    .bounds
                    .is_some_and(|bounds| bounds.contains(*position));
                if !inside {
                    return Err(StorageError::invalid_request(
                        OPERATION,
                        format!("deque item at {position} is outside the deque's bounds"),
                    ));
                }
                let stored = self.encode(item, *ttl)?;
                self.batch.put_cf(self.family, cell.item(*position), stored);
            }
            StateOp::ClearDeque => {
                self.batch.delete_cf(self.family, cell.bounds());
                self.delete_prefix(&cell.items())?;
                self.view(cell).deque = Some(DequeView {
                    bounds: None,
                    no_items: true,
                });
            }
        }
        Ok(())
    }

    fn encode(&self, value: &Value, ttl: Option<Ttl>) -> Result<Vec<u8>, StorageError> {
        encode_json(OPERATION, ttl::expiry(ttl, self.now), value)
    }

    fn view(&mut self, cell: &Cell) -> &mut View {
        self.views.entry(cell.as_bytes().to_vec()).or_default()
    }

    /// Rejects a new entry that would take the map past `limit` live entries.
    fn check_keyset(
        &mut self,
        cell: &Cell,
        entry: &str,
        limit: NonZeroU16,
    ) -> Result<(), StorageError> {
        if self.view(cell).map.stored.is_none() && !self.view(cell).map.cleared {
            let stored = self.stored_live_entries(cell)?;
            self.view(cell).map.stored = Some(stored);
        }
        let map = &self.view(cell).map;
        let stored = map.stored.as_ref().filter(|_| !map.cleared);
        let present = match map.pending.get(entry) {
            Some(&live) => live,
            None => stored.is_some_and(|stored| stored.contains(entry)),
        };
        if present {
            return Ok(());
        }
        let pending_live = map.pending.values().filter(|&&live| live).count();
        let stored_live = stored.map_or(0, |stored| {
            stored
                .iter()
                .filter(|name| !map.pending.contains_key(*name))
                .count()
        });
        if pending_live + stored_live >= usize::from(limit.get()) {
            return Err(StorageError::limit_exceeded(
                OPERATION,
                format!(
                    "map already holds its keyset limit of {limit} entries; cannot add `{entry}`"
                ),
            ));
        }
        Ok(())
    }

    /// The live entry names stored for the cell's map.
    fn stored_live_entries(&self, cell: &Cell) -> Result<BTreeSet<String>, StorageError> {
        let map = cell.map();
        let mut iterator = self
            .inner
            .db
            .raw_iterator_cf_opt(self.family, prefix(map.as_bytes()));
        iterator.seek_to_first();
        let mut live = BTreeSet::new();
        while let Some((key, value)) = iterator.item() {
            if is_live(OPERATION, value, self.now_millis)? {
                let name = KeyReader::after(key, map.as_bytes())
                    .and_then(|mut reader| reader.str())
                    .map_err(|error| corrupt(OPERATION, error))?;
                live.insert(name);
            }
            iterator.next();
        }
        finished(OPERATION, &iterator)?;
        Ok(live)
    }

    /// The cell's deque view, loading the stored bounds on first use.
    fn deque(&mut self, cell: &Cell) -> Result<&mut DequeView, StorageError> {
        if self.view(cell).deque.is_none() {
            let stored = self
                .inner
                .db
                .get_pinned_cf(self.family, cell.bounds())
                .map_err(|error| backend(OPERATION, error))?;
            let bounds = match stored {
                Some(stored) => decode_bounds(OPERATION, &stored, self.now_millis)?,
                None => None,
            };
            self.view(cell).deque = Some(DequeView {
                bounds,
                no_items: false,
            });
        }
        let view = self.view(cell);
        Ok(view.deque.get_or_insert(DequeView {
            bounds: None,
            no_items: false,
        }))
    }

    fn set_bounds(
        &mut self,
        cell: &Cell,
        mut bounds: DequeBounds,
        ttl: Option<Ttl>,
        capacity: Option<NonZeroU32>,
    ) -> Result<(), StorageError> {
        if bounds.head > bounds.tail {
            return Err(StorageError::invalid_request(
                OPERATION,
                format!("inverted deque bounds {}..{}", bounds.head, bounds.tail),
            ));
        }
        if let Some(capacity) = capacity
            && bounds.len() > u64::from(capacity.get())
        {
            bounds.head = bounds.tail.saturating_sub(i64::from(capacity.get()));
        }
        let current = self.deque(cell)?;
        let (old, no_items) = (current.bounds, current.no_items);
        current.bounds = Some(bounds);
        match old {
            // Items exist only inside the old bounds: delete those outside the new ones.
            Some(old) => {
                self.delete_positions(cell, old.head, bounds.head.min(old.tail));
                self.delete_positions(cell, bounds.tail.max(old.head), old.tail);
            }
            // No live deque: any stored item belonged to one that expired and must not come
            // back under the new bounds.
            None if !no_items && self.any_item(cell)? => self.delete_prefix(&cell.items())?,
            None => {}
        }
        let stored = encode_bounds(ttl::expiry(ttl, self.now), bounds);
        self.batch.put_cf(self.family, cell.bounds(), stored);
        Ok(())
    }

    /// Deletes the items at `from..to` (nothing when empty).
    fn delete_positions(&mut self, cell: &Cell, from: i64, to: i64) {
        let count = i128::from(to) - i128::from(from);
        if count <= 0 {
            return;
        }
        if count <= POINT_DELETE_MAX {
            for position in from..to {
                self.batch.delete_cf(self.family, cell.item(position));
            }
        } else {
            self.batch
                .delete_range_cf(self.family, cell.item(from), cell.item(to));
        }
    }

    /// Deletes every key under `prefix` with one range tombstone.
    fn delete_prefix(&mut self, keys: &crate::keys::KeyBuf) -> Result<(), StorageError> {
        let end = prefix_end(keys.as_bytes())
            .ok_or_else(|| corrupt(OPERATION, "a state prefix without an end key"))?;
        self.batch
            .delete_range_cf(self.family, keys.as_bytes(), end.as_slice());
        Ok(())
    }

    /// True when any item of the cell's deque is stored.
    fn any_item(&self, cell: &Cell) -> Result<bool, StorageError> {
        let items = cell.items();
        let mut iterator = self
            .inner
            .db
            .raw_iterator_cf_opt(self.family, prefix(items.as_bytes()));
        iterator.seek_to_first();
        let found = iterator.valid();
        finished(OPERATION, &iterator)?;
        Ok(found)
    }
}
