//! Latency of the keyed-state hot paths on `RocksDB`: a state `get_value` of a hot cell (served
//! from the memtable or block cache) and an `apply` of a 10-write batch (one value and nine map
//! entries, the shape of a handler's commit), with synced and unsynced writes.
//!
//! The same two operations through the keyed-state cache ([`CachedStateStore`]) in front of
//! the memory store: a get of a cell the cache learnt from a commit is a cache hit (the
//! durable store is not asked), and a commit costs the durable store's apply (here: memory,
//! next to nothing) plus the cache's unsynced `WriteBatch`, so its figure is the cache's
//! overhead on top of Cassandra's commit latency (`cargo bench -p storage-cassandra --bench
//! latency`; the facade's `state_cache` bench measures the two together).
//!
//! Prints p50/p99/p999 per operation. Target (issue 8): hot (cached) get p99 under 50 us.
//!
//! Run: `cargo bench -p storage-rocksdb --bench state`. The database lives in a temporary
//! directory (`TMPDIR`), so synced figures are those of that file system.

// A benchmark fails by panicking, like a test.
#![allow(clippy::expect_used)]

use std::time::{Duration, Instant};

use prosody_api::storage::{StateOp, StateScope, StateStore, StateWrite};
use prosody_api::{Key, SystemClock};
use serde_json::json;
use std::sync::Arc;

use storage_memory::MemoryStateStore;
use storage_rocksdb::{CachedStateStore, RocksOptions, RocksStore};

const GET_WARMUP: usize = 10_000;
const GETS: usize = 100_000;
const CELLS: usize = 1_000;

fn percentiles(mut samples: Vec<Duration>) -> String {
    samples.sort_unstable();
    // Nearest-rank on the sorted samples, in integers: `per_mille` of the way through.
    let at = |per_mille: usize| samples[(samples.len() - 1) * per_mille / 1000];
    let micros = |duration: Duration| duration.as_secs_f64() * 1e6;
    format!(
        "p50 {:>8.1} us   p99 {:>8.1} us   p999 {:>8.1} us   ({} samples)",
        micros(at(500)),
        micros(at(990)),
        micros(at(999)),
        samples.len()
    )
}

fn open(sync: bool) -> RocksStore {
    let options = RocksOptions::new()
        .with_clock(SystemClock)
        .with_sync_writes(sync);
    RocksStore::open_temporary(&options).expect("open the store")
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

async fn bench(sync: bool, applies: usize) {
    let store = open(sync);
    let mode = if sync { "synced" } else { "unsynced" };
    measure(&store, mode, applies).await;
}

async fn bench_cache(applies: usize) {
    let cache = CachedStateStore::open(
        None,
        Arc::new(MemoryStateStore::new(SystemClock)),
        256 * 1024 * 1024,
        Arc::new(SystemClock),
    )
    .expect("open the cache");
    measure(&cache, "cache", applies).await;
}

async fn measure(store: &dyn StateStore, mode: &str, applies: usize) {
    let scope = StateScope::group("bench-group", "bench-collection");
    let keys: Vec<Key> = (0..CELLS)
        .map(|index| Key::new(format!("key-{index}")))
        .collect();
    for (round, key) in keys.iter().enumerate() {
        store
            .apply(&commit(&scope, key, round))
            .await
            .expect("seed");
    }

    for index in 0..GET_WARMUP {
        store
            .get_value(&scope, &keys[index % CELLS])
            .await
            .expect("get");
    }
    let mut gets = Vec::with_capacity(GETS);
    for index in 0..GETS {
        let key = &keys[(index * 7) % CELLS];
        let start = Instant::now();
        let value = store.get_value(&scope, key).await.expect("get");
        gets.push(start.elapsed());
        assert!(value.is_some());
    }

    let mut commits = Vec::with_capacity(applies);
    for round in 0..applies {
        let writes = commit(&scope, &keys[round % CELLS], round);
        let start = Instant::now();
        store.apply(&writes).await.expect("apply");
        commits.push(start.elapsed());
    }

    println!("state get (hot)        [{mode:>8}]  {}", percentiles(gets));
    println!(
        "apply of 10 writes     [{mode:>8}]  {}",
        percentiles(commits)
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(bench(false, 20_000));
    runtime.block_on(bench(true, 2_000));
    runtime.block_on(bench_cache(20_000));
}
