//! Latency of the two hot writes against the local Cassandra (`scripts/services up`):
//! a timer schedule, and a state commit of 10 writes (one handler's batch on one key).
//!
//! `cargo bench -p storage-cassandra --bench latency` prints p50/p99/max per operation. Calls
//! run one after another (the pipeline serializes per key), after a warm-up, on the default
//! `LOCAL_QUORUM` consistency. Optional: `PROSODY_BENCH_ITERATIONS` (default 2000).

#![allow(clippy::expect_used)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prosody_api::storage::{
    PartitionScope, StateOp, StateScope, StateStore, StateWrite, TimerStore,
};
use prosody_api::{Key, Partition, TimerKind, TimerTime};
use serde_json::json;
use storage_cassandra::{CassandraConfig, CassandraStore};

const WARM_UP: usize = 200;

/// The nearest-rank percentile, `per_mille` thousandths of the way through `sorted`.
fn percentile(sorted: &[Duration], per_mille: usize) -> Duration {
    let index = (sorted.len().saturating_sub(1) * per_mille).div_ceil(1000);
    sorted[index.min(sorted.len() - 1)]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    println!(
        "{name:<34} n={:<6} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
        samples.len(),
        percentile(&samples, 500).as_secs_f64() * 1e3,
        percentile(&samples, 990).as_secs_f64() * 1e3,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

async fn measure<F, Fut>(iterations: usize, mut call: F) -> Vec<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    for index in 0..WARM_UP {
        call(index).await;
    }
    let mut samples = Vec::with_capacity(iterations);
    for index in 0..iterations {
        let started = Instant::now();
        call(WARM_UP + index).await;
        samples.push(started.elapsed());
    }
    samples
}

fn main() {
    let nodes = std::env::var("PROSODY_CASSANDRA_NODES").unwrap_or_default();
    assert!(
        !nodes.is_empty(),
        "PROSODY_CASSANDRA_NODES is not set: run `scripts/services up` and export the variables \
         it prints"
    );
    let iterations: usize = std::env::var("PROSODY_BENCH_ITERATIONS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async {
        let config = CassandraConfig::new(nodes.split(','))
            .with_keyspace("prosody_bench")
            .with_retention(Duration::from_secs(24 * 3600));
        let store = CassandraStore::connect(&config).await.expect("connect");
        let run = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_nanos();
        let scope = PartitionScope::new(format!("bench-{run}"), "topic", Partition(0));
        let base = TimerTime::from_system_time(SystemTime::now()).as_secs();

        let schedules = measure(iterations, |index| {
            let (store, scope) = (&store, &scope);
            async move {
                let key = Key::from(format!("key-{}", index % 64));
                let time = TimerTime::from_secs(base + 60 + (index as u64 % 7200));
                store
                    .schedule(scope, &key, TimerKind::Application, time)
                    .await
                    .expect("schedule");
            }
        })
        .await;

        let collection = StateScope::group(format!("bench-{run}"), "profile");
        let commits = measure(iterations, |index| {
            let (store, collection) = (&store, &collection);
            async move {
                let key = Key::from(format!("key-{}", index % 64));
                let mut batch = vec![StateWrite::new(
                    collection.clone(),
                    key.clone(),
                    StateOp::PutValue {
                        value: json!({"visits": index, "name": "someone"}),
                        ttl: None,
                    },
                )];
                batch.extend((0..9).map(|entry| {
                    StateWrite::new(
                        collection.clone(),
                        key.clone(),
                        StateOp::PutMapEntry {
                            entry: format!("field-{entry}"),
                            value: json!({"n": index, "entry": entry}),
                            ttl: None,
                            keyset_limit: None,
                        },
                    )
                }));
                store.apply(&batch).await.expect("apply");
            }
        })
        .await;

        println!("Cassandra at {nodes}, keyspace prosody_bench, LOCAL_QUORUM, sequential calls");
        report("timer schedule", schedules);
        report("state commit of 10 writes", commits);
    });
}
