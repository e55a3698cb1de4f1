//! Producer and admin client against the real Kafka broker (`scripts/services up kafka`).

// Test helpers state their expectations with expect, like the #[test] functions do.
#![allow(clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use futures::FutureExt as _;
use prosody_api::{ClassifyError, Key, Topic};
use prosody_pipeline::Event;
use prosody_pipeline::kafka::{
    AdminClient, AdminError, DecodeLimits, Producer, ProducerConfig, ProducerError, SendOptions,
    TraceContext, decode,
};
use rdkafka::Message as _;
use rdkafka::message::Headers as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use common::{bootstrap_servers, read_first, unique_topic};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn producer(bootstrap: &str, send_timeout: Duration) -> Producer {
    let mut config = ProducerConfig::new(bootstrap, "it-source");
    config.send_timeout = send_timeout;
    Producer::new(&config).expect("producer config is valid")
}

async fn fresh_topic(admin: &AdminClient, prefix: &str) -> String {
    let topic = unique_topic(prefix);
    admin
        .create_topic(&topic, 1, 1)
        .await
        .expect("create topic");
    topic
}

fn header<'a>(message: &'a rdkafka::message::OwnedMessage, name: &str) -> Option<&'a [u8]> {
    message
        .headers()?
        .iter()
        .find(|header| header.key == name)
        .and_then(|header| header.value)
}

#[tokio::test]
async fn send_round_trips_json_with_headers() {
    let bootstrap = bootstrap_servers();
    let admin = AdminClient::new(&bootstrap).expect("admin");
    let topic = fresh_topic(&admin, "send").await;
    let producer = producer(&bootstrap, Duration::from_secs(10));
    let payload = json!({"type": "order.created", "id": "o-1", "amount": 12.5});

    let options = SendOptions::default().with_trace_context(TraceContext::new(TRACEPARENT));
    let delivery = producer
        .send_with(&topic, "customer-1", &payload, options)
        .await
        .expect("send");

    let record = read_first(&bootstrap, &topic, delivery.partition.0).await;
    assert_eq!(record.offset(), delivery.offset.0);
    assert_eq!(record.key(), Some(&b"customer-1"[..]));
    assert_eq!(header(&record, "source-system"), Some(&b"it-source"[..]));
    assert_eq!(header(&record, "traceparent"), Some(TRACEPARENT.as_bytes()));
    let decoded = decode(&record, &DecodeLimits::default()).expect("decodes");
    let Event::Message(message) = decoded else {
        panic!("expected a message, got {decoded:?}");
    };
    assert_eq!(message.topic, Topic::from(topic.as_str()));
    assert_eq!(message.key, Key::from("customer-1"));
    assert_eq!(message.payload, payload);
    assert_eq!(message.headers.source_system(), Some("it-source"));
    assert_eq!(message.headers.traceparent(), Some(TRACEPARENT));

    admin.delete_topic(&topic).await.expect("delete topic");
}

#[tokio::test]
async fn excise_produces_a_null_value_with_headers() {
    let bootstrap = bootstrap_servers();
    let admin = AdminClient::new(&bootstrap).expect("admin");
    let topic = fresh_topic(&admin, "excise").await;
    let producer = producer(&bootstrap, Duration::from_secs(10));

    let delivery = producer.excise(&topic, "customer-2").await.expect("excise");

    let record = read_first(&bootstrap, &topic, delivery.partition.0).await;
    assert_eq!(record.key(), Some(&b"customer-2"[..]));
    assert_eq!(record.payload(), None, "a tombstone has a null value");
    assert_eq!(header(&record, "source-system"), Some(&b"it-source"[..]));
    let decoded = decode(&record, &DecodeLimits::default()).expect("decodes");
    assert!(
        matches!(&decoded, Event::Excise(excise) if excise.key == Key::from("customer-2")),
        "{decoded:?}"
    );

    admin.delete_topic(&topic).await.expect("delete topic");
}

#[tokio::test]
async fn send_to_missing_topic_fails_within_send_timeout() {
    let bootstrap = bootstrap_servers();
    let send_timeout = Duration::from_millis(1500);
    let producer = producer(&bootstrap, send_timeout);
    let topic = unique_topic("missing");

    let started = Instant::now();
    let error = producer
        .send(&topic, "k", &json!({"n": 1}))
        .await
        .expect_err("the topic does not exist and auto-creation is off");
    let elapsed = started.elapsed();

    assert!(
        elapsed < send_timeout + Duration::from_millis(500),
        "took {elapsed:?} with a send timeout of {send_timeout:?}"
    );
    let text = error.to_string();
    assert!(text.contains(&topic), "error names the topic: {text}");
    assert!(
        matches!(
            error,
            ProducerError::TimedOut {
                timeout_ms: 1500,
                ..
            }
        ),
        "unexpected error: {text}"
    );
    assert!(text.ends_with("timed out after 1500 ms"), "{text}");
    assert!(!error.is_permanent());
}

#[tokio::test]
async fn cancelling_a_pending_send_returns_cancelled_promptly() {
    let bootstrap = bootstrap_servers();
    // The send would wait this long for a topic that never appears.
    let producer = producer(&bootstrap, Duration::from_secs(30));
    let topic = unique_topic("cancel");
    let token = CancellationToken::new();
    let payload = json!({"n": 1});

    let send = producer.send_with(
        &topic,
        "k",
        &payload,
        SendOptions::default().with_cancel(token.clone()),
    );
    let mut send = std::pin::pin!(send);
    assert!(
        send.as_mut().now_or_never().is_none(),
        "the send is pending before cancellation"
    );

    let cancelled_at = Instant::now();
    token.cancel();
    let result = tokio::time::timeout(Duration::from_secs(2), send)
        .await
        .expect("cancellation is prompt");
    let elapsed = cancelled_at.elapsed();

    let error = result.expect_err("cancelled");
    assert!(matches!(error, ProducerError::Cancelled { .. }), "{error}");
    assert!(error.to_string().contains(&topic), "{error}");
    assert!(elapsed < Duration::from_millis(500), "took {elapsed:?}");
}

#[tokio::test]
async fn duplicate_create_topic_is_topic_already_exists() {
    let bootstrap = bootstrap_servers();
    let admin = AdminClient::new(&bootstrap).expect("admin");
    let topic = fresh_topic(&admin, "dup").await;

    let error = admin
        .create_topic(&topic, 1, 1)
        .await
        .expect_err("second create fails");
    assert!(
        matches!(&error, AdminError::TopicAlreadyExists { topic: named } if *named == topic),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        format!("cannot create topic {topic:?}: it already exists")
    );

    admin.delete_topic(&topic).await.expect("delete topic");
    let error = admin
        .delete_topic(&topic)
        .await
        .expect_err("already deleted");
    assert!(matches!(error, AdminError::TopicNotFound { .. }), "{error}");
}

#[tokio::test]
async fn create_topic_with_invalid_partition_count_is_rejected() {
    let bootstrap = bootstrap_servers();
    let admin = AdminClient::new(&bootstrap).expect("admin");
    let topic = unique_topic("invalid");

    let error = admin
        .create_topic(&topic, 0, 1)
        .await
        .expect_err("zero partitions");
    assert!(matches!(error, AdminError::Rejected { .. }), "{error}");
    assert!(error.to_string().contains(&topic), "{error}");
    assert!(error.is_permanent());
}

#[tokio::test]
async fn sends_keep_per_partition_order() {
    let bootstrap = bootstrap_servers();
    let admin = AdminClient::new(&bootstrap).expect("admin");
    let topic = fresh_topic(&admin, "order").await;
    let producer = producer(&bootstrap, Duration::from_secs(10));

    let mut offsets = Vec::new();
    for n in 0..5 {
        let delivery = producer
            .send(&topic, "same-key", &json!({"n": n}))
            .await
            .expect("send");
        offsets.push(delivery.offset.0);
    }
    assert!(
        offsets.windows(2).all(|pair| pair[0] < pair[1]),
        "{offsets:?}"
    );

    admin.delete_topic(&topic).await.expect("delete topic");
}
