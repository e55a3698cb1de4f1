//! [`DedupStore`] conformance cases.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::support::{check_property, ensure_eq, fresh_partition, neighbours, ok_or_fail};
use super::{Options, StoreFactory};
use crate::clock::{Clock, ManualClock};
use crate::storage::{DedupRecord, DedupStore, PartitionScope, Ttl};

async fn open<F>(factory: &F) -> (Arc<dyn DedupStore>, PartitionScope, ManualClock)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let clock = ManualClock::new();
    let store: Arc<dyn DedupStore> = Arc::new(factory.create(clock.clone()).await);
    (store, fresh_partition(), clock)
}

fn ttl(secs: u32) -> Ttl {
    Ttl::from_secs(secs).expect("a positive TTL")
}

fn record<'a>(key: &str, id: &'a str, version: &'a str) -> DedupRecord<'a> {
    DedupRecord::new(key, id, version)
}

async fn contains(
    store: &dyn DedupStore,
    scope: &PartitionScope,
    record: &DedupRecord<'_>,
) -> bool {
    store.contains(scope, record).await.expect("contains")
}

/// A record is absent until inserted, then present.
pub async fn absent_until_inserted<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let (store, scope, _) = open(factory).await;
    let entry = record("k", "id-1", "1");
    assert!(!contains(&*store, &scope, &entry).await);
    store.insert(&scope, &entry, ttl(60)).await.expect("insert");
    assert!(contains(&*store, &scope, &entry).await);
}

/// Inserting the same record again succeeds and leaves it present.
pub async fn insert_is_idempotent<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let (store, scope, _) = open(factory).await;
    let entry = record("k", "id", "1");
    for _ in 0..3 {
        store.insert(&scope, &entry, ttl(60)).await.expect("insert");
    }
    assert!(contains(&*store, &scope, &entry).await);
}

/// A record is present one second before its TTL elapses and absent exactly at it.
pub async fn record_expires_exactly_at_its_ttl<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let (store, scope, clock) = open(factory).await;
    let entry = record("k", "id", "1");
    store.insert(&scope, &entry, ttl(10)).await.expect("insert");
    clock.advance(Duration::from_secs(9));
    assert!(
        contains(&*store, &scope, &entry).await,
        "alive before its TTL"
    );
    clock.advance(Duration::from_secs(1));
    assert!(!contains(&*store, &scope, &entry).await, "gone at its TTL");
    clock.advance(Duration::from_secs(3600));
    assert!(!contains(&*store, &scope, &entry).await);
}

/// Re-inserting restarts the TTL from the time of the latest insert; an expired record can be
/// inserted again.
pub async fn reinsert_restarts_the_ttl<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let (store, scope, clock) = open(factory).await;
    let entry = record("k", "id", "1");
    store.insert(&scope, &entry, ttl(10)).await.expect("insert");
    clock.advance(Duration::from_secs(8));
    store
        .insert(&scope, &entry, ttl(10))
        .await
        .expect("re-insert");
    clock.advance(Duration::from_secs(8));
    assert!(contains(&*store, &scope, &entry).await, "TTL restarted");
    clock.advance(Duration::from_secs(2));
    assert!(!contains(&*store, &scope, &entry).await);
    store
        .insert(&scope, &entry, ttl(5))
        .await
        .expect("insert after expiry");
    assert!(contains(&*store, &scope, &entry).await);
}

/// Key, id and version each distinguish records; similar-looking values do not collide.
pub async fn key_id_and_version_all_distinguish<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let (store, scope, _) = open(factory).await;
    store
        .insert(&scope, &record("k", "id", "1"), ttl(60))
        .await
        .expect("insert");
    for other in [
        record("k", "id", "2"),
        record("k", "id2", "1"),
        record("k2", "id", "1"),
        record("kid", "", "1"),
        record("k", "", "id1"),
        record("", "kid", "1"),
    ] {
        assert!(!contains(&*store, &scope, &other).await, "{other:?}");
    }
}

/// Another partition, topic or consumer group sees none of a partition's records.
pub async fn partitions_topics_and_groups_are_isolated<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let (store, scope, _) = open(factory).await;
    let entry = record("k", "id", "1");
    store.insert(&scope, &entry, ttl(60)).await.expect("insert");
    for other in neighbours(&scope) {
        assert!(!contains(&*store, &other, &entry).await, "{other:?}");
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Insert(usize, u32),
    Advance(u64),
}

const RECORDS: [(&str, &str, &str); 4] = [
    ("a", "1", "v1"),
    ("a", "1", "v2"),
    ("a", "2", "v1"),
    ("b", "1", "v1"),
];

/// Random inserts (with TTLs of 1..20 s) and clock advances agree with an expiry-time model for
/// every record after every step.
pub async fn model_based_operations_match_the_model<F>(factory: &F, options: &Options)
where
    F: StoreFactory<Store: DedupStore + 'static>,
{
    let op = prop_oneof![
        3 => (0..RECORDS.len(), 1..20_u32).prop_map(|(r, secs)| Op::Insert(r, secs)),
        2 => (0..15_u64).prop_map(Op::Advance),
    ];
    check_property(
        "dedup_store::model_based_operations_match_the_model",
        options.cases,
        proptest::collection::vec(op, 1..40),
        |ops| async move {
            let (store, scope, clock) = open(factory).await;
            let mut model: BTreeMap<usize, SystemTime> = BTreeMap::new();
            for (step, op) in ops.iter().enumerate() {
                match *op {
                    Op::Insert(index, secs) => {
                        let (key, id, version) = RECORDS[index];
                        let entry = record(key, id, version);
                        // A store that answers immediately takes every other insert that way.
                        let inserted = match store.immediate().filter(|_| step % 2 == 0) {
                            Some(immediate) => immediate.insert_now(&scope, &entry, ttl(secs)),
                            None => store.insert(&scope, &entry, ttl(secs)).await,
                        };
                        ok_or_fail!(inserted, "step {step} {op:?}");
                        model.insert(index, ttl(secs).expires_at(clock.now()));
                    }
                    Op::Advance(secs) => clock.advance(Duration::from_secs(secs)),
                }
                for (index, (key, id, version)) in RECORDS.iter().enumerate() {
                    let stored = ok_or_fail!(
                        store.contains(&scope, &record(key, id, version)).await,
                        "contains"
                    );
                    let expected = model
                        .get(&index)
                        .is_some_and(|expiry| clock.now() < *expiry);
                    ensure_eq!(
                        stored,
                        expected,
                        "contains {:?} after step {step} {op:?}",
                        RECORDS[index]
                    );
                    if let Some(immediate) = store.immediate() {
                        let now = ok_or_fail!(
                            immediate.contains_now(&scope, &record(key, id, version)),
                            "contains_now"
                        );
                        ensure_eq!(
                            now,
                            expected,
                            "contains_now {:?} after step {step} {op:?}",
                            RECORDS[index]
                        );
                    }
                }
            }
            Ok(())
        },
    )
    .await;
}
