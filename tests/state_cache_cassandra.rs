//! The keyed-state cache (`RocksDB`, from `storage-rocksdb`) in front of the real Cassandra
//! store: the `StateStore` conformance suite, and a revoked partition's cached state is not
//! served after another client changed it. The cache over the memory store runs the same
//! suite in `storage-rocksdb`.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use prosody_api::ManualClock;
use prosody_api::conformance::Options;
use prosody_api::storage::{StateOp, StateScope, StateStore, StateWrite};
use prosody_api::{Key, SystemClock};
use serde_json::json;
use storage_cassandra::{CassandraConfig, CassandraStore};
use storage_rocksdb::CachedStateStore;
use tokio::sync::OnceCell;

const KEYSPACE: &str = "prosody_facade_tests";
const CAPACITY: u64 = 64 * 1024 * 1024;

fn config() -> CassandraConfig {
    CassandraConfig::new(common::cassandra_nodes())
        .with_keyspace(KEYSPACE)
        .with_retention(Duration::from_secs(24 * 3600))
}

/// Expands into a conformance factory: the suite evaluates it once per test (one Tokio
/// runtime), so the test's cases share one session that lives as long as that runtime.
macro_rules! cached_over_cassandra {
    () => {{
        let session: Arc<OnceCell<CassandraStore>> = Arc::new(OnceCell::new());
        move |clock: ManualClock| {
            let session = session.clone();
            async move {
                let durable = session
                    .get_or_init(|| async {
                        CassandraStore::connect(&config())
                            .await
                            .unwrap_or_else(|error| panic!("cannot connect to Cassandra: {error}"))
                    })
                    .await
                    .with_clock(clock.clone());
                CachedStateStore::open(None, Arc::new(durable), CAPACITY, Arc::new(clock))
                    .expect("open the cache")
            }
        }
    }};
}

prosody_api::state_store_conformance!(cached_over_cassandra!(), Options::default().with_cases(64));

fn put(scope: &StateScope, key: &Key, value: serde_json::Value) -> Vec<StateWrite> {
    vec![StateWrite::new(
        scope.clone(),
        key.clone(),
        StateOp::PutValue { value, ttl: None },
    )]
}

/// Two clients, each with its own session and cache: the first owner caches a value, loses
/// the partition, the second changes it; the first must read the change.
#[tokio::test]
async fn a_revoked_partitions_cached_state_is_not_served_after_another_client_changed_it() {
    let open = || async {
        let store = CassandraStore::connect(&config()).await.expect("connect");
        let cache = CachedStateStore::open(
            None,
            Arc::new(store.clone()),
            CAPACITY,
            Arc::new(SystemClock),
        )
        .expect("cache");
        (store, cache)
    };
    let (durable, first) = open().await;
    let (_, second) = open().await;
    let scope = StateScope::group(common::unique_name("cache_revoke"), "collection");
    let key = Key::from("moved-key");
    first.apply(&put(&scope, &key, json!(1))).await.unwrap();
    // Not revoked: the first client serves its cache even though Cassandra changed.
    durable
        .apply(&put(&scope, &key, json!("behind")))
        .await
        .unwrap();
    assert_eq!(first.get_value(&scope, &key).await.unwrap(), Some(json!(1)));

    first.invalidate().expect("revocation drops the cache");
    second.apply(&put(&scope, &key, json!(2))).await.unwrap();
    assert_eq!(first.get_value(&scope, &key).await.unwrap(), Some(json!(2)));
}
