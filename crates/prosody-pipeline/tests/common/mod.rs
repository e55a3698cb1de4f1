//! Helpers shared by the integration tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

/// How long a test waits for a record it expects.
pub const RECEIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The real broker's address. Fails loudly when unset: these tests must never pass silently
/// without Kafka.
pub fn bootstrap_servers() -> String {
    match std::env::var("PROSODY_BOOTSTRAP_SERVERS") {
        Ok(servers) if !servers.trim().is_empty() => servers,
        _ => panic!(
            "PROSODY_BOOTSTRAP_SERVERS is not set: these tests need the real Kafka broker. Run \
             `scripts/services up kafka` and export the variable it prints \
             (export PROSODY_BOOTSTRAP_SERVERS=127.0.0.1:9092)"
        ),
    }
}

/// A topic name no other test (or earlier run) uses, so tests run in parallel.
pub fn unique_topic(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!(
        "prosody-it-{prefix}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Reads the first record of partition `partition` of `topic` with a plain rdkafka consumer.
pub async fn read_first(bootstrap_servers: &str, topic: &str, partition: i32) -> OwnedMessage {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers)
        .set("group.id", unique_topic("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer config is valid");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Beginning)
        .expect("valid partition");
    consumer.assign(&assignment).expect("assign");
    let message = tokio::time::timeout(RECEIVE_TIMEOUT, consumer.recv())
        .await
        .unwrap_or_else(|_| panic!("no record on {topic}/{partition} within {RECEIVE_TIMEOUT:?}"))
        .expect("consume");
    assert_eq!(message.topic(), topic);
    message.detach()
}
