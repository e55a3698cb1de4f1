//! Latency of keyed state through the `RocksDB` cache in front of the local Cassandra
//! (`scripts/services up`), side by side with Cassandra alone: a hot `get_value` (a cell this
//! client committed, so a cache hit) and a commit of 10 writes (one value and nine map
//! entries on one key, the shape of a handler's batch).
//!
//! `cargo bench -p prosody --bench state_cache` prints p50/p99/p999 per operation. Target
//! (issue 8): cached get p99 under 50 us. Calls run one after another, as the pipeline runs
//! one event per key at a time. Optional: `PROSODY_BENCH_ITERATIONS` (commits, default 2000).

// A benchmark fails by panicking, like a test.
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prosody_api::storage::{StateOp, StateScope, StateStore, StateWrite};
use prosody_api::{Key, SystemClock};
use serde_json::json;
use storage_cassandra::{CassandraConfig, CassandraStore};
use storage_rocksdb::CachedStateStore;

const CELLS: usize = 1_000;
const GETS: usize = 100_000;

fn percentiles(mut samples: Vec<Duration>) -> String {
    samples.sort_unstable();
    let at = |per_mille: usize| samples[(samples.len() - 1) * per_mille / 1000];
    let micros = |duration: Duration| duration.as_secs_f64() * 1e6;
    format!(
        "p50 {:>9.1} us   p99 {:>9.1} us   p999 {:>9.1} us   ({} samples)",
        micros(at(500)),
        micros(at(990)),
        micros(at(999)),
        samples.len()
    )
}

fn commit(scope: &StateScope, key: &Key, round: usize) -> Vec<StateWrite> {
    let mut writes = vec![StateWrite::new(
        scope.clone(),
        key.clone(),
        StateOp::PutValue {
            value: json!({"round": round, "status": "active", "tags": ["a", "b"]}),
            ttl: None,
        },
    )];
    writes.extend((0..9).map(|entry| {
        StateWrite::new(
            scope.clone(),
            key.clone(),
            StateOp::PutMapEntry {
                entry: format!("entry-{entry}"),
                value: json!({"round": round, "entry": entry}),
                ttl: None,
                keyset_limit: None,
            },
        )
    }));
    writes
}

async fn bench(name: &str, store: &dyn StateStore, gets: usize, commits: usize) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let scope = StateScope::group(format!("bench-{nanos}"), "bench-collection");
    let keys: Vec<Key> = (0..CELLS)
        .map(|index| Key::new(format!("key-{index}")))
        .collect();
    for (round, key) in keys.iter().enumerate() {
        store
            .apply(&commit(&scope, key, round))
            .await
            .expect("seed");
    }
    let mut samples = Vec::with_capacity(gets);
    for index in 0..gets {
        let key = &keys[(index * 7) % CELLS];
        let start = Instant::now();
        let value = store.get_value(&scope, key).await.expect("get");
        samples.push(start.elapsed());
        assert!(value.is_some());
    }
    println!("{name:<28} get (hot)     {}", percentiles(samples));
    let mut samples = Vec::with_capacity(commits);
    for round in 0..commits {
        let writes = commit(&scope, &keys[round % CELLS], round);
        let start = Instant::now();
        store.apply(&writes).await.expect("apply");
        samples.push(start.elapsed());
    }
    println!("{name:<28} commit of 10  {}", percentiles(samples));
}

fn main() {
    let nodes = std::env::var("PROSODY_CASSANDRA_NODES")
        .expect("PROSODY_CASSANDRA_NODES: run `scripts/services up` and export what it prints");
    let commits = std::env::var("PROSODY_BENCH_ITERATIONS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let config = CassandraConfig::new(nodes.split(','))
            .with_keyspace("prosody_bench")
            .with_retention(Duration::from_secs(24 * 3600));
        let cassandra = CassandraStore::connect(&config).await.expect("connect");
        let cached = CachedStateStore::open(
            None,
            Arc::new(cassandra.clone()),
            256 * 1024 * 1024,
            Arc::new(SystemClock),
        )
        .expect("open the cache");
        bench("cassandra + rocksdb cache", &cached, GETS, commits).await;
        // Cassandra alone, fewer gets: each is a round trip.
        bench("cassandra alone", &cassandra, GETS / 20, commits).await;
    });
}
