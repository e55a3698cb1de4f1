//! The pending writes of one attempt, per collection, and how they become store writes.
//!
//! Each collection the attempt touched has a stage: what the handler wrote, layered over the
//! store so reads see the attempt's own writes. A stage turns into absolute [`StateOp`]s
//! ([`Stage::ops`]) when it is flushed: all stages at once when the attempt succeeds (one
//! atomic `apply`), one stage on `commit()` or after each write of a `readUncommitted`
//! collection. Dropping a stage is `rollback()`; dropping all of them is a failed attempt.

use std::collections::BTreeMap;

use prosody_api::storage::{DequeBounds, StateOp};
use serde_json::Value;

use super::definition::Collection;

/// One collection's pending writes.
#[derive(Debug)]
#[allow(
    clippy::option_option,
    reason = "three states: untouched (ask the store), cleared, set"
)]
pub enum Stage {
    /// A value: `None` untouched, `Some(None)` cleared, `Some(Some(v))` set.
    Value(Option<Option<Value>>),
    /// A map.
    Map(MapStage),
    /// A deque.
    Deque(DequeStage),
}

/// A map's pending writes.
#[derive(Debug, Default)]
pub struct MapStage {
    /// The stored entries are gone (a `clear()`); only `entries` remain.
    pub cleared: bool,
    /// Entries written by the attempt: `Some` put, `None` deleted.
    pub entries: BTreeMap<String, Option<Value>>,
}

impl MapStage {
    /// The entry as the attempt sees it: `Some(answer)` when the stage decides it, `None` when
    /// the store must be asked.
    #[allow(
        clippy::option_option,
        reason = "three answers: ask the store, absent, present"
    )]
    pub fn lookup(&self, entry: &str) -> Option<Option<Value>> {
        match self.entries.get(entry) {
            Some(staged) => Some(staged.clone()),
            None if self.cleared => Some(None),
            None => None,
        }
    }
}

/// A deque's pending writes. Bounds are read from the store once, on first use, and then
/// tracked here; positions the attempt wrote are in `items`.
#[derive(Debug, Default)]
pub struct DequeStage {
    /// The bounds were read (or set by a clear).
    pub loaded: bool,
    /// The bounds as the attempt sees them (`None`: no deque).
    pub bounds: Option<DequeBounds>,
    /// The stored items are gone (a `clear()`).
    pub cleared: bool,
    /// Items written by the attempt, by position.
    pub items: BTreeMap<i64, Value>,
    /// Something changed.
    pub dirty: bool,
}

impl DequeStage {
    /// The item at `position` as the attempt sees it: `Some(answer)` when the stage decides
    /// it, `None` when the store must be asked.
    #[allow(
        clippy::option_option,
        reason = "three answers: ask the store, absent, present"
    )]
    pub fn lookup(&self, position: i64) -> Option<Option<Value>> {
        if !self.bounds.is_some_and(|bounds| bounds.contains(position)) {
            return Some(None);
        }
        match self.items.get(&position) {
            Some(item) => Some(Some(item.clone())),
            None if self.cleared => Some(None),
            None => None,
        }
    }

    /// Forgets staged items outside the bounds (popped, shifted or evicted).
    pub fn trim(&mut self) {
        match self.bounds {
            Some(bounds) => self.items.retain(|&position, _| bounds.contains(position)),
            None => self.items.clear(),
        }
    }
}

impl Stage {
    /// An untouched stage of a collection's kind.
    pub fn empty(collection: &Collection) -> Self {
        use super::definition::CollectionKind;
        match collection.identity.kind {
            CollectionKind::Value => Self::Value(None),
            CollectionKind::Map => Self::Map(MapStage::default()),
            CollectionKind::Deque => Self::Deque(DequeStage::default()),
        }
    }

    /// A stage that clears the collection (what excise stages for every collection).
    pub fn cleared(collection: &Collection) -> Self {
        use super::definition::CollectionKind;
        match collection.identity.kind {
            CollectionKind::Value => Self::Value(Some(None)),
            CollectionKind::Map => Self::Map(MapStage {
                cleared: true,
                entries: BTreeMap::new(),
            }),
            CollectionKind::Deque => Self::Deque(DequeStage {
                loaded: true,
                bounds: None,
                cleared: true,
                items: BTreeMap::new(),
                dirty: true,
            }),
        }
    }

    /// The store ops that make the stored cell what the attempt sees, in apply order.
    pub fn ops(&self, collection: &Collection) -> Vec<StateOp> {
        let ttl = collection.ttl;
        match self {
            Self::Value(None) => Vec::new(),
            Self::Value(Some(None)) => vec![StateOp::DeleteValue],
            Self::Value(Some(Some(value))) => vec![StateOp::PutValue {
                value: value.clone(),
                ttl,
            }],
            Self::Map(map) => {
                let mut ops = Vec::with_capacity(map.entries.len() + 1);
                if map.cleared {
                    ops.push(StateOp::ClearMap);
                }
                // Deletes first: a map at its keyset limit that swaps one entry for another
                // must not hit the limit in between.
                for (entry, value) in &map.entries {
                    if value.is_none() {
                        ops.push(StateOp::DeleteMapEntry {
                            entry: entry.clone(),
                        });
                    }
                }
                for (entry, value) in &map.entries {
                    if let Some(value) = value {
                        ops.push(StateOp::PutMapEntry {
                            entry: entry.clone(),
                            value: value.clone(),
                            ttl,
                            keyset_limit: collection.keyset_limit,
                        });
                    }
                }
                ops
            }
            Self::Deque(deque) if !deque.dirty => Vec::new(),
            Self::Deque(deque) => {
                let mut ops = Vec::with_capacity(deque.items.len() + 2);
                if deque.cleared {
                    ops.push(StateOp::ClearDeque);
                }
                match deque.bounds {
                    Some(bounds) => {
                        ops.push(StateOp::SetDequeBounds {
                            bounds,
                            ttl,
                            capacity: collection.capacity,
                        });
                        ops.extend(deque.items.iter().map(|(&position, item)| {
                            StateOp::PutDequeItem {
                                position,
                                item: item.clone(),
                                ttl,
                            }
                        }));
                    }
                    None if !deque.cleared => ops.push(StateOp::ClearDeque),
                    None => {}
                }
                ops
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::state::definition::CollectionDefinition;

    #[test]
    fn map_ops_clear_then_delete_then_put() {
        let collection = CollectionDefinition::map("m")
            .validate(Duration::from_secs(1))
            .unwrap();
        let mut map = MapStage {
            cleared: true,
            ..MapStage::default()
        };
        map.entries.insert("a".into(), Some(json!(1)));
        map.entries.insert("b".into(), None);
        let ops = Stage::Map(map).ops(&collection);
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0], StateOp::ClearMap);
        assert_eq!(ops[1], StateOp::DeleteMapEntry { entry: "b".into() });
        assert!(matches!(&ops[2], StateOp::PutMapEntry { entry, .. } if entry == "a"));
    }

    #[test]
    fn deque_lookup_hides_positions_outside_the_bounds_and_after_a_clear() {
        let mut deque = DequeStage {
            loaded: true,
            bounds: Some(DequeBounds::new(0, 3)),
            cleared: false,
            ..DequeStage::default()
        };
        deque.items.insert(2, json!("x"));
        assert_eq!(deque.lookup(2), Some(Some(json!("x"))));
        assert_eq!(deque.lookup(1), None, "the store decides");
        assert_eq!(deque.lookup(3), Some(None));
        deque.cleared = true;
        assert_eq!(deque.lookup(1), Some(None));
        assert!(
            Stage::Deque(DequeStage::default())
                .ops(
                    &CollectionDefinition::deque("d")
                        .validate(Duration::from_secs(1))
                        .unwrap()
                )
                .is_empty()
        );
    }
}
