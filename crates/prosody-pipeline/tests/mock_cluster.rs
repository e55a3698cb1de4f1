//! The in-process mock cluster: produce and consume with no external services.

// Test helpers state their expectations with expect, like the #[test] functions do.
#![allow(clippy::expect_used)]

mod common;

use std::time::Duration;

use prosody_api::Key;
use prosody_pipeline::Event;
use prosody_pipeline::kafka::{DecodeLimits, MockKafka, Producer, ProducerConfig, decode};
use serde_json::json;

use common::read_first;

#[tokio::test]
async fn mock_cluster_produces_and_consumes() {
    let mock = MockKafka::start(1).expect("mock cluster");
    mock.create_topic("mock-orders", 2).expect("topic");
    let mut config = ProducerConfig::new(mock.bootstrap_servers(), "mock-source");
    config.send_timeout = Duration::from_secs(10);
    let producer = Producer::new(&config).expect("producer");

    let payload = json!({"type": "order.created", "n": 7});
    let delivery = producer
        .send("mock-orders", "k-mock", &payload)
        .await
        .expect("send to mock");

    let record = read_first(
        mock.bootstrap_servers(),
        "mock-orders",
        delivery.partition.0,
    )
    .await;
    let decoded = decode(&record, &DecodeLimits::default()).expect("decodes");
    let Event::Message(message) = decoded else {
        panic!("expected a message, got {decoded:?}");
    };
    assert_eq!(message.key, Key::from("k-mock"));
    assert_eq!(message.payload, payload);
    assert_eq!(message.headers.source_system(), Some("mock-source"));

    // Clients go before the cluster they use.
    drop(producer);
    drop(mock);
}
