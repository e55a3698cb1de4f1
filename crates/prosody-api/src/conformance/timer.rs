//! [`TimerStore`] conformance cases.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;

use super::support::{check_property, ensure_eq, fresh_partition, neighbours, ok_or_fail};
use super::{Options, StoreFactory};
use crate::clock::ManualClock;
use crate::error::StorageErrorKind;
use crate::key::Key;
use crate::storage::{PartitionScope, StoredTimer, TimerStore};
use crate::timer::{SlabId, SlabSize, TimerKind, TimerTime};

/// Cases place a few timers within the first seconds of a slab and expect them to share it.
pub const MIN_SLAB_SECS: u32 = 60;

const APP: TimerKind = TimerKind::Application;
const RETRY: TimerKind = TimerKind::DeferRetry;

async fn open<F>(factory: &F) -> (Arc<dyn TimerStore>, PartitionScope)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let store: Arc<dyn TimerStore> = Arc::new(factory.create(ManualClock::new()).await);
    assert!(
        store.slab_size().as_secs() >= MIN_SLAB_SECS,
        "the timer suite needs a slab size of at least {MIN_SLAB_SECS} s"
    );
    (store, fresh_partition())
}

fn t(secs: u64) -> TimerTime {
    TimerTime::from_secs(secs)
}

/// A base time well after the epoch, aligned to the slab so cases can reason in slab offsets.
fn base(size: SlabSize) -> u64 {
    let size = u64::from(size.as_secs());
    (ManualClock::DEFAULT_START_SECS / size) * size
}

async fn scheduled(
    store: &dyn TimerStore,
    scope: &PartitionScope,
    key: &str,
    kind: TimerKind,
) -> Vec<TimerTime> {
    store
        .scheduled(scope, &Key::from(key), kind)
        .await
        .expect("scheduled")
}

async fn schedule(
    store: &dyn TimerStore,
    scope: &PartitionScope,
    key: &str,
    kind: TimerKind,
    time: TimerTime,
) {
    store
        .schedule(scope, &Key::from(key), kind, time)
        .await
        .expect("schedule");
}

fn timer(time: TimerTime, key: &str, kind: TimerKind) -> StoredTimer {
    StoredTimer {
        time,
        key: Key::from(key),
        kind,
    }
}

/// `scheduled` returns a key's times ascending, whatever order they were scheduled in.
pub async fn scheduled_lists_times_ascending_per_key<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    assert!(scheduled(&*store, &scope, "k", APP).await.is_empty());
    for secs in [500, 100, 300, 200] {
        schedule(&*store, &scope, "k", APP, t(secs)).await;
    }
    assert_eq!(
        scheduled(&*store, &scope, "k", APP).await,
        vec![t(100), t(200), t(300), t(500)]
    );
}

/// Scheduling a second that is already scheduled is an upsert: still one timer, everywhere.
pub async fn scheduling_the_same_second_twice_keeps_one_timer<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let time = t(base(store.slab_size()) + 7);
    schedule(&*store, &scope, "k", APP, time).await;
    schedule(&*store, &scope, "k", APP, time).await;
    assert_eq!(scheduled(&*store, &scope, "k", APP).await, vec![time]);
    let slab = store
        .slab(&scope, time.slab(store.slab_size()))
        .await
        .expect("slab");
    assert_eq!(slab, vec![timer(time, "k", APP)]);
}

/// `unschedule` removes exactly one timer and is a no-op for an absent one.
pub async fn unschedule_removes_only_that_timer<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let key = Key::from("k");
    schedule(&*store, &scope, "k", APP, t(10)).await;
    schedule(&*store, &scope, "k", APP, t(20)).await;
    store
        .unschedule(&scope, &key, APP, t(10))
        .await
        .expect("unschedule");
    assert_eq!(scheduled(&*store, &scope, "k", APP).await, vec![t(20)]);
    store
        .unschedule(&scope, &key, APP, t(10))
        .await
        .expect("unscheduling an absent timer succeeds");
    store
        .unschedule(&scope, &Key::from("never"), APP, t(10))
        .await
        .expect("unscheduling for an unknown key succeeds");
    assert_eq!(scheduled(&*store, &scope, "k", APP).await, vec![t(20)]);
}

/// `clear` removes every timer of one kind for one key and nothing else.
pub async fn clear_removes_every_timer_of_the_kind_for_the_key<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    for secs in [1, 2, 3] {
        schedule(&*store, &scope, "k", APP, t(secs)).await;
    }
    schedule(&*store, &scope, "k", RETRY, t(2)).await;
    schedule(&*store, &scope, "other", APP, t(2)).await;
    store
        .clear(&scope, &Key::from("k"), APP)
        .await
        .expect("clear");
    assert!(scheduled(&*store, &scope, "k", APP).await.is_empty());
    assert_eq!(scheduled(&*store, &scope, "k", RETRY).await, vec![t(2)]);
    assert_eq!(scheduled(&*store, &scope, "other", APP).await, vec![t(2)]);
    assert_eq!(
        store.slab(&scope, SlabId(0)).await.expect("slab"),
        vec![timer(t(2), "k", RETRY), timer(t(2), "other", APP)]
    );
    store
        .clear(&scope, &Key::from("k"), APP)
        .await
        .expect("clearing an empty key succeeds");
}

/// `clear_and_schedule` leaves exactly the new timer of that kind, in both indexes.
pub async fn clear_and_schedule_replaces_the_keys_timers<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let size = store.slab_size();
    let start = base(size);
    let key = Key::from("k");
    schedule(&*store, &scope, "k", APP, t(start + 1)).await;
    schedule(&*store, &scope, "k", APP, t(start + 2)).await;
    schedule(&*store, &scope, "k", RETRY, t(start + 1)).await;
    let later = t(start + 3 * u64::from(size.as_secs()));
    store
        .clear_and_schedule(&scope, &key, APP, later)
        .await
        .expect("clear_and_schedule");
    store
        .clear_and_schedule(&scope, &key, APP, later)
        .await
        .expect("clear_and_schedule again");
    assert_eq!(scheduled(&*store, &scope, "k", APP).await, vec![later]);
    assert_eq!(
        scheduled(&*store, &scope, "k", RETRY).await,
        vec![t(start + 1)]
    );
    assert_eq!(
        store.slab(&scope, t(start).slab(size)).await.expect("slab"),
        vec![timer(t(start + 1), "k", RETRY)]
    );
    assert_eq!(
        store.slab(&scope, later.slab(size)).await.expect("slab"),
        vec![timer(later, "k", APP)]
    );
    store
        .clear_and_schedule(&scope, &Key::from("fresh"), APP, later)
        .await
        .expect("clear_and_schedule on an empty key");
    assert_eq!(scheduled(&*store, &scope, "fresh", APP).await, vec![later]);
}

/// Application and defer-retry timers at the same second are two timers; each kind's
/// operations leave the other kind alone, and a slab lists both.
pub async fn kinds_coexist_and_stay_separate<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let key = Key::from("k");
    schedule(&*store, &scope, "k", APP, t(5)).await;
    schedule(&*store, &scope, "k", RETRY, t(5)).await;
    schedule(&*store, &scope, "k", RETRY, t(6)).await;
    assert_eq!(scheduled(&*store, &scope, "k", APP).await, vec![t(5)]);
    assert_eq!(
        scheduled(&*store, &scope, "k", RETRY).await,
        vec![t(5), t(6)]
    );
    assert_eq!(
        store.slab(&scope, SlabId(0)).await.expect("slab"),
        vec![
            timer(t(5), "k", APP),
            timer(t(5), "k", RETRY),
            timer(t(6), "k", RETRY)
        ]
    );
    store
        .unschedule(&scope, &key, APP, t(5))
        .await
        .expect("unschedule");
    assert!(scheduled(&*store, &scope, "k", APP).await.is_empty());
    assert_eq!(
        scheduled(&*store, &scope, "k", RETRY).await,
        vec![t(5), t(6)]
    );
}

/// A slab holds `start <= time < end`: its first second is in, the next slab's first second is
/// out; timers are listed by time, then key, then kind.
pub async fn slab_lists_its_timers_in_order_with_exclusive_end<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let size = store.slab_size();
    let slab = t(base(size)).slab(size);
    let (start, end) = (slab.start(size), slab.end(size));
    let last = t(end.as_secs() - 1);
    schedule(&*store, &scope, "b", APP, last).await;
    schedule(&*store, &scope, "a", APP, last).await;
    schedule(&*store, &scope, "z", APP, start).await;
    schedule(&*store, &scope, "a", APP, end).await;
    schedule(&*store, &scope, "a", APP, t(start.as_secs() - 1)).await;
    assert_eq!(
        store.slab(&scope, slab).await.expect("slab"),
        vec![
            timer(start, "z", APP),
            timer(last, "a", APP),
            timer(last, "b", APP)
        ]
    );
    assert_eq!(
        store.slab(&scope, SlabId(slab.0 + 1)).await.expect("slab"),
        vec![timer(end, "a", APP)]
    );
    assert_eq!(
        store.slab(&scope, SlabId(slab.0 - 1)).await.expect("slab"),
        vec![timer(t(start.as_secs() - 1), "a", APP)]
    );
    assert!(
        store
            .slab(&scope, SlabId(slab.0 + 2))
            .await
            .expect("slab")
            .is_empty()
    );
}

/// `slabs(until)` lists every slab holding a timer up to `until`, ascending, and nothing after.
pub async fn slabs_lists_every_nonempty_slab_up_to_until<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let size = store.slab_size();
    let first = t(base(size)).slab(size);
    for offset in [5, 0, 2] {
        let slab = SlabId(first.0 + offset);
        schedule(&*store, &scope, "k", APP, slab.start(size)).await;
    }
    let listed = store
        .slabs(&scope, SlabId(first.0 + 2))
        .await
        .expect("slabs");
    assert!(
        listed.windows(2).all(|pair| pair[0] < pair[1]),
        "{listed:?}"
    );
    assert!(listed.contains(&first) && listed.contains(&SlabId(first.0 + 2)));
    assert!(
        listed.iter().all(|slab| slab.0 <= first.0 + 2),
        "{listed:?}"
    );
    let all = store
        .slabs(&scope, SlabId(first.0 + 100))
        .await
        .expect("slabs");
    assert!(all.contains(&SlabId(first.0 + 5)), "{all:?}");
    assert!(
        store
            .slabs(&scope, SlabId(first.0 - 1))
            .await
            .expect("slabs")
            .is_empty()
    );
}

/// Unscheduled and cleared timers disappear from their slab.
pub async fn unscheduled_timers_leave_their_slab<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let key = Key::from("k");
    schedule(&*store, &scope, "k", APP, t(10)).await;
    schedule(&*store, &scope, "k", APP, t(11)).await;
    store
        .unschedule(&scope, &key, APP, t(10))
        .await
        .expect("unschedule");
    assert_eq!(
        store.slab(&scope, SlabId(0)).await.expect("slab"),
        vec![timer(t(11), "k", APP)]
    );
    store.clear(&scope, &key, APP).await.expect("clear");
    assert!(
        store
            .slab(&scope, SlabId(0))
            .await
            .expect("slab")
            .is_empty()
    );
    for slab in store.slabs(&scope, SlabId(10)).await.expect("slabs") {
        assert!(
            store.slab(&scope, slab).await.expect("slab").is_empty(),
            "a listed slab may be empty but must load"
        );
    }
}

/// Time zero and [`TimerTime::MAX`] round-trip; a later time is an invalid request.
pub async fn times_at_the_extremes_round_trip<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let size = store.slab_size();
    schedule(&*store, &scope, "k", APP, t(0)).await;
    schedule(&*store, &scope, "k", APP, TimerTime::MAX).await;
    assert_eq!(
        scheduled(&*store, &scope, "k", APP).await,
        vec![t(0), TimerTime::MAX]
    );
    assert_eq!(
        store
            .slab(&scope, TimerTime::MAX.slab(size))
            .await
            .expect("slab"),
        vec![timer(TimerTime::MAX, "k", APP)]
    );
    let error = store
        .schedule(
            &scope,
            &Key::from("k"),
            APP,
            t(TimerTime::MAX.as_secs() + 1),
        )
        .await
        .expect_err("a time beyond TimerTime::MAX is rejected");
    assert_eq!(error.kind(), StorageErrorKind::InvalidRequest);
}

/// Timers of one key are invisible to another key of the same partition.
pub async fn keys_are_isolated<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    schedule(&*store, &scope, "a", APP, t(1)).await;
    schedule(&*store, &scope, "b", APP, t(2)).await;
    schedule(&*store, &scope, "", APP, t(3)).await;
    assert_eq!(scheduled(&*store, &scope, "a", APP).await, vec![t(1)]);
    assert_eq!(scheduled(&*store, &scope, "b", APP).await, vec![t(2)]);
    assert_eq!(scheduled(&*store, &scope, "", APP).await, vec![t(3)]);
    store
        .clear(&scope, &Key::from("a"), APP)
        .await
        .expect("clear");
    assert_eq!(scheduled(&*store, &scope, "b", APP).await, vec![t(2)]);
}

/// Another partition, topic or consumer group sees none of a partition's timers.
pub async fn partitions_topics_and_groups_are_isolated<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let (store, scope) = open(factory).await;
    schedule(&*store, &scope, "k", APP, t(1)).await;
    for other in neighbours(&scope) {
        assert!(scheduled(&*store, &other, "k", APP).await.is_empty());
        assert!(
            store
                .slab(&other, SlabId(0))
                .await
                .expect("slab")
                .is_empty()
        );
        assert!(
            store
                .slabs(&other, SlabId(10))
                .await
                .expect("slabs")
                .is_empty()
        );
        schedule(&*store, &other, "k", APP, t(2)).await;
        store
            .clear(&other, &Key::from("k"), APP)
            .await
            .expect("clear");
    }
    assert_eq!(scheduled(&*store, &scope, "k", APP).await, vec![t(1)]);
}

/// Where in the four test slabs a generated time falls; resolved against the store's slab size
/// so the same input exercises slab edges whatever the size.
#[derive(Clone, Copy, Debug)]
enum Position {
    First,
    Second,
    Middle,
    Last,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Schedule(usize, TimerKind, u8, Position),
    ClearAndSchedule(usize, TimerKind, u8, Position),
    Unschedule(usize, TimerKind, u8, Position),
    Clear(usize, TimerKind),
}

const KEYS: [&str; 3] = ["a", "b", "c"];
const SLABS: u64 = 4;

fn op_strategy() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let kind = prop_oneof![3 => Just(APP), 1 => Just(RETRY)];
    let slab = 0..u8::try_from(SLABS).unwrap_or(1);
    let position = prop_oneof![
        Just(Position::First),
        Just(Position::Second),
        Just(Position::Middle),
        Just(Position::Last)
    ];
    prop_oneof![
        4 => (key.clone(), kind.clone(), slab.clone(), position.clone())
            .prop_map(|(k, kind, s, p)| Op::Schedule(k, kind, s, p)),
        1 => (key.clone(), kind.clone(), slab.clone(), position.clone())
            .prop_map(|(k, kind, s, p)| Op::ClearAndSchedule(k, kind, s, p)),
        2 => (key.clone(), kind.clone(), slab, position)
            .prop_map(|(k, kind, s, p)| Op::Unschedule(k, kind, s, p)),
        1 => (key, kind).prop_map(|(k, kind)| Op::Clear(k, kind)),
    ]
}

fn resolve(size: SlabSize, first: SlabId, slab: u8, position: Position) -> TimerTime {
    let slab = SlabId(first.0 + u64::from(slab));
    let start = slab.start(size).as_secs();
    let width = u64::from(size.as_secs());
    TimerTime::from_secs(match position {
        Position::First => start,
        Position::Second => start + 1.min(width - 1),
        Position::Middle => start + width / 2,
        Position::Last => start + width - 1,
    })
}

/// Random `schedule`/`clear_and_schedule`/`unschedule`/`clear` sequences over three keys, two kinds and
/// four slabs agree with a set-of-timers model in `scheduled` (after every step), `slab` and
/// `slabs`.
pub async fn model_based_operations_match_the_model<F>(factory: &F, options: &Options)
where
    F: StoreFactory<Store: TimerStore + 'static>,
{
    let strategy = proptest::collection::vec(op_strategy(), 1..40);
    check_property(
        "timer_store::model_based_operations_match_the_model",
        options.cases,
        strategy,
        |ops| async move {
            let (store, scope) = open(factory).await;
            let size = store.slab_size();
            let first = t(base(size)).slab(size);
            let mut model: BTreeSet<StoredTimer> = BTreeSet::new();
            for (step, op) in ops.iter().enumerate() {
                let (key, kind) = match *op {
                    Op::Schedule(k, kind, slab, position) => {
                        let time = resolve(size, first, slab, position);
                        ok_or_fail!(
                            store
                                .schedule(&scope, &Key::from(KEYS[k]), kind, time)
                                .await,
                            "step {step} {op:?}"
                        );
                        model.insert(timer(time, KEYS[k], kind));
                        (k, kind)
                    }
                    Op::ClearAndSchedule(k, kind, slab, position) => {
                        let time = resolve(size, first, slab, position);
                        ok_or_fail!(
                            store
                                .clear_and_schedule(&scope, &Key::from(KEYS[k]), kind, time)
                                .await,
                            "step {step} {op:?}"
                        );
                        model
                            .retain(|timer| !(timer.key.as_str() == KEYS[k] && timer.kind == kind));
                        model.insert(timer(time, KEYS[k], kind));
                        (k, kind)
                    }
                    Op::Unschedule(k, kind, slab, position) => {
                        let time = resolve(size, first, slab, position);
                        ok_or_fail!(
                            store
                                .unschedule(&scope, &Key::from(KEYS[k]), kind, time)
                                .await,
                            "step {step} {op:?}"
                        );
                        model.remove(&timer(time, KEYS[k], kind));
                        (k, kind)
                    }
                    Op::Clear(k, kind) => {
                        ok_or_fail!(
                            store.clear(&scope, &Key::from(KEYS[k]), kind).await,
                            "step {step} {op:?}"
                        );
                        model
                            .retain(|timer| !(timer.key.as_str() == KEYS[k] && timer.kind == kind));
                        (k, kind)
                    }
                };
                let listed = ok_or_fail!(
                    store.scheduled(&scope, &Key::from(KEYS[key]), kind).await,
                    "scheduled after step {step}"
                );
                let expected: Vec<TimerTime> = model
                    .iter()
                    .filter(|timer| timer.key.as_str() == KEYS[key] && timer.kind == kind)
                    .map(|timer| timer.time)
                    .collect();
                ensure_eq!(
                    listed,
                    expected,
                    "scheduled({}, {kind:?}) after step {step} {op:?}",
                    KEYS[key]
                );
            }
            for key in KEYS {
                for kind in TimerKind::ALL {
                    let listed = ok_or_fail!(
                        store.scheduled(&scope, &Key::from(key), kind).await,
                        "final scheduled"
                    );
                    let expected: Vec<TimerTime> = model
                        .iter()
                        .filter(|timer| timer.key.as_str() == key && timer.kind == kind)
                        .map(|timer| timer.time)
                        .collect();
                    ensure_eq!(listed, expected, "final scheduled({key}, {kind:?})");
                }
            }
            for offset in 0..SLABS {
                let slab = SlabId(first.0 + offset);
                let listed = ok_or_fail!(store.slab(&scope, slab).await, "slab {slab:?}");
                let expected: Vec<StoredTimer> = model
                    .iter()
                    .filter(|timer| timer.time.slab(size) == slab)
                    .cloned()
                    .collect();
                ensure_eq!(listed, expected, "slab {offset}");
            }
            let slabs = ok_or_fail!(store.slabs(&scope, SlabId(first.0 + SLABS)).await, "slabs");
            let nonempty: BTreeSet<SlabId> =
                model.iter().map(|timer| timer.time.slab(size)).collect();
            if !nonempty.iter().all(|slab| slabs.contains(slab)) {
                return Err(format!("slabs {slabs:?} misses one of {nonempty:?}"));
            }
            Ok(())
        },
    )
    .await;
}
