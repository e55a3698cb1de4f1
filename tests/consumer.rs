//! The consumer against a real broker: per-key order with concurrency across keys,
//! backpressure, excise routing and rebalancing between two clients.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use common::harness::{self, Behaviour, Recorder};
use prosody::ProsodyClient;
use prosody::config::ClientOptions;
use serde_json::json;
use tokio::sync::Semaphore;

async fn client(options: ClientOptions) -> ProsodyClient {
    ProsodyClient::from_options(options).await.expect("client")
}

/// Produces `records` over `keys` to a fresh topic of `partitions`, consumes them all with a
/// client of the test options as `configure` changes them, whose handlers sleep up to
/// `max_sleep_ms`, and shuts the client down.
async fn consume_all(
    name: &str,
    partitions: i32,
    configure: impl FnOnce(ClientOptions) -> ClientOptions,
    (records, keys): (usize, usize),
    max_sleep_ms: u64,
    within: Duration,
) -> Arc<Recorder> {
    let topic = common::unique_name(name);
    harness::create_topic(&topic, partitions).await;
    let group = common::unique_name(&format!("{name}_group"));
    let client = client(configure(harness::options(&topic, &group))).await;
    harness::produce(&client, &topic, records, keys).await;
    let recorder = Recorder::new();
    client
        .subscribe(recorder.handler(
            "a",
            Behaviour {
                max_sleep_ms,
                gate: None,
            },
        ))
        .await
        .expect("subscribe");
    recorder.wait_for(records, within).await;
    client.shutdown().await.expect("shutdown");
    recorder
}

/// Every key's records were handled exactly once, in the order they were produced.
fn assert_each_key_in_produce_order(recorder: &Recorder, records: usize, keys: usize) {
    let by_key = recorder.by_key();
    assert_eq!(by_key.len(), keys);
    for (key, events) in &by_key {
        let seqs: Vec<u64> = events.iter().filter_map(|event| event.seq).collect();
        let expected: Vec<u64> = (0..u64::try_from(records / keys).unwrap()).collect();
        assert_eq!(
            seqs, expected,
            "{key}: handled out of produce order or not exactly once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_with_bounded_concurrency_across_keys() {
    const RECORDS: usize = 20_000;
    const KEYS: usize = 200;
    const MAX_CONCURRENCY: usize = 32;
    let recorder = consume_all(
        "ordering",
        4,
        |options| ClientOptions {
            max_concurrency: Some(MAX_CONCURRENCY),
            ..options
        },
        (RECORDS, KEYS),
        5,
        Duration::from_secs(180),
    )
    .await;
    let by_key = recorder.by_key();
    assert_each_key_in_produce_order(&recorder, RECORDS, KEYS);
    for (key, events) in &by_key {
        assert!(
            events
                .windows(2)
                .all(|pair| pair[0].offset < pair[1].offset),
            "{key}: offsets"
        );
        assert!(
            events
                .windows(2)
                .all(|pair| pair[0].finished <= pair[1].started),
            "{key}: two events of one key overlapped"
        );
    }
    let peak = recorder.peak();
    assert!(
        peak > 1 && peak <= MAX_CONCURRENCY,
        "peak concurrency {peak}"
    );
    println!("ordering: {RECORDS} records, peak concurrency {peak} of {MAX_CONCURRENCY}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_bounds_pause_and_resume() {
    const RECORDS: usize = 60;
    const MAX_CONCURRENCY: usize = 4;
    const MAX_UNCOMMITTED: usize = 8;
    let topic = common::unique_name("backpressure");
    harness::create_topic(&topic, 1).await;
    let client = client(ClientOptions {
        max_concurrency: Some(MAX_CONCURRENCY),
        max_uncommitted: Some(MAX_UNCOMMITTED),
        ..harness::options(&topic, &common::unique_name("backpressure_group"))
    })
    .await;
    harness::produce(&client, &topic, RECORDS, RECORDS).await;

    let gate = Arc::new(Semaphore::new(0));
    let recorder = Recorder::new();
    client
        .subscribe(recorder.handler(
            "a",
            Behaviour {
                max_sleep_ms: 0,
                gate: Some(gate.clone()),
            },
        ))
        .await
        .expect("subscribe");

    let mut paused_seen = false;
    for released in 0..RECORDS {
        // Let the consumer fill up to its bounds before each release.
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let load = client.load().expect("subscribed");
                assert!(load.running <= MAX_CONCURRENCY, "{load:?}");
                assert!(load.backlog <= MAX_UNCOMMITTED, "{load:?}");
                paused_seen |= load.paused > 0;
                let outstanding = RECORDS - released;
                if recorder.running() == MAX_CONCURRENCY.min(outstanding) {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "handlers start: released {released}, load {:?}, running {}",
                client.load(),
                recorder.running()
            )
        });
        assert!(recorder.running() <= MAX_CONCURRENCY);
        gate.add_permits(1);
        recorder
            .wait_for(released + 1, Duration::from_secs(30))
            .await;
    }
    assert!(
        paused_seen,
        "the partition paused while its backlog was full"
    );
    // The recorder counts an event just before its handler returns; wait for the engine too.
    tokio::time::timeout(Duration::from_secs(10), async {
        while client
            .load()
            .is_some_and(|load| (load.backlog, load.paused) != (0, 0))
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("drained and resumed: {:?}", client.load()));
    assert!(recorder.peak() <= MAX_CONCURRENCY);
    client.shutdown().await.expect("shutdown");
}

/// Partition readers run when librdkafka signals a non-empty queue and when a full partition
/// resumes; the poll thread's periodic signal is only a backstop. With that period at an hour,
/// every record still arrives through pause and resume cycles on several partitions, so no
/// read depends on the backstop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_readers_follow_signals_not_the_poll_interval() {
    const RECORDS: usize = 1_000;
    const KEYS: usize = 50;
    let recorder = consume_all(
        "readers",
        4,
        |options| ClientOptions {
            max_concurrency: Some(3),
            max_uncommitted: Some(4),
            poll_interval_ms: Some(Duration::from_secs(3600)),
            ..options
        },
        (RECORDS, KEYS),
        // Handlers that take a moment, so a reader finds its partition full and stops
        // (instant ones free room before the reader looks again).
        2,
        Duration::from_secs(60),
    )
    .await;
    assert_each_key_in_produce_order(&recorder, RECORDS, KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excise_reaches_on_excise_in_key_order() {
    let topic = common::unique_name("excise");
    harness::create_topic(&topic, 2).await;
    let client = client(harness::options(
        &topic,
        &common::unique_name("excise_group"),
    ))
    .await;
    client
        .send(&topic, "customer-7", &json!({"seq": 0}))
        .await
        .expect("send");
    client.excise(&topic, "customer-7").await.expect("excise");
    client
        .send(&topic, "customer-7", &json!({"seq": 1}))
        .await
        .expect("send");
    client
        .send(&topic, "other", &json!({"seq": 0}))
        .await
        .expect("send");

    let recorder = Recorder::new();
    client
        .subscribe(recorder.handler("a", Behaviour::default()))
        .await
        .expect("subscribe");
    recorder.wait_for(4, Duration::from_secs(60)).await;
    client.shutdown().await.expect("shutdown");

    let events = &recorder.by_key()["customer-7"];
    let kinds: Vec<(bool, Option<u64>)> = events
        .iter()
        .map(|event| (event.excise, event.seq))
        .collect();
    assert_eq!(
        kinds,
        vec![(false, Some(0)), (true, None), (false, Some(1))]
    );
    assert!(
        events
            .windows(2)
            .all(|pair| pair[0].offset < pair[1].offset)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_joins_and_leaves_without_loss_or_overlap() {
    // Records arrive in three phases so the stream is flowing whatever the pipeline's speed:
    // before the second client joins, while both run, and after it left.
    const PHASE: usize = 4_000;
    const RECORDS: usize = 3 * PHASE;
    const KEYS: usize = 300;
    let topic = common::unique_name("rebalance");
    let group = common::unique_name("rebalance_group");
    harness::create_topic(&topic, 6).await;
    let first = client(harness::options(&topic, &group)).await;
    let second = client(harness::options(&topic, &group)).await;
    harness::produce(&first, &topic, PHASE, KEYS).await;

    let recorder = Recorder::new();
    let slow = Behaviour {
        max_sleep_ms: 3,
        gate: None,
    };
    first
        .subscribe(recorder.handler("first", slow.clone()))
        .await
        .expect("subscribe first");
    recorder.wait_for(PHASE / 4, Duration::from_secs(120)).await;
    second
        .subscribe(recorder.handler("second", slow))
        .await
        .expect("subscribe second");
    tokio::time::timeout(Duration::from_secs(60), async {
        while second.assigned_partition_count() == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the second client is assigned partitions");

    harness::produce(&first, &topic, PHASE, KEYS).await;
    tokio::time::timeout(Duration::from_secs(60), async {
        while !recorder
            .handled()
            .iter()
            .any(|event| event.client == "second")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the second client handles records");
    second.unsubscribe().await.expect("second leaves");
    harness::produce(&first, &topic, PHASE, KEYS).await;

    // Every record is handled at least once (a drained revoke commits, so normally once).
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let offsets: BTreeSet<(i32, i64)> = recorder
                .handled()
                .iter()
                .map(|event| (event.partition, event.offset))
                .collect();
            if offsets.len() == RECORDS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("every record handled after the second client left");
    first.shutdown().await.expect("shutdown first");
    second.shutdown().await.expect("shutdown second");

    let handled = recorder.handled();
    let by_second = handled
        .iter()
        .filter(|event| event.client == "second")
        .count();
    println!(
        "rebalance: {} events handled, {by_second} by the second client",
        handled.len()
    );
    let mut by_key: HashMap<&str, Vec<_>> = HashMap::new();
    for event in &handled {
        by_key.entry(event.key.as_str()).or_default().push(event);
    }
    for (key, events) in by_key {
        for (index, a) in events.iter().enumerate() {
            for b in &events[index + 1..] {
                if a.client != b.client {
                    let overlap = a.started < b.finished && b.started < a.finished;
                    assert!(
                        !overlap,
                        "key {key} handled by both clients at once: {a:?} {b:?}"
                    );
                }
            }
        }
    }
}
