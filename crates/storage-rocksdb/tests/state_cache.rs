//! The keyed-state cache over the memory store: the `StateStore` conformance suite, and a
//! revoked partition's cached state is not served after another client changed it.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

use std::sync::Arc;

use prosody_api::storage::{StateOp, StateScope, StateStore, StateWrite};
use prosody_api::{Key, ManualClock, SystemClock};
use serde_json::json;
use storage_memory::MemoryStateStore;
use storage_rocksdb::CachedStateStore;

/// Big enough that the conformance cases never wipe the cache for size.
const CAPACITY: u64 = 64 * 1024 * 1024;

fn cached(durable: Arc<dyn StateStore>, clock: ManualClock) -> CachedStateStore {
    CachedStateStore::open(None, durable, CAPACITY, Arc::new(clock)).expect("open the cache")
}

prosody_api::state_store_conformance!(|clock: ManualClock| async move {
    cached(Arc::new(MemoryStateStore::new(clock.clone())), clock)
});

fn put(scope: &StateScope, key: &Key, value: serde_json::Value) -> Vec<StateWrite> {
    vec![StateWrite::new(
        scope.clone(),
        key.clone(),
        StateOp::PutValue { value, ttl: None },
    )]
}

fn entry(scope: &StateScope, key: &Key, value: serde_json::Value) -> Vec<StateWrite> {
    vec![StateWrite::new(
        scope.clone(),
        key.clone(),
        StateOp::PutMapEntry {
            entry: "e".to_owned(),
            value,
            ttl: None,
            keyset_limit: None,
        },
    )]
}

/// Two clients' caches over one durable store: the first owner caches a value, loses the
/// partition, the second owner changes it; the first must read the change, not its cache.
#[tokio::test]
async fn a_revoked_partitions_cached_state_is_not_served_after_another_owner_changed_it() {
    let durable: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(SystemClock));
    let first = CachedStateStore::open(None, durable.clone(), CAPACITY, Arc::new(SystemClock))
        .expect("first cache");
    let second = CachedStateStore::open(None, durable.clone(), CAPACITY, Arc::new(SystemClock))
        .expect("second cache");
    let scope = StateScope::group("group", "collection");
    let key = Key::from("moved-key");
    first.apply(&put(&scope, &key, json!(1))).await.unwrap();
    first.apply(&entry(&scope, &key, json!("a"))).await.unwrap();

    // Without a revocation the first client serves what it cached, whatever the durable store
    // holds: that is what the revocation must prevent (and shows the cache is hit).
    durable
        .apply(&put(&scope, &key, json!("behind")))
        .await
        .unwrap();
    assert_eq!(first.get_value(&scope, &key).await.unwrap(), Some(json!(1)));
    first.apply(&put(&scope, &key, json!(1))).await.unwrap();

    first.invalidate().expect("revocation drops the cache");
    second.apply(&put(&scope, &key, json!(2))).await.unwrap();
    second
        .apply(&entry(&scope, &key, json!("b")))
        .await
        .unwrap();

    assert_eq!(first.get_value(&scope, &key).await.unwrap(), Some(json!(2)));
    assert_eq!(
        first
            .get_map_entries(&scope, &key, &["e".to_owned()])
            .await
            .unwrap(),
        vec![Some(json!("b"))]
    );
    assert_eq!(
        second.get_value(&scope, &key).await.unwrap(),
        Some(json!(2))
    );
}

/// A cache opened on a directory another live cache holds fails naming the directory.
#[test]
fn a_second_cache_on_one_directory_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let durable: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(SystemClock));
    let _first = CachedStateStore::open(
        Some(dir.path()),
        durable.clone(),
        CAPACITY,
        Arc::new(SystemClock),
    )
    .unwrap();
    let error = CachedStateStore::open(Some(dir.path()), durable, CAPACITY, Arc::new(SystemClock))
        .unwrap_err()
        .to_string();
    assert!(error.contains(&dir.path().display().to_string()), "{error}");
    assert!(error.contains("locked"), "{error}");
}

/// Past its capacity the cache drops everything and keeps answering correctly.
#[tokio::test]
async fn past_its_capacity_the_cache_stays_correct() {
    let durable: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(SystemClock));
    let cache = CachedStateStore::open(None, durable, 4096, Arc::new(SystemClock)).unwrap();
    let scope = StateScope::group("group", "collection");
    for round in 0..200 {
        let key = Key::new(format!("key-{}", round % 20));
        cache.apply(&put(&scope, &key, json!(round))).await.unwrap();
        assert_eq!(
            cache.get_value(&scope, &key).await.unwrap(),
            Some(json!(round))
        );
    }
}
