//! Deduplication against a real broker: a payload `id` is handled once per (key, id,
//! `idempotenceVersion`), and only a success records it.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::time::Duration;

use common::harness;
use common::kafka_read;
use common::scripted::Script;
use prosody::ProsodyClient;
use prosody::config::{ClientOptions, Mode};
use serde_json::{Value, json};

async fn sender(topic: &str) -> ProsodyClient {
    ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(topic, &common::unique_name("dedup_sender"))
    })
    .await
    .expect("sender")
}

/// Subscribes a client of `group` with `options`, waits until `topic` is committed up to
/// `end`, shuts it down and returns what it handled as (key, payload `n`).
async fn consume(options: ClientOptions, group: &str, topic: &str, end: i64) -> Vec<(String, u64)> {
    let client = ProsodyClient::from_options(options).await.expect("client");
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");
    kafka_read::until_committed(group, topic, &[end], Duration::from_secs(60)).await;
    client.shutdown().await.expect("shutdown");
    script
        .successes()
        .into_iter()
        .map(|success| (success.key, success.payload["n"].as_u64().unwrap()))
        .collect()
}

async fn send_all(sender: &ProsodyClient, topic: &str, records: &[(&str, Value)]) {
    for (key, payload) in records {
        sender.send(topic, key, payload).await.expect("send");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_once_per_key_id_and_version() {
    let topic = common::unique_name("dedup");
    let group = common::unique_name("dedup_group");
    harness::create_topic(&topic, 1).await;
    let sender = sender(&topic).await;
    let options = |version: &str| ClientOptions {
        idempotence_version: Some(version.to_owned()),
        ..harness::options(&topic, &group)
    };

    send_all(
        &sender,
        &topic,
        &[
            ("a", json!({"id": "x", "n": 1})),
            ("a", json!({"id": "x", "n": 2})),
            ("b", json!({"id": "x", "n": 3})),
            ("a", json!({"n": 4})),
            ("a", json!({"n": 5})),
        ],
    )
    .await;
    let mut handled = consume(options("1"), &group, &topic, 5).await;
    // Keys run concurrently; only the order within a key is defined.
    handled.sort();
    assert_eq!(
        handled,
        [("a", 1), ("a", 4), ("a", 5), ("b", 3)].map(|(key, n)| (key.to_owned(), n)),
        "the repeated (a, x) is skipped; another key with the same id and payloads without \
         an id are handled"
    );

    // The same group on the same version later: still a duplicate (the store remembers).
    send_all(&sender, &topic, &[("a", json!({"id": "x", "n": 6}))]).await;
    assert!(consume(options("1"), &group, &topic, 6).await.is_empty());

    // A new idempotence version handles it again.
    send_all(&sender, &topic, &[("a", json!({"id": "x", "n": 7}))]).await;
    assert_eq!(
        consume(options("2"), &group, &topic, 7).await,
        [("a".to_owned(), 7)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_not_recorded() {
    let topic = common::unique_name("dedup_failed");
    let group = common::unique_name("dedup_failed_group");
    harness::create_topic(&topic, 1).await;
    let sender = sender(&topic).await;
    // Best-effort: the failure is logged and committed, with no retry that could succeed.
    send_all(
        &sender,
        &topic,
        &[
            ("c", json!({"id": "y", "n": 1, "fail": "permanent"})),
            ("c", json!({"id": "y", "n": 2})),
        ],
    )
    .await;
    let handled = consume(
        ClientOptions {
            mode: Some(Mode::BestEffort),
            ..harness::options(&topic, &group)
        },
        &group,
        &topic,
        2,
    )
    .await;
    assert_eq!(
        handled,
        [("c".to_owned(), 2)],
        "the failed first delivery left no record"
    );
}
