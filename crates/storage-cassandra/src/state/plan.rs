//! Planning an apply: from a cell's ops and what is stored, the writes that produce the
//! batch's end state, or the error that rejects the whole batch.
//!
//! Planning is pure (no I/O), so the all-or-nothing rules — keyset limits, deque bounds,
//! capacity eviction — are checked completely before anything is written, and are unit-tested
//! here without a database.
//!
//! The plan writes only the *end state* of each cell, never the intermediate steps, because
//! every statement of one Cassandra batch gets the same write timestamp and a tombstone wins a
//! tie: deleting a row and writing it in the same batch would lose the write. So a plan never
//! deletes what it writes. Clearing a map or a deque becomes range deletions *around* the
//! entries the batch writes afterwards, and narrowing deque bounds deletes only the ranges
//! outside every bounds the batch set.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU16;

use prosody_api::StorageError;
use prosody_api::storage::{DequeBounds, StateOp, Ttl};
use serde::{Deserialize, Serialize};

use crate::ttl::TtlPolicy;

pub(crate) const APPLY: &str = "state.apply";

/// One write to one cell, in the terms of the `keyed_state` table. Serializable because the
/// staged-commit path stores effects before applying them (see `super::write`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Effect {
    /// Sets the value (static columns).
    PutValue {
        json: String,
        expires_at: Option<i64>,
        ttl: i32,
    },
    /// Removes the value.
    DeleteValue,
    /// Sets one map entry.
    PutEntry {
        entry: String,
        json: String,
        expires_at: Option<i64>,
        ttl: i32,
    },
    /// Removes one map entry.
    DeleteEntry { entry: String },
    /// Removes the map entries strictly between `after` and `before` (`None`: unbounded).
    DeleteEntries {
        after: Option<String>,
        before: Option<String>,
    },
    /// Sets the deque bounds (static columns).
    SetBounds {
        head: i64,
        tail: i64,
        expires_at: Option<i64>,
        ttl: i32,
    },
    /// Removes the deque bounds.
    DeleteBounds,
    /// Sets one deque item.
    PutItem {
        position: i64,
        json: String,
        expires_at: Option<i64>,
        ttl: i32,
    },
    /// Removes the deque items at positions `from ..= to`.
    DeleteItems { from: i64, to: i64 },
}

impl Effect {
    /// Roughly the bytes this effect adds to a batch, to decide whether a logged batch fits
    /// under Cassandra's batch size limit.
    pub(crate) fn weight(&self) -> usize {
        const OVERHEAD: usize = 64;
        OVERHEAD
            + match self {
                Self::PutValue { json, .. } | Self::PutItem { json, .. } => json.len(),
                Self::PutEntry { entry, json, .. } => entry.len() + json.len(),
                Self::DeleteEntry { entry } => entry.len(),
                Self::DeleteEntries { after, before } => {
                    after.as_ref().map_or(0, String::len) + before.as_ref().map_or(0, String::len)
                }
                Self::DeleteValue
                | Self::SetBounds { .. }
                | Self::DeleteBounds
                | Self::DeleteItems { .. } => 0,
            }
    }
}

/// What the plan needs to know about a cell before its ops: only what the ops can depend on.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stored {
    /// The live deque bounds (`None`: absent or expired).
    pub(crate) bounds: Option<DequeBounds>,
    /// The live map entries, when the ops include a put under a keyset limit.
    pub(crate) live_entries: Option<BTreeSet<String>>,
}

/// What the plan must read before planning `ops`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    pub(crate) bounds: bool,
    pub(crate) live_entries: bool,
}

pub(crate) fn needs<'a>(ops: impl IntoIterator<Item = &'a StateOp>) -> Needs {
    let mut needs = Needs::default();
    for op in ops {
        match op {
            StateOp::SetDequeBounds { .. } | StateOp::PutDequeItem { .. } => needs.bounds = true,
            StateOp::PutMapEntry {
                keyset_limit: Some(_),
                ..
            } => needs.live_entries = true,
            _ => {}
        }
    }
    needs
}

enum ValueChange {
    Put(String, Option<Ttl>),
    Delete,
}

enum BoundsChange {
    Set(DequeBounds, Option<Ttl>),
    Clear,
}

/// The running end state of one cell while its ops are planned.
struct Planner<'a> {
    collection: &'a str,
    value: Option<ValueChange>,
    map_cleared: bool,
    map_puts: BTreeMap<String, (String, Option<Ttl>)>,
    map_deletes: BTreeSet<String>,
    /// Live entries after the ops so far; tracked only when a keyset limit needs it.
    live_entries: Option<BTreeSet<String>>,
    bounds: Option<DequeBounds>,
    bounds_change: Option<BoundsChange>,
    /// Every stored item is dropped (a clear, or bounds set over an expired deque).
    items_all_dropped: bool,
    /// Stored items outside this range are dropped (the intersection of the bounds set).
    items_keep: Option<(i64, i64)>,
    item_puts: BTreeMap<i64, (String, Option<Ttl>)>,
}

fn encode(value: &serde_json::Value) -> Result<String, StorageError> {
    serde_json::to_string(value).map_err(|error| {
        StorageError::invalid_request(APPLY, format!("value does not encode as JSON: {error}"))
            .with_source(error)
    })
}

impl<'a> Planner<'a> {
    fn new(collection: &'a str, stored: Stored) -> Self {
        Self {
            collection,
            value: None,
            map_cleared: false,
            map_puts: BTreeMap::new(),
            map_deletes: BTreeSet::new(),
            live_entries: stored.live_entries,
            bounds: stored.bounds,
            bounds_change: None,
            items_all_dropped: false,
            items_keep: None,
            item_puts: BTreeMap::new(),
        }
    }

    fn apply(&mut self, op: &StateOp) -> Result<(), StorageError> {
        match op {
            StateOp::PutValue { value, ttl } => {
                self.value = Some(ValueChange::Put(encode(value)?, *ttl));
            }
            StateOp::DeleteValue => self.value = Some(ValueChange::Delete),
            StateOp::PutMapEntry {
                entry,
                value,
                ttl,
                keyset_limit,
            } => self.put_entry(entry, encode(value)?, *ttl, *keyset_limit)?,
            StateOp::DeleteMapEntry { entry } => {
                self.map_puts.remove(entry);
                self.map_deletes.insert(entry.clone());
                if let Some(live) = &mut self.live_entries {
                    live.remove(entry);
                }
            }
            StateOp::ClearMap => {
                self.map_cleared = true;
                self.map_puts.clear();
                self.map_deletes.clear();
                if let Some(live) = &mut self.live_entries {
                    live.clear();
                }
            }
            StateOp::SetDequeBounds {
                bounds,
                ttl,
                capacity,
            } => {
                if bounds.head > bounds.tail {
                    return Err(StorageError::invalid_request(
                        APPLY,
                        format!(
                            "inverted deque bounds {}..{} for collection `{}`",
                            bounds.head, bounds.tail, self.collection
                        ),
                    ));
                }
                if self.bounds.is_none() {
                    // Items of an absent or expired deque died with it.
                    self.drop_all_items();
                }
                let mut bounds = *bounds;
                if let Some(capacity) = capacity
                    && bounds.len() > u64::from(capacity.get())
                {
                    bounds.head = bounds.tail.saturating_sub(i64::from(capacity.get()));
                }
                self.items_keep = Some(match self.items_keep {
                    None => (bounds.head, bounds.tail),
                    Some((head, tail)) => (head.max(bounds.head), tail.min(bounds.tail)),
                });
                self.item_puts
                    .retain(|position, _| bounds.contains(*position));
                self.bounds = Some(bounds);
                self.bounds_change = Some(BoundsChange::Set(bounds, *ttl));
            }
            StateOp::PutDequeItem {
                position,
                item,
                ttl,
            } => {
                if !self.bounds.is_some_and(|bounds| bounds.contains(*position)) {
                    return Err(StorageError::invalid_request(
                        APPLY,
                        format!(
                            "deque item at {position} is outside the bounds {:?} of collection `{}`",
                            self.bounds, self.collection
                        ),
                    ));
                }
                self.item_puts.insert(*position, (encode(item)?, *ttl));
            }
            StateOp::ClearDeque => {
                self.bounds = None;
                self.bounds_change = Some(BoundsChange::Clear);
                self.drop_all_items();
            }
        }
        Ok(())
    }

    fn drop_all_items(&mut self) {
        self.items_all_dropped = true;
        self.items_keep = None;
        self.item_puts.clear();
    }

    fn put_entry(
        &mut self,
        entry: &str,
        json: String,
        ttl: Option<Ttl>,
        keyset_limit: Option<NonZeroU16>,
    ) -> Result<(), StorageError> {
        if let (Some(limit), Some(live)) = (keyset_limit, &self.live_entries)
            && !live.contains(entry)
            && live.len() >= usize::from(limit.get())
        {
            return Err(StorageError::limit_exceeded(
                APPLY,
                format!(
                    "map of collection `{}` (table `keyed_state`) already holds its keyset limit \
                     of {limit} entries; cannot add `{entry}`",
                    self.collection
                ),
            ));
        }
        if let Some(live) = &mut self.live_entries {
            live.insert(entry.to_owned());
        }
        self.map_deletes.remove(entry);
        self.map_puts.insert(entry.to_owned(), (json, ttl));
        Ok(())
    }

    fn finish(self, ttl: TtlPolicy, now: std::time::SystemTime) -> Vec<Effect> {
        let expires = |logical: Option<Ttl>| crate::ttl::expires_at(logical, now);
        let mut effects = Vec::new();
        match self.value {
            Some(ValueChange::Put(json, logical)) => effects.push(Effect::PutValue {
                json,
                expires_at: expires(logical),
                ttl: ttl.native(logical),
            }),
            Some(ValueChange::Delete) => effects.push(Effect::DeleteValue),
            None => {}
        }
        if self.map_cleared {
            effects.extend(entry_gaps(self.map_puts.keys()));
        } else {
            effects.extend(
                self.map_deletes
                    .into_iter()
                    .map(|entry| Effect::DeleteEntry { entry }),
            );
        }
        effects.extend(
            self.map_puts
                .iter()
                .map(|(entry, (json, logical))| Effect::PutEntry {
                    entry: entry.clone(),
                    json: json.clone(),
                    expires_at: expires(*logical),
                    ttl: ttl.native(*logical),
                }),
        );
        match self.bounds_change {
            Some(BoundsChange::Set(bounds, logical)) => effects.push(Effect::SetBounds {
                head: bounds.head,
                tail: bounds.tail,
                expires_at: expires(logical),
                ttl: ttl.native(logical),
            }),
            Some(BoundsChange::Clear) => effects.push(Effect::DeleteBounds),
            None => {}
        }
        let kept = self.item_puts.keys().copied();
        if self.items_all_dropped {
            effects.extend(carve(&[(i64::MIN, i64::MAX)], kept));
        } else if let Some((head, tail)) = self.items_keep {
            // Stored items outside every bounds the batch set are dropped; items the batch
            // itself wrote there (after widening the bounds again) are kept.
            let mut dropped = Vec::new();
            if head > i64::MIN {
                dropped.push((i64::MIN, head - 1));
            }
            dropped.push((tail.max(head), i64::MAX));
            effects.extend(carve(&dropped, kept));
        }
        effects.extend(
            self.item_puts
                .into_iter()
                .map(|(position, (json, logical))| Effect::PutItem {
                    position,
                    json,
                    expires_at: expires(logical),
                    ttl: ttl.native(logical),
                }),
        );
        effects
    }
}

/// Range deletions covering every map entry except `kept`.
fn entry_gaps<'a>(kept: impl Iterator<Item = &'a String>) -> Vec<Effect> {
    let mut gaps = Vec::new();
    let mut after: Option<String> = None;
    for entry in kept {
        gaps.push(Effect::DeleteEntries {
            after: after.take(),
            before: Some(entry.clone()),
        });
        after = Some(entry.clone());
    }
    gaps.push(Effect::DeleteEntries {
        after,
        before: None,
    });
    gaps
}

/// Range deletions covering the inclusive `ranges` (ascending, disjoint) except the `kept`
/// positions (ascending).
fn carve(ranges: &[(i64, i64)], kept: impl Iterator<Item = i64>) -> Vec<Effect> {
    let kept: Vec<i64> = kept.collect();
    let mut gaps = Vec::new();
    for &(from, to) in ranges {
        let mut start = Some(from);
        for &position in kept
            .iter()
            .filter(|position| (from..=to).contains(*position))
        {
            if let Some(begin) = start
                && begin < position
            {
                gaps.push(Effect::DeleteItems {
                    from: begin,
                    to: position - 1,
                });
            }
            start = position.checked_add(1);
        }
        if let Some(begin) = start
            && begin <= to
        {
            gaps.push(Effect::DeleteItems { from: begin, to });
        }
    }
    gaps
}

/// Plans the ops of one cell over what is stored; the error rejects the whole batch.
pub(crate) fn plan<'a>(
    collection: &str,
    stored: Stored,
    ops: impl IntoIterator<Item = &'a StateOp>,
    ttl: TtlPolicy,
    now: std::time::SystemTime,
) -> Result<Vec<Effect>, StorageError> {
    let mut planner = Planner::new(collection, stored);
    for op in ops {
        planner.apply(op)?;
    }
    Ok(planner.finish(ttl, now))
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::{Duration, UNIX_EPOCH};

    use prosody_api::StorageErrorKind;
    use serde_json::json;

    use super::*;

    fn policy() -> TtlPolicy {
        TtlPolicy::new(Duration::from_secs(1000), Duration::from_secs(10))
    }

    fn run(stored: Stored, ops: &[StateOp]) -> Result<Vec<Effect>, StorageErrorKind> {
        plan("c", stored, ops, policy(), UNIX_EPOCH).map_err(|error| error.kind())
    }

    fn put_entry(entry: &str, limit: Option<u16>) -> StateOp {
        StateOp::PutMapEntry {
            entry: entry.into(),
            value: json!(1),
            ttl: None,
            keyset_limit: limit.and_then(NonZeroU16::new),
        }
    }

    fn bounds(head: i64, tail: i64, capacity: Option<u32>) -> StateOp {
        StateOp::SetDequeBounds {
            bounds: DequeBounds::new(head, tail),
            ttl: None,
            capacity: capacity.and_then(NonZeroU32::new),
        }
    }

    fn item(position: i64) -> StateOp {
        StateOp::PutDequeItem {
            position,
            item: json!(position),
            ttl: None,
        }
    }

    /// No row is both deleted and written, whatever the ops: the invariant that makes a
    /// same-timestamp batch correct.
    fn assert_disjoint(effects: &[Effect]) {
        for effect in effects {
            match effect {
                Effect::PutEntry { entry, .. } => {
                    for other in effects {
                        let covers = match other {
                            Effect::DeleteEntry { entry: deleted } => deleted == entry,
                            Effect::DeleteEntries { after, before } => {
                                after.as_ref().is_none_or(|after| entry > after)
                                    && before.as_ref().is_none_or(|before| entry < before)
                            }
                            _ => false,
                        };
                        assert!(!covers, "{entry} is deleted and written: {effects:?}");
                    }
                }
                Effect::PutItem { position, .. } => {
                    for other in effects {
                        if let Effect::DeleteItems { from, to } = other {
                            assert!(
                                !(from..=to).contains(&position),
                                "{position} is deleted and written: {effects:?}"
                            );
                        }
                    }
                }
                _ => {}
            }
        }
    }

    #[test]
    fn clear_then_put_deletes_around_the_put() {
        let effects = run(
            Stored::default(),
            &[
                put_entry("a", None),
                StateOp::ClearMap,
                put_entry("b", None),
            ],
        )
        .unwrap();
        assert_disjoint(&effects);
        assert_eq!(
            effects[..2],
            [
                Effect::DeleteEntries {
                    after: None,
                    before: Some("b".into())
                },
                Effect::DeleteEntries {
                    after: Some("b".into()),
                    before: None
                },
            ]
        );
        assert!(matches!(&effects[2], Effect::PutEntry { entry, .. } if entry == "b"));
    }

    #[test]
    fn keyset_limit_counts_live_entries_and_overwrites_never_fail() {
        let stored = Stored {
            live_entries: Some(["a".to_owned(), "b".to_owned()].into()),
            ..Stored::default()
        };
        assert_eq!(
            run(stored.clone(), &[put_entry("c", Some(2))]),
            Err(StorageErrorKind::LimitExceeded)
        );
        assert!(run(stored.clone(), &[put_entry("a", Some(2))]).is_ok());
        assert!(
            run(
                stored.clone(),
                &[
                    StateOp::DeleteMapEntry { entry: "a".into() },
                    put_entry("c", Some(2))
                ]
            )
            .is_ok()
        );
        assert_eq!(
            run(
                stored,
                &[
                    StateOp::ClearMap,
                    put_entry("x", Some(1)),
                    put_entry("y", Some(1))
                ]
            ),
            Err(StorageErrorKind::LimitExceeded)
        );
    }

    #[test]
    fn items_need_live_bounds_and_bounds_must_not_invert() {
        assert_eq!(
            run(Stored::default(), &[item(0)]),
            Err(StorageErrorKind::InvalidRequest)
        );
        assert_eq!(
            run(Stored::default(), &[bounds(3, 1, None)]),
            Err(StorageErrorKind::InvalidRequest)
        );
        let stored = Stored {
            bounds: Some(DequeBounds::new(0, 1)),
            ..Stored::default()
        };
        assert!(run(stored.clone(), &[item(0)]).is_ok());
        assert_eq!(
            run(stored, &[item(1)]),
            Err(StorageErrorKind::InvalidRequest)
        );
    }

    #[test]
    fn narrowing_then_widening_drops_what_fell_outside() {
        let stored = Stored {
            bounds: Some(DequeBounds::new(0, 5)),
            ..Stored::default()
        };
        let effects = run(stored, &[bounds(1, 4, None), bounds(0, 5, None)]).unwrap();
        assert!(effects.contains(&Effect::DeleteItems {
            from: i64::MIN,
            to: 0
        }));
        assert!(effects.contains(&Effect::DeleteItems {
            from: 4,
            to: i64::MAX
        }));
    }

    #[test]
    fn capacity_evicts_from_the_front() {
        let stored = Stored {
            bounds: Some(DequeBounds::new(0, 3)),
            ..Stored::default()
        };
        let effects = run(stored, &[bounds(0, 4, Some(3)), item(3)]).unwrap();
        assert_disjoint(&effects);
        assert!(effects.contains(&Effect::SetBounds {
            head: 1,
            tail: 4,
            expires_at: None,
            ttl: 1000
        }));
        assert!(effects.contains(&Effect::DeleteItems {
            from: i64::MIN,
            to: 0
        }));
    }

    #[test]
    fn clear_deque_then_rewrite_keeps_the_rewritten_items() {
        let stored = Stored {
            bounds: Some(DequeBounds::new(0, 1)),
            ..Stored::default()
        };
        let effects = run(
            stored,
            &[
                item(0),
                StateOp::ClearDeque,
                bounds(i64::MIN, i64::MIN + 2, None),
                item(i64::MIN),
                item(i64::MIN + 1),
            ],
        )
        .unwrap();
        assert_disjoint(&effects);
        assert_eq!(
            effects
                .iter()
                .filter(|effect| matches!(effect, Effect::DeleteItems { .. }))
                .count(),
            1,
            "{effects:?}"
        );
    }

    #[test]
    fn bounds_over_an_expired_deque_drop_every_stored_item() {
        let effects = run(Stored::default(), &[bounds(0, 2, None), item(1)]).unwrap();
        assert_disjoint(&effects);
        assert!(effects.contains(&Effect::DeleteItems {
            from: i64::MIN,
            to: 0
        }));
        assert!(effects.contains(&Effect::DeleteItems {
            from: 2,
            to: i64::MAX
        }));
    }

    #[test]
    fn carving_handles_the_extremes() {
        let all = [(i64::MIN, i64::MAX)];
        assert_eq!(
            carve(&all, [i64::MIN, i64::MAX].into_iter()),
            vec![Effect::DeleteItems {
                from: i64::MIN + 1,
                to: i64::MAX - 1
            }]
        );
        assert_eq!(
            carve(&all, std::iter::empty()),
            vec![Effect::DeleteItems {
                from: i64::MIN,
                to: i64::MAX
            }]
        );
        assert_eq!(
            carve(&[(0, 0), (5, 9)], [0, 5, 7].into_iter()),
            vec![
                Effect::DeleteItems { from: 6, to: 6 },
                Effect::DeleteItems { from: 8, to: 9 }
            ]
        );
    }

    #[test]
    fn unshifting_twice_keeps_both_new_items() {
        let stored = Stored {
            bounds: Some(DequeBounds::new(0, 1)),
            ..Stored::default()
        };
        let effects = run(
            stored,
            &[bounds(-1, 1, None), item(-1), bounds(-2, 1, None), item(-2)],
        )
        .unwrap();
        assert_disjoint(&effects);
        assert!(effects.contains(&Effect::DeleteItems {
            from: i64::MIN,
            to: -3
        }));
    }
}
