//! Smoke test of the real Kafka broker: topics through the admin API, a thousand records
//! produced, consumed in a group, committed, and resumed after a consumer restart.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio::time::timeout;

const RECORDS: usize = 1_000;
const FIRST_BATCH: usize = 400;

fn consumer(group: &str) -> StreamConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", common::bootstrap_servers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("consumer")
}

/// Receives `count` records and returns their (partition, offset, key) triples.
async fn receive(consumer: &StreamConsumer, count: usize) -> Vec<(i32, i64, String)> {
    let mut seen = Vec::with_capacity(count);
    while seen.len() < count {
        let message = timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("a record within 30 s")
            .expect("no consumer error");
        let key = String::from_utf8(message.key().expect("keyed record").to_vec()).expect("utf-8");
        seen.push((message.partition(), message.offset(), key));
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn produce_consume_commit_and_resume_after_restart() {
    let topic = common::unique_name("smoke");
    let group = common::unique_name("smoke_group");

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", common::bootstrap_servers())
        .create()
        .expect("admin client");
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics request");
    assert!(
        created.iter().all(Result::is_ok),
        "topic creation failed: {created:?}"
    );

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", common::bootstrap_servers())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for index in 0..RECORDS {
        let key = format!("key-{}", index % 17);
        let payload = format!(r#"{{"index":{index}}}"#);
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&payload),
                Timeout::After(Duration::from_secs(10)),
            )
            .await
            .map_err(|(error, _)| error)
            .expect("delivery");
    }

    // First consumer: read part of the stream, commit exactly what it read, leave.
    let first = consumer(&group);
    first.subscribe(&[&topic]).expect("subscribe");
    let batch = receive(&first, FIRST_BATCH).await;
    assert_eq!(
        batch
            .iter()
            .map(|(_, offset, _)| *offset)
            .collect::<Vec<_>>(),
        (0..i64::try_from(FIRST_BATCH).unwrap()).collect::<Vec<_>>(),
        "a single partition delivers offsets in order"
    );
    let mut position = rdkafka::TopicPartitionList::new();
    position
        .add_partition_offset(
            &topic,
            0,
            rdkafka::Offset::Offset(i64::try_from(FIRST_BATCH).unwrap()),
        )
        .expect("offset");
    first.commit(&position, CommitMode::Sync).expect("commit");
    drop(first);

    // Second consumer in the same group resumes right after the committed offset.
    let second = consumer(&group);
    second.subscribe(&[&topic]).expect("subscribe");
    let rest = receive(&second, RECORDS - FIRST_BATCH).await;
    let offsets: BTreeSet<i64> = rest.iter().map(|(_, offset, _)| *offset).collect();
    assert_eq!(
        offsets.first().copied(),
        Some(i64::try_from(FIRST_BATCH).unwrap()),
        "resumed at the committed offset, not before it"
    );
    assert_eq!(
        offsets.len(),
        RECORDS - FIRST_BATCH,
        "no record twice, none missing"
    );
    assert_eq!(
        offsets.last().copied(),
        Some(i64::try_from(RECORDS).unwrap() - 1)
    );

    admin
        .delete_topics(&[&topic], &AdminOptions::new())
        .await
        .expect("delete topic");
}
