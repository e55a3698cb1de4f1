//! [`DeferStore`] conformance cases.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::support::{check_property, ensure_eq, fresh_partition, neighbours, ok_or_fail};
use super::{Options, StoreFactory};
use crate::clock::ManualClock;
use crate::key::{Key, Offset};
use crate::storage::{DeferStore, DeferredMessage, DeferredTimer, PartitionScope};
use crate::timer::TimerTime;

async fn open<F>(factory: &F) -> (Arc<dyn DeferStore>, PartitionScope)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let store: Arc<dyn DeferStore> = Arc::new(factory.create(ManualClock::new()).await);
    (store, fresh_partition())
}

fn message(offset: i64, retry_count: u32) -> DeferredMessage {
    DeferredMessage {
        offset: Offset(offset),
        retry_count,
    }
}

fn timer(secs: u64, retry_count: u32) -> DeferredTimer {
    DeferredTimer {
        time: TimerTime::from_secs(secs),
        retry_count,
    }
}

async fn messages(
    store: &dyn DeferStore,
    scope: &PartitionScope,
    key: &str,
) -> Vec<DeferredMessage> {
    store
        .deferred_messages(scope, &Key::from(key))
        .await
        .expect("deferred_messages")
}

async fn timers(store: &dyn DeferStore, scope: &PartitionScope, key: &str) -> Vec<DeferredTimer> {
    store
        .deferred_timers(scope, &Key::from(key))
        .await
        .expect("deferred_timers")
}

async fn defer_message(
    store: &dyn DeferStore,
    scope: &PartitionScope,
    key: &str,
    entry: DeferredMessage,
) {
    store
        .defer_message(scope, &Key::from(key), entry)
        .await
        .expect("defer_message");
}

async fn defer_timer(
    store: &dyn DeferStore,
    scope: &PartitionScope,
    key: &str,
    entry: DeferredTimer,
) {
    store
        .defer_timer(scope, &Key::from(key), entry)
        .await
        .expect("defer_timer");
}

/// A key with nothing deferred lists nothing, and removing from it succeeds.
pub async fn unknown_key_has_nothing_deferred<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let key = Key::from("nobody");
    assert!(messages(&*store, &scope, "nobody").await.is_empty());
    assert!(timers(&*store, &scope, "nobody").await.is_empty());
    store
        .remove_deferred_message(&scope, &key, Offset(1))
        .await
        .expect("remove absent message");
    store
        .remove_deferred_timer(&scope, &key, TimerTime::from_secs(1))
        .await
        .expect("remove absent timer");
    store
        .clear_deferred_messages(&scope, &key)
        .await
        .expect("clear absent messages");
    store
        .clear_deferred_timers(&scope, &key)
        .await
        .expect("clear absent timers");
}

/// Deferred messages list in ascending offset order, whatever order they were deferred in.
pub async fn deferred_messages_list_ascending_by_offset<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    for offset in [42, 7, 1_000_000_000_000, 0] {
        defer_message(&*store, &scope, "k", message(offset, 0)).await;
    }
    assert_eq!(
        messages(&*store, &scope, "k").await,
        vec![
            message(0, 0),
            message(7, 0),
            message(42, 0),
            message(1_000_000_000_000, 0)
        ]
    );
}

/// Deferring an offset again replaces its retry count instead of adding an entry.
pub async fn deferring_a_message_again_updates_its_retry_count<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    defer_message(&*store, &scope, "k", message(5, 0)).await;
    defer_message(&*store, &scope, "k", message(5, 3)).await;
    defer_message(&*store, &scope, "k", message(5, 3)).await;
    assert_eq!(messages(&*store, &scope, "k").await, vec![message(5, 3)]);
    defer_message(&*store, &scope, "k", message(5, 1)).await;
    assert_eq!(messages(&*store, &scope, "k").await, vec![message(5, 1)]);
}

/// Removing a deferred message removes just it, and repeating the removal is harmless.
pub async fn remove_deferred_message_is_idempotent<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let key = Key::from("k");
    defer_message(&*store, &scope, "k", message(1, 0)).await;
    defer_message(&*store, &scope, "k", message(2, 4)).await;
    for _ in 0..2 {
        store
            .remove_deferred_message(&scope, &key, Offset(1))
            .await
            .expect("remove");
        assert_eq!(messages(&*store, &scope, "k").await, vec![message(2, 4)]);
    }
}

/// Clearing a key's deferred messages leaves other keys' messages and its own timers.
pub async fn clear_deferred_messages_only_touches_that_key<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    defer_message(&*store, &scope, "k", message(1, 0)).await;
    defer_message(&*store, &scope, "k", message(2, 0)).await;
    defer_message(&*store, &scope, "other", message(1, 0)).await;
    defer_timer(&*store, &scope, "k", timer(9, 0)).await;
    store
        .clear_deferred_messages(&scope, &Key::from("k"))
        .await
        .expect("clear");
    assert!(messages(&*store, &scope, "k").await.is_empty());
    assert_eq!(
        messages(&*store, &scope, "other").await,
        vec![message(1, 0)]
    );
    assert_eq!(timers(&*store, &scope, "k").await, vec![timer(9, 0)]);
}

/// Deferred timers list in ascending time order.
pub async fn deferred_timers_list_ascending_by_time<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    for secs in [300, 100, 200] {
        defer_timer(&*store, &scope, "k", timer(secs, 1)).await;
    }
    assert_eq!(
        timers(&*store, &scope, "k").await,
        vec![timer(100, 1), timer(200, 1), timer(300, 1)]
    );
}

/// Deferring a timer again replaces its retry count.
pub async fn deferring_a_timer_again_updates_its_retry_count<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    defer_timer(&*store, &scope, "k", timer(10, 0)).await;
    defer_timer(&*store, &scope, "k", timer(10, 7)).await;
    assert_eq!(timers(&*store, &scope, "k").await, vec![timer(10, 7)]);
}

/// Removing one deferred timer (twice) and clearing all of them.
pub async fn remove_and_clear_deferred_timers<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let key = Key::from("k");
    for secs in [1, 2, 3] {
        defer_timer(&*store, &scope, "k", timer(secs, 0)).await;
    }
    defer_timer(&*store, &scope, "other", timer(1, 0)).await;
    for _ in 0..2 {
        store
            .remove_deferred_timer(&scope, &key, TimerTime::from_secs(2))
            .await
            .expect("remove");
    }
    assert_eq!(
        timers(&*store, &scope, "k").await,
        vec![timer(1, 0), timer(3, 0)]
    );
    store
        .clear_deferred_timers(&scope, &key)
        .await
        .expect("clear");
    assert!(timers(&*store, &scope, "k").await.is_empty());
    assert_eq!(timers(&*store, &scope, "other").await, vec![timer(1, 0)]);
}

/// Messages and timers are separate lists: clearing one leaves the other.
pub async fn messages_and_timers_are_independent<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    let key = Key::from("k");
    defer_message(&*store, &scope, "k", message(5, 0)).await;
    defer_timer(&*store, &scope, "k", timer(5, 0)).await;
    store
        .clear_deferred_timers(&scope, &key)
        .await
        .expect("clear timers");
    assert_eq!(messages(&*store, &scope, "k").await, vec![message(5, 0)]);
    defer_timer(&*store, &scope, "k", timer(5, 0)).await;
    store
        .remove_deferred_message(&scope, &key, Offset(5))
        .await
        .expect("remove message");
    assert_eq!(timers(&*store, &scope, "k").await, vec![timer(5, 0)]);
}

/// Another partition, topic or consumer group sees none of a partition's deferred work.
pub async fn partitions_topics_and_groups_are_isolated<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    defer_message(&*store, &scope, "k", message(1, 0)).await;
    defer_timer(&*store, &scope, "k", timer(1, 0)).await;
    for other in neighbours(&scope) {
        assert!(messages(&*store, &other, "k").await.is_empty());
        assert!(timers(&*store, &other, "k").await.is_empty());
        defer_message(&*store, &other, "k", message(2, 0)).await;
        store
            .clear_deferred_messages(&other, &Key::from("k"))
            .await
            .expect("clear");
        store
            .clear_deferred_timers(&other, &Key::from("k"))
            .await
            .expect("clear");
    }
    assert_eq!(messages(&*store, &scope, "k").await, vec![message(1, 0)]);
    assert_eq!(timers(&*store, &scope, "k").await, vec![timer(1, 0)]);
}

async fn keys(store: &dyn DeferStore, scope: &PartitionScope) -> Vec<String> {
    let mut keys: Vec<String> = store
        .deferred_keys(scope)
        .await
        .expect("deferred_keys")
        .into_iter()
        .map(Key::into_string)
        .collect();
    keys.sort();
    keys
}

/// The partition's keys with deferred messages or timers are listed, each once, and only
/// while they have some; other partitions, topics and groups list none of them.
pub async fn deferred_keys_lists_the_keys_with_work<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    let (store, scope) = open(factory).await;
    assert!(keys(&*store, &scope).await.is_empty());
    defer_message(&*store, &scope, "messages", message(1, 0)).await;
    defer_message(&*store, &scope, "messages", message(2, 0)).await;
    defer_timer(&*store, &scope, "timers", timer(1, 0)).await;
    defer_message(&*store, &scope, "both", message(1, 0)).await;
    defer_timer(&*store, &scope, "both", timer(1, 0)).await;
    // A key that is a prefix of another is its own key.
    defer_timer(&*store, &scope, "both-and-more", timer(1, 0)).await;
    assert_eq!(
        keys(&*store, &scope).await,
        ["both", "both-and-more", "messages", "timers"]
    );
    for other in neighbours(&scope) {
        assert!(keys(&*store, &other).await.is_empty(), "{other:?}");
    }
    let both = Key::from("both");
    store
        .clear_deferred_messages(&scope, &both)
        .await
        .expect("clear");
    assert_eq!(
        keys(&*store, &scope).await,
        ["both", "both-and-more", "messages", "timers"],
        "a key with timers left is still listed"
    );
    store
        .remove_deferred_timer(&scope, &both, TimerTime::from_secs(1))
        .await
        .expect("remove");
    store
        .clear_deferred_timers(&scope, &Key::from("timers"))
        .await
        .expect("clear");
    for offset in [1, 2] {
        store
            .remove_deferred_message(&scope, &Key::from("messages"), Offset(offset))
            .await
            .expect("remove");
    }
    assert_eq!(keys(&*store, &scope).await, ["both-and-more"]);
}

#[derive(Clone, Copy, Debug)]
enum Op {
    DeferMessage(usize, i64, u32),
    RemoveMessage(usize, i64),
    ClearMessages(usize),
    DeferTimer(usize, u64, u32),
    RemoveTimer(usize, u64),
    ClearTimers(usize),
}

const KEYS: [&str; 2] = ["a", "b"];

fn op_strategy() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        4 => (key.clone(), 0..6_i64, 0..4_u32).prop_map(|(k, o, r)| Op::DeferMessage(k, o, r)),
        2 => (key.clone(), 0..6_i64).prop_map(|(k, o)| Op::RemoveMessage(k, o)),
        1 => key.clone().prop_map(Op::ClearMessages),
        4 => (key.clone(), 0..6_u64, 0..4_u32).prop_map(|(k, t, r)| Op::DeferTimer(k, t, r)),
        2 => (key.clone(), 0..6_u64).prop_map(|(k, t)| Op::RemoveTimer(k, t)),
        1 => key.prop_map(Op::ClearTimers),
    ]
}

type Model = BTreeMap<&'static str, (BTreeMap<i64, u32>, BTreeMap<u64, u32>)>;

/// Random defer/remove/clear sequences of messages and timers over two keys agree with a
/// per-key map model after every step.
pub async fn model_based_operations_match_the_model<F>(factory: &F, options: &Options)
where
    F: StoreFactory<Store: DeferStore + 'static>,
{
    check_property(
        "defer_store::model_based_operations_match_the_model",
        options.cases,
        proptest::collection::vec(op_strategy(), 1..40),
        |ops| async move {
            let (store, scope) = open(factory).await;
            let mut model = Model::new();
            for (step, op) in ops.iter().enumerate() {
                let result = match *op {
                    Op::DeferMessage(k, offset, retries) => {
                        model.entry(KEYS[k]).or_default().0.insert(offset, retries);
                        store
                            .defer_message(&scope, &Key::from(KEYS[k]), message(offset, retries))
                            .await
                    }
                    Op::RemoveMessage(k, offset) => {
                        model.entry(KEYS[k]).or_default().0.remove(&offset);
                        store
                            .remove_deferred_message(&scope, &Key::from(KEYS[k]), Offset(offset))
                            .await
                    }
                    Op::ClearMessages(k) => {
                        model.entry(KEYS[k]).or_default().0.clear();
                        store
                            .clear_deferred_messages(&scope, &Key::from(KEYS[k]))
                            .await
                    }
                    Op::DeferTimer(k, secs, retries) => {
                        model.entry(KEYS[k]).or_default().1.insert(secs, retries);
                        store
                            .defer_timer(&scope, &Key::from(KEYS[k]), timer(secs, retries))
                            .await
                    }
                    Op::RemoveTimer(k, secs) => {
                        model.entry(KEYS[k]).or_default().1.remove(&secs);
                        store
                            .remove_deferred_timer(
                                &scope,
                                &Key::from(KEYS[k]),
                                TimerTime::from_secs(secs),
                            )
                            .await
                    }
                    Op::ClearTimers(k) => {
                        model.entry(KEYS[k]).or_default().1.clear();
                        store
                            .clear_deferred_timers(&scope, &Key::from(KEYS[k]))
                            .await
                    }
                };
                ok_or_fail!(result, "step {step} {op:?}");
                for key in KEYS {
                    let (model_messages, model_timers) =
                        model.get(key).cloned().unwrap_or_default();
                    let stored = ok_or_fail!(
                        store.deferred_messages(&scope, &Key::from(key)).await,
                        "deferred_messages"
                    );
                    let expected: Vec<DeferredMessage> = model_messages
                        .iter()
                        .map(|(&o, &r)| message(o, r))
                        .collect();
                    ensure_eq!(
                        stored,
                        expected,
                        "messages of {key} after step {step} {op:?}"
                    );
                    let stored = ok_or_fail!(
                        store.deferred_timers(&scope, &Key::from(key)).await,
                        "deferred_timers"
                    );
                    let expected: Vec<DeferredTimer> =
                        model_timers.iter().map(|(&t, &r)| timer(t, r)).collect();
                    ensure_eq!(stored, expected, "timers of {key} after step {step} {op:?}");
                }
                let mut listed: Vec<String> =
                    ok_or_fail!(store.deferred_keys(&scope).await, "deferred_keys")
                        .into_iter()
                        .map(Key::into_string)
                        .collect();
                listed.sort();
                let expected: Vec<String> = model
                    .iter()
                    .filter(|(_, (messages, timers))| !messages.is_empty() || !timers.is_empty())
                    .map(|(key, _)| (*key).to_owned())
                    .collect();
                ensure_eq!(listed, expected, "deferred keys after step {step} {op:?}");
            }
            Ok(())
        },
    )
    .await;
}
