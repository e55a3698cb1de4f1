//! Filters against a real broker (FEATURES.md section 1): `allowedEvents` prefixes on the
//! payload's `type`, and loop prevention by the `source-system` header. Filtered records are
//! committed, never handled.

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
use prosody::config::ClientOptions;
use serde_json::json;

/// A client that only sends, stamping `source_system`.
async fn sender(topic: &str, source_system: &str) -> ProsodyClient {
    ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        source_system: Some(source_system.to_owned()),
        ..harness::options(topic, &common::unique_name("filters_sender"))
    })
    .await
    .expect("sender")
}

async fn handled(options: ClientOptions, group: &str, topic: &str, end: i64) -> Vec<String> {
    let client = ProsodyClient::from_options(options).await.expect("client");
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");
    kafka_read::until_committed(group, topic, &[end], Duration::from_secs(60)).await;
    client.shutdown().await.expect("shutdown");
    // Keys run concurrently: only the set is defined.
    let mut keys = script.handled_keys();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_events_match_type_prefixes_and_untyped_messages_pass() {
    let topic = common::unique_name("allowed");
    let group = common::unique_name("allowed_group");
    harness::create_topic(&topic, 1).await;
    let sender = sender(&topic, "upstream").await;
    let records = [
        ("order-created", json!({"type": "order.created"})),
        ("order-bare", json!({"type": "order"})),
        ("orders-plural", json!({"type": "orders.listed"})),
        ("nested", json!({"type": "audit.order.created"})),
        ("invoice", json!({"type": "invoice.sent"})),
        ("untyped", json!({"n": 1})),
        ("numeric-type", json!({"type": 3})),
    ];
    for (key, payload) in &records {
        sender.send(&topic, key, payload).await.expect("send");
    }
    sender.excise(&topic, "excised").await.expect("excise");
    let handled = handled(
        ClientOptions {
            allowed_events: Some(vec!["order.".to_owned(), "invoice".to_owned()]),
            ..harness::options(&topic, &group)
        },
        &group,
        &topic,
        8,
    )
    .await;
    assert_eq!(
        handled,
        ["invoice", "numeric-type", "order-created", "untyped"],
        "prefixes match from the start of `type`; messages without a string type pass"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_prefixes_allow_everything() {
    let topic = common::unique_name("allowed_all");
    let group = common::unique_name("allowed_all_group");
    harness::create_topic(&topic, 1).await;
    let sender = sender(&topic, "upstream").await;
    for (key, kind) in [("a", "order.created"), ("b", "anything")] {
        sender
            .send(&topic, key, &json!({"type": kind}))
            .await
            .expect("send");
    }
    let handled = handled(harness::options(&topic, &group), &group, &topic, 2).await;
    assert_eq!(handled, ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_stamped_with_our_group_id_are_skipped() {
    let topic = common::unique_name("loop");
    let group = common::unique_name("loop_group");
    harness::create_topic(&topic, 1).await;
    let ours = sender(&topic, &group).await;
    let other = sender(&topic, "another-service").await;
    ours.send(&topic, "from-ourselves", &json!({}))
        .await
        .expect("send");
    other
        .send(&topic, "from-elsewhere", &json!({}))
        .await
        .expect("send");
    ours.excise(&topic, "excise-from-ourselves")
        .await
        .expect("excise");
    // The consumer's own client stamps its group id too (the default source system).
    let client = ProsodyClient::from_options(ClientOptions {
        source_system: None,
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    client
        .send(&topic, "from-this-client", &json!({}))
        .await
        .expect("send");
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");
    kafka_read::until_committed(&group, &topic, &[4], Duration::from_secs(60)).await;
    client.shutdown().await.expect("shutdown");
    assert_eq!(script.handled_keys(), ["from-elsewhere"]);
}
