//! Random keyed-state scenarios for the model-based properties of [`super::state`] and
//! [`super::published`]: handler-level writes (push, pop, put entry...) are translated into the
//! store's absolute ops the way the runtime does it, from a staged view of the model, then
//! applied to the store and the model in batches and compared cell by cell after every step.

use std::num::{NonZeroU16, NonZeroU32};
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::model::{Model, ModelCell, Source, kind_of, probe_entries};
use super::support::ensure_eq;
use crate::clock::{Clock, ManualClock};
use crate::key::Key;
use crate::storage::{DequeBounds, StateOp, StateScope, StateStore, StateWrite, Ttl};

/// Cells are (key, collection) pairs: two keys times two collections.
pub const CELLS: usize = 4;
pub const KEYS: [&str; 2] = ["a", "b"];
pub const COLLECTIONS: [&str; 2] = ["c1", "c2"];
/// Map entries the scenarios write; "" and a non-ASCII entry check byte ordering at the edges.
pub const ENTRIES: [&str; 5] = ["", "a", "b", "ab", "\u{e4}"];

#[derive(Clone, Copy, Debug)]
pub enum Write {
    PutValue(usize, u8, Option<u8>),
    DeleteValue(usize),
    PutEntry(usize, usize, u8, Option<u8>),
    DeleteEntry(usize, usize),
    ClearMap(usize),
    Push(usize, u8, Option<u8>),
    Unshift(usize, u8, Option<u8>),
    Pop(usize, Option<u8>),
    Shift(usize, Option<u8>),
    ClearDeque(usize),
    /// An invalid write (an item beyond the tail): its whole batch must be rejected.
    PutOutside(usize, u8),
}

#[derive(Clone, Debug)]
pub enum Step {
    Batch(Vec<Write>),
    Advance(u8),
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub keyset_limit: Option<NonZeroU16>,
    pub capacity: Option<NonZeroU32>,
    pub steps: Vec<Step>,
}

/// Which writes a property favours.
#[derive(Clone, Copy, Debug)]
pub enum Focus {
    Values,
    Maps,
    Deques,
    Mixed,
}

fn value_of(n: u8) -> Value {
    match n % 4 {
        0 => json!(n),
        1 => json!(format!("s{n}")),
        2 => json!([n, {"n": n}]),
        _ => Value::Null,
    }
}

fn ttl_of(secs: Option<u8>) -> Option<Ttl> {
    secs.and_then(|secs| Ttl::from_secs(u32::from(secs)))
}

fn write_strategy(focus: Focus) -> impl Strategy<Value = Write> {
    let cell = 0..CELLS;
    let entry = 0..ENTRIES.len();
    let n = any::<u8>();
    let ttl = proptest::option::weighted(0.4, 1..12_u8);
    let (values, maps, deques) = match focus {
        Focus::Values => (8, 1, 1),
        Focus::Maps => (1, 8, 1),
        Focus::Deques => (1, 1, 8),
        Focus::Mixed => (3, 3, 3),
    };
    prop_oneof![
        3 * values => (cell.clone(), n, ttl.clone()).prop_map(|(c, n, t)| Write::PutValue(c, n, t)),
        values => cell.clone().prop_map(Write::DeleteValue),
        4 * maps => (cell.clone(), entry.clone(), n, ttl.clone())
            .prop_map(|(c, e, n, t)| Write::PutEntry(c, e, n, t)),
        2 * maps => (cell.clone(), entry).prop_map(|(c, e)| Write::DeleteEntry(c, e)),
        maps => cell.clone().prop_map(Write::ClearMap),
        4 * deques => (cell.clone(), n, ttl.clone()).prop_map(|(c, n, t)| Write::Push(c, n, t)),
        2 * deques => (cell.clone(), n, ttl.clone()).prop_map(|(c, n, t)| Write::Unshift(c, n, t)),
        2 * deques => (cell.clone(), ttl.clone()).prop_map(|(c, t)| Write::Pop(c, t)),
        2 * deques => (cell.clone(), ttl).prop_map(|(c, t)| Write::Shift(c, t)),
        deques => cell.clone().prop_map(Write::ClearDeque),
        1 => (cell, n).prop_map(|(c, n)| Write::PutOutside(c, n)),
    ]
}

pub fn scenario_strategy(focus: Focus) -> impl Strategy<Value = Scenario> {
    let step = prop_oneof![
        4 => proptest::collection::vec(write_strategy(focus), 1..4).prop_map(Step::Batch),
        1 => (0..8_u8).prop_map(Step::Advance),
    ];
    (
        proptest::option::weighted(0.7, 1..4_u16),
        proptest::option::weighted(0.7, 1..4_u32),
        proptest::collection::vec(step, 1..20),
    )
        .prop_map(|(limit, capacity, steps)| Scenario {
            keyset_limit: limit.and_then(NonZeroU16::new),
            capacity: capacity.and_then(NonZeroU32::new),
            steps,
        })
}

/// The (scope, key) of a cell index, given the two collection scopes.
pub fn cell_of(scopes: &[StateScope; 2], cell: usize) -> (StateScope, Key) {
    (
        scopes[cell / KEYS.len()].clone(),
        Key::from(KEYS[cell % KEYS.len()]),
    )
}

/// The absolute ops the runtime would stage for `write`, given the cell's staged state.
fn translate(
    write: Write,
    staged: &ModelCell,
    scenario: &Scenario,
    clock: &ManualClock,
) -> Vec<StateOp> {
    let bounds = staged.bounds(clock.now());
    let current = bounds.unwrap_or(DequeBounds::new(0, 0));
    match write {
        Write::PutValue(_, n, ttl) => vec![StateOp::PutValue {
            value: value_of(n),
            ttl: ttl_of(ttl),
        }],
        Write::DeleteValue(_) => vec![StateOp::DeleteValue],
        Write::PutEntry(_, entry, n, ttl) => vec![StateOp::PutMapEntry {
            entry: ENTRIES[entry].to_owned(),
            value: value_of(n),
            ttl: ttl_of(ttl),
            keyset_limit: scenario.keyset_limit,
        }],
        Write::DeleteEntry(_, entry) => vec![StateOp::DeleteMapEntry {
            entry: ENTRIES[entry].to_owned(),
        }],
        Write::ClearMap(_) => vec![StateOp::ClearMap],
        Write::Push(_, n, ttl) => vec![
            StateOp::SetDequeBounds {
                bounds: DequeBounds::new(current.head, current.tail + 1),
                ttl: ttl_of(ttl),
                capacity: scenario.capacity,
            },
            StateOp::PutDequeItem {
                position: current.tail,
                item: value_of(n),
                ttl: ttl_of(ttl),
            },
        ],
        Write::Unshift(_, n, ttl) => vec![
            StateOp::SetDequeBounds {
                bounds: DequeBounds::new(current.head - 1, current.tail),
                ttl: ttl_of(ttl),
                capacity: None,
            },
            StateOp::PutDequeItem {
                position: current.head - 1,
                item: value_of(n),
                ttl: ttl_of(ttl),
            },
        ],
        Write::Pop(_, ttl) | Write::Shift(_, ttl) if !current.is_empty() => {
            let bounds = if matches!(write, Write::Pop(..)) {
                DequeBounds::new(current.head, current.tail - 1)
            } else {
                DequeBounds::new(current.head + 1, current.tail)
            };
            vec![StateOp::SetDequeBounds {
                bounds,
                ttl: ttl_of(ttl),
                capacity: None,
            }]
        }
        Write::Pop(..) | Write::Shift(..) => Vec::new(),
        Write::ClearDeque(_) => vec![StateOp::ClearDeque],
        Write::PutOutside(_, n) => vec![StateOp::PutDequeItem {
            position: current.tail + 1,
            item: value_of(n),
            ttl: None,
        }],
    }
}

fn cell_index(write: Write) -> usize {
    match write {
        Write::PutValue(c, ..)
        | Write::DeleteValue(c)
        | Write::PutEntry(c, ..)
        | Write::DeleteEntry(c, ..)
        | Write::ClearMap(c)
        | Write::Push(c, ..)
        | Write::Unshift(c, ..)
        | Write::Pop(c, ..)
        | Write::Shift(c, ..)
        | Write::ClearDeque(c)
        | Write::PutOutside(c, ..) => c,
    }
}

/// Plays `scenario` against the store (writing under `scopes`) and the model, comparing every
/// cell through `read` after every step.
pub async fn play<'a>(
    store: &dyn StateStore,
    clock: &ManualClock,
    scopes: &[StateScope; 2],
    scenario: &Scenario,
    read: impl Fn(usize) -> Source<'a>,
) -> Result<(), String> {
    let mut model = Model::default();
    let entries = probe_entries(&ENTRIES);
    for (step_index, step) in scenario.steps.iter().enumerate() {
        match step {
            Step::Advance(secs) => clock.advance(Duration::from_secs(u64::from(*secs))),
            Step::Batch(writes) => {
                let mut staged = model.clone();
                let mut batch = Vec::new();
                for write in writes {
                    let (scope, key) = cell_of(scopes, cell_index(*write));
                    let ops = translate(*write, &staged.cell(&scope, &key), scenario, clock);
                    let ops: Vec<StateWrite> = ops
                        .into_iter()
                        .map(|op| StateWrite::new(scope.clone(), key.clone(), op))
                        .collect();
                    // A rejected write leaves the staged view as it was; the batch as a whole
                    // then fails in both the store and the model.
                    let _ = staged.apply(&ops, clock.now());
                    batch.extend(ops);
                }
                let stored = kind_of(&store.apply(&batch).await);
                let expected = model.apply(&batch, clock.now());
                ensure_eq!(
                    stored,
                    expected,
                    "apply outcome at step {step_index}: {batch:#?}"
                );
            }
        }
        for cell in 0..CELLS {
            let (scope, key) = cell_of(scopes, cell);
            let actual = read(cell).snapshot(&key, &entries).await?;
            let expected = model.cell(&scope, &key).snapshot(clock.now(), &entries);
            ensure_eq!(
                actual,
                expected,
                "cell {cell} ({key}, {}) after step {step_index} {step:?}",
                scope.collection
            );
        }
    }
    Ok(())
}
