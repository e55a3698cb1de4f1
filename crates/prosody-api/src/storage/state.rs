//! Keyed state: value, map and deque collections per (collection, key).
//!
//! # Data model
//!
//! A *cell* is the data of one collection for one Kafka key: (`StateScope`, `Key`). A
//! collection has one kind, but the store does not know it: value, map and deque data of the
//! same cell live side by side, and it is the runtime's registry that rejects a collection name
//! reused with another kind. Every stored JSON value, `null` included, is *present*; absence is
//! `None`. (The runtime refuses to store `null` from a handler; the store does not care.)
//!
//! - **value**: one JSON value.
//! - **map**: entries keyed by string, ordered by the keys' UTF-8 bytes (Rust `str` order, which
//!   is also what Cassandra and `RocksDB` use). Each entry has its own TTL.
//! - **deque**: [`DequeBounds`] `head..tail` plus items at integer positions inside them. Front
//!   is `head`, back is `tail - 1`. Positions may be negative (unshift moves `head` down).
//!   Bounds and each item have their own TTL; an expired item inside live bounds reads as
//!   absent, and when the bounds expire the whole deque is absent.
//!
//! # Writes: one atomic batch of absolute operations
//!
//! A handler's writes are staged by the runtime and reach the store as one [`StateStore::apply`]
//! call, so they commit all or nothing. Each [`StateOp`] states the resulting data
//! (put/delete/clear, a deque item at an explicit position, explicit deque bounds) instead of a
//! relative change (push, pop, increment): applying the same batch twice therefore leaves the
//! same state as applying it once. That is what lets the runtime retry an `apply` whose outcome
//! it does not know, and what `readUncommitted` collections require. The runtime computes
//! positions from its read-your-writes view of the cell, which is exact because the pipeline
//! runs one event per key at a time.
//!
//! Bounds that the spec makes part of a collection's definition travel with the write, since a
//! store has no registry: a map put carries its `keyset_limit`, and deque bounds carry the
//! deque's `capacity`. The store enforces them, so a bound holds whatever path wrote the data.
//!
//! # TTL
//!
//! Every put carries an optional [`Ttl`]; it applies to what that op wrote (the value, the map
//! entry, the deque item or the deque bounds) and restarts on every rewrite. `None` never
//! expires. Expiry is judged on the store's [`crate::Clock`].
//!
//! # Scans
//!
//! Map and deque scans are cursor-based chunks ([`ScanRequest`]): start strictly after a cursor
//! (or at the end the direction starts from), return at most `limit` live entries in the
//! requested direction. A caller pages by passing the last returned cursor back. Chunks are
//! independent reads: a write between two chunks may or may not be seen by the later one, but
//! no entry is returned twice and order is never violated.

use std::fmt::Debug;
use std::num::{NonZeroU16, NonZeroU32};

use async_trait::async_trait;
use serde_json::Value;

use super::Ttl;
use crate::error::StorageError;
use crate::key::{CollectionName, ConsumerGroup, Key, Subsystem};

/// Who owns a collection's data: a consumer group, or — for a collection published for
/// readers outside the group — the subsystem it is published under. Keeping the owner in the
/// scope isolates groups by construction and lets [`super::PublishedStateView`] find published
/// data by subsystem without knowing which group wrote it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateNamespace {
    /// State owned by a consumer group.
    Group(ConsumerGroup),
    /// State published under a subsystem.
    Subsystem(Subsystem),
}

/// One collection of one owner.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateScope {
    /// The owner.
    pub namespace: StateNamespace,
    /// The collection's durable name.
    pub collection: CollectionName,
}

impl StateScope {
    /// A collection owned by a consumer group.
    pub fn group(group: impl Into<ConsumerGroup>, collection: impl Into<CollectionName>) -> Self {
        Self {
            namespace: StateNamespace::Group(group.into()),
            collection: collection.into(),
        }
    }

    /// A collection published under a subsystem.
    pub fn subsystem(
        subsystem: impl Into<Subsystem>,
        collection: impl Into<CollectionName>,
    ) -> Self {
        Self {
            namespace: StateNamespace::Subsystem(subsystem.into()),
            collection: collection.into(),
        }
    }
}

/// The occupied positions of a deque: `head..tail`, so its length is `tail - head`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DequeBounds {
    /// Position of the front item.
    pub head: i64,
    /// One past the position of the back item.
    pub tail: i64,
}

impl DequeBounds {
    /// Bounds from their ends.
    #[must_use]
    pub const fn new(head: i64, tail: i64) -> Self {
        Self { head, tail }
    }

    /// `tail - head`; zero for inverted bounds.
    #[must_use]
    pub fn len(self) -> u64 {
        u64::try_from(i128::from(self.tail) - i128::from(self.head)).unwrap_or(0)
    }

    /// True when no position is occupied.
    #[must_use]
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// True when `position` is inside the bounds.
    #[must_use]
    pub fn contains(self, position: i64) -> bool {
        (self.head..self.tail).contains(&position)
    }
}

/// One staged write to a cell. See the module docs for why every op is absolute.
#[derive(Clone, Debug, PartialEq)]
pub enum StateOp {
    /// Sets the value.
    PutValue {
        /// The new value.
        value: Value,
        /// Its TTL.
        ttl: Option<Ttl>,
    },
    /// Removes the value; a no-op when absent.
    DeleteValue,
    /// Sets one map entry. When `keyset_limit` is set and the entry is new, the map may hold at
    /// most that many live entries after the put, or the whole batch fails with
    /// [`crate::StorageErrorKind::LimitExceeded`] and nothing of it is applied. Overwriting an
    /// existing entry never fails on the limit.
    PutMapEntry {
        /// The entry key.
        entry: String,
        /// The entry value.
        value: Value,
        /// Its TTL.
        ttl: Option<Ttl>,
        /// The map's keyset limit (`None`: unbounded, the spec's `keysetLimit: 0`).
        keyset_limit: Option<NonZeroU16>,
    },
    /// Removes one map entry; a no-op when absent.
    DeleteMapEntry {
        /// The entry key.
        entry: String,
    },
    /// Removes every entry of the map.
    ClearMap,
    /// Sets the bounds of the deque and removes every item outside them, so a pop or shift is
    /// just new bounds. With `capacity`, bounds longer than it are first shortened from the
    /// front (`head = tail - capacity`): that is the spec's "overflow on push drops the oldest",
    /// which the runtime requests only on push (the spec enforces capacity lazily on push). An
    /// inverted range (`head > tail`) is an `InvalidRequest` error.
    SetDequeBounds {
        /// The new bounds.
        bounds: DequeBounds,
        /// TTL of the bounds record.
        ttl: Option<Ttl>,
        /// The deque's capacity, to evict beyond.
        capacity: Option<NonZeroU32>,
    },
    /// Sets the item at `position`, which must be inside the current bounds (set them first),
    /// otherwise the batch fails with `InvalidRequest`.
    PutDequeItem {
        /// The position.
        position: i64,
        /// The item.
        item: Value,
        /// Its TTL.
        ttl: Option<Ttl>,
    },
    /// Removes the bounds and every item.
    ClearDeque,
}

/// A staged write: which cell, and what to do to it.
#[derive(Clone, Debug, PartialEq)]
pub struct StateWrite {
    /// The collection.
    pub scope: StateScope,
    /// The Kafka key.
    pub key: Key,
    /// The operation.
    pub op: StateOp,
}

impl StateWrite {
    /// A write from its parts.
    pub fn new(scope: StateScope, key: impl Into<Key>, op: StateOp) -> Self {
        Self {
            scope,
            key: key.into(),
            op,
        }
    }
}

/// The direction of an ordered scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ScanDirection {
    /// Ascending keys or positions (front to back).
    #[default]
    Forward,
    /// Descending keys or positions (back to front).
    Backward,
}

/// One chunk of an ordered scan: up to `limit` live entries strictly after `after` in
/// `direction` (ascending for forward, descending for backward), or from the start of that
/// direction when `after` is `None`. `after` need not be a present entry.
///
/// A returned chunk never exceeds `limit` and is empty only when the scan is exhausted; a
/// shorter non-empty chunk does not by itself mean the end (a backend filtering expired entries
/// may return fewer), so callers page until they get an empty chunk or have what they need.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScanRequest<C> {
    /// Scan direction.
    pub direction: ScanDirection,
    /// Exclusive cursor.
    pub after: Option<C>,
    /// Maximum entries to return.
    pub limit: NonZeroU32,
}

impl<C> ScanRequest<C> {
    /// The first chunk of a scan.
    #[must_use]
    pub const fn first(direction: ScanDirection, limit: NonZeroU32) -> Self {
        Self {
            direction,
            after: None,
            limit,
        }
    }

    /// The chunk after `cursor`.
    #[must_use]
    pub fn after(direction: ScanDirection, cursor: C, limit: NonZeroU32) -> Self {
        Self {
            direction,
            after: Some(cursor),
            limit,
        }
    }
}

/// Keyed-state storage: reads, ordered chunked scans, and one atomic apply of staged writes.
///
/// Reads return committed data only (the runtime layers a handler's pending writes on top).
/// A read concurrent with an [`StateStore::apply`] sees, per cell, either none or all of that
/// batch's writes to the cell; across cells a concurrent reader (a published-state reader) may
/// see one cell updated before another. After `apply` returns `Ok`, every later read sees the
/// whole batch.
#[async_trait]
pub trait StateStore: Send + Sync + Debug {
    /// The live value, or `None`.
    async fn get_value(&self, scope: &StateScope, key: &Key)
    -> Result<Option<Value>, StorageError>;

    /// The live values of the given map entries, in the order asked (duplicates allowed).
    async fn get_map_entries(
        &self,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError>;

    /// One chunk of the map's live entries in key order (see [`ScanRequest`]).
    async fn scan_map(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError>;

    /// The deque's live bounds, or `None` when it was never written, was cleared or expired.
    async fn get_deque_bounds(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError>;

    /// The live items at the given positions, in the order asked; positions outside the bounds
    /// read as `None`.
    async fn get_deque_items(
        &self,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError>;

    /// One chunk of the deque's live items in position order, within its bounds.
    async fn scan_deque(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError>;

    /// Applies the writes in order, atomically: on `Ok` all of them are applied; on an error of
    /// kind `LimitExceeded` or `InvalidRequest` none is. On a `Backend` error the outcome is
    /// unknown, and re-applying the same batch converges to the state of one application (every
    /// op is absolute, see the module docs). An empty batch is a no-op.
    async fn apply(&self, writes: &[StateWrite]) -> Result<(), StorageError>;
}
