//! The keyspace: how every stored key is laid out, in one place.
//!
//! Components are encoded with [`encoding`] so byte order is component order. `P` below is a
//! partition scope, `group | topic | partition`, which comes first in every partition-scoped
//! key so partitions, topics and groups never share a range.
//!
//! | family | key | value |
//! |---|---|---|
//! | `timers_by_key` | `P \| key \| kind \| time` | empty |
//! | `timers_by_time` | `P \| time \| key \| kind` | empty |
//! | `defer` | `P \| key \| 0 \| offset` / `P \| key \| 1 \| time` | retry count |
//! | `dedup` | `P \| key \| id \| version` | expiry |
//! | `state` | `C \| 0` (value), `C \| 1 \| entry` (map), `C \| 2` (deque bounds), `C \| 3 \| position` (deque item) | expiry + payload |
//!
//! where `C`, a state cell, is `namespace kind | namespace name | collection | key`.
//!
//! Why these shapes: `timers_by_key` answers `scheduled`/`clear` with one prefix scan;
//! `timers_by_time` orders a partition's timers by (time, key, kind), which is
//! [`prosody_api::storage::StoredTimer`] order, and since a slab is a time interval, a slab is
//! a range of it and the list of non-empty slabs is found by seeking from slab to slab, with no
//! separate slab index to keep in step. State tags put a cell's value, map, bounds and items in
//! disjoint adjacent ranges, and the map's entry keys and the deque's positions sort as the
//! trait requires, so scans in both directions are bounded range scans.

pub mod encoding;

use prosody_api::storage::{DedupRecord, PartitionScope, StateNamespace, StateScope};
use prosody_api::{Key, Offset, TimerKind, TimerTime};

pub use encoding::{DecodeError, KeyBuf, KeyReader, prefix_end};

/// Tags under a key in the `defer` family.
const DEFER_MESSAGE: u8 = 0;
const DEFER_TIMER: u8 = 1;

/// Tags under a cell in the `state` family.
const STATE_VALUE: u8 = 0;
const STATE_MAP: u8 = 1;
const STATE_BOUNDS: u8 = 2;
const STATE_ITEM: u8 = 3;

/// Namespace kinds in a state cell.
const NAMESPACE_GROUP: u8 = 0;
const NAMESPACE_SUBSYSTEM: u8 = 1;

/// `group | topic | partition`.
fn partition(scope: &PartitionScope) -> KeyBuf {
    KeyBuf::with_capacity(scope.group.as_str().len() + scope.topic.as_str().len() + 40)
        .str(scope.group.as_str())
        .str(scope.topic.as_str())
        .i32(scope.partition.0)
}

/// Keys of the two timer indexes.
pub mod timer {
    use super::{Key, KeyBuf, PartitionScope, TimerKind, TimerTime, partition};

    /// Prefix of one key's timers of one kind in `timers_by_key`.
    pub fn by_key_prefix(scope: &PartitionScope, key: &Key, kind: TimerKind) -> KeyBuf {
        partition(scope).str(key.as_str()).tag(kind.code())
    }

    /// A timer in `timers_by_key`.
    pub fn by_key(scope: &PartitionScope, key: &Key, kind: TimerKind, time: TimerTime) -> KeyBuf {
        by_key_prefix(scope, key, kind).u64(time.as_secs())
    }

    /// Prefix of a partition's timers in `timers_by_time`.
    pub fn by_time_prefix(scope: &PartitionScope) -> KeyBuf {
        partition(scope)
    }

    /// The first possible key of `time` (inclusive lower bound of a time range).
    pub fn by_time_from(scope: &PartitionScope, time: u64) -> KeyBuf {
        partition(scope).u64(time)
    }

    /// A timer in `timers_by_time`.
    pub fn by_time(scope: &PartitionScope, key: &Key, kind: TimerKind, time: TimerTime) -> KeyBuf {
        partition(scope)
            .u64(time.as_secs())
            .str(key.as_str())
            .tag(kind.code())
    }
}

/// Keys of the `defer` family.
pub mod defer {
    use super::partition;
    use super::{DEFER_MESSAGE, DEFER_TIMER, Key, KeyBuf, Offset, PartitionScope, TimerTime};

    /// Prefix of every deferred entry of a partition.
    pub fn partition_prefix(scope: &PartitionScope) -> KeyBuf {
        partition(scope)
    }

    /// Prefix of every deferred entry (messages and timers) of one key.
    pub fn key_prefix(scope: &PartitionScope, key: &str) -> KeyBuf {
        partition(scope).str(key)
    }

    /// Prefix of a key's deferred messages.
    pub fn messages(scope: &PartitionScope, key: &Key) -> KeyBuf {
        key_prefix(scope, key.as_str()).tag(DEFER_MESSAGE)
    }

    /// One deferred message.
    pub fn message(scope: &PartitionScope, key: &Key, offset: Offset) -> KeyBuf {
        messages(scope, key).i64(offset.0)
    }

    /// Prefix of a key's deferred timers.
    pub fn timers(scope: &PartitionScope, key: &Key) -> KeyBuf {
        key_prefix(scope, key.as_str()).tag(DEFER_TIMER)
    }

    /// One deferred timer.
    pub fn timer(scope: &PartitionScope, key: &Key, time: TimerTime) -> KeyBuf {
        timers(scope, key).u64(time.as_secs())
    }
}

/// The key of a dedup record.
pub fn dedup(scope: &PartitionScope, record: &DedupRecord<'_>) -> KeyBuf {
    partition(scope)
        .str(record.key().as_str())
        .str(record.id())
        .str(record.version())
}

/// Keys of one state cell: (collection scope, Kafka key).
#[derive(Clone, Debug)]
pub struct Cell(KeyBuf);

impl Cell {
    /// The cell of `key` in `scope`.
    pub fn new(scope: &StateScope, key: &Key) -> Self {
        let (kind, name) = match &scope.namespace {
            StateNamespace::Group(group) => (NAMESPACE_GROUP, group.as_str()),
            StateNamespace::Subsystem(subsystem) => (NAMESPACE_SUBSYSTEM, subsystem.as_str()),
        };
        Self(
            KeyBuf::with_capacity(name.len() + scope.collection.as_str().len() + 32)
                .tag(kind)
                .str(name)
                .str(scope.collection.as_str())
                .str(key.as_str()),
        )
    }

    /// The cell prefix itself (identifies the cell, e.g. for locking).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The value.
    pub fn value(&self) -> KeyBuf {
        self.0.clone().tag(STATE_VALUE)
    }

    /// Prefix of the map's entries.
    pub fn map(&self) -> KeyBuf {
        self.0.clone().tag(STATE_MAP)
    }

    /// One map entry.
    pub fn map_entry(&self, entry: &str) -> KeyBuf {
        self.map().str(entry)
    }

    /// The deque's bounds.
    pub fn bounds(&self) -> KeyBuf {
        self.0.clone().tag(STATE_BOUNDS)
    }

    /// Prefix of the deque's items.
    pub fn items(&self) -> KeyBuf {
        self.0.clone().tag(STATE_ITEM)
    }

    /// One deque item.
    pub fn item(&self, position: i64) -> KeyBuf {
        self.items().i64(position)
    }
}

#[cfg(test)]
mod tests {
    use prosody_api::Partition;

    use super::*;

    #[test]
    fn timers_by_time_sort_by_time_then_key_then_kind() {
        let scope = PartitionScope::new("g", "t", Partition(0));
        let at = |secs, key: &str, kind| {
            timer::by_time(&scope, &Key::from(key), kind, TimerTime::from_secs(secs)).into_bytes()
        };
        let app = TimerKind::Application;
        let retry = TimerKind::DeferRetry;
        assert!(at(1, "b", retry) < at(2, "a", app));
        assert!(at(2, "a", retry) < at(2, "b", app));
        assert!(at(2, "a", app) < at(2, "a", retry));
    }

    #[test]
    fn cell_ranges_are_disjoint_for_names_that_extend_each_other() {
        let cell = Cell::new(&StateScope::group("g", "collectio"), &Key::from("k"));
        let longer = Cell::new(&StateScope::group("g", "collection"), &Key::from("k"));
        assert!(!longer.as_bytes().starts_with(cell.as_bytes()));
        let published = Cell::new(&StateScope::subsystem("g", "collectio"), &Key::from("k"));
        assert!(!published.as_bytes().starts_with(cell.as_bytes()));
    }

    #[test]
    fn negative_deque_positions_sort_first() {
        let cell = Cell::new(&StateScope::group("g", "c"), &Key::from("k"));
        assert!(cell.item(-1).into_bytes() < cell.item(0).into_bytes());
        assert!(cell.item(i64::MIN).into_bytes() < cell.item(i64::MAX).into_bytes());
    }
}
