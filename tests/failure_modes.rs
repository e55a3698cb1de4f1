//! Failure handling per mode against a real broker: how often a handler is called, what
//! reaches the failure topic (with its headers) and what is committed.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::time::Duration;

use common::harness;
use common::kafka_read::{self, Record};
use common::scripted::Script;
use prosody::ProsodyClient;
use prosody::config::{ClientOptions, Mode};
use serde_json::json;

/// Records: `t2` fails transiently twice then succeeds, `p` fails permanently, `t5` fails
/// transiently five times then succeeds, `ok` succeeds.
const RECORDS: [&str; 4] = ["t2", "p", "t5", "ok"];

struct Run {
    script: std::sync::Arc<Script>,
    topic: String,
    failure_topic: Option<String>,
}

async fn run(mode: Mode, max_retries: u32, with_failure_topic: bool) -> Run {
    let topic = common::unique_name(&format!("modes_{mode}").replace('-', "_"));
    let group = common::unique_name("modes_group");
    harness::create_topic(&topic, 1).await;
    let failure_topic = with_failure_topic.then(|| format!("{topic}_failures"));
    if let Some(failures) = &failure_topic {
        harness::create_topic(failures, 1).await;
    }
    let client = ProsodyClient::from_options(ClientOptions {
        mode: Some(mode),
        failure_topic: failure_topic.clone(),
        max_retries: Some(max_retries),
        retry_base_ms: Some(Duration::from_millis(1)),
        max_retry_delay_ms: Some(Duration::from_millis(10)),
        // In-process retry is what these suites count; deferred retry has its own suite
        // (tests/defer.rs) and would commit before the retries are done.
        defer_enabled: Some(false),
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    // A separate sender: the consumer skips what its own group produced.
    let sender = ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(&topic, &common::unique_name("modes_sender"))
    })
    .await
    .expect("sender");
    for key in RECORDS {
        let payload = match key {
            "t2" => json!({"fail": "transient", "times": 2}),
            "p" => json!({"fail": "permanent"}),
            "t5" => json!({"fail": "transient", "times": 5}),
            _ => json!({}),
        };
        sender.send(&topic, key, &payload).await.expect("send");
    }
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");
    kafka_read::until_committed(&group, &topic, &[4], Duration::from_secs(60)).await;
    client.shutdown().await.expect("shutdown");
    Run {
        script,
        topic,
        failure_topic,
    }
}

/// Keys handled successfully, sorted: keys run concurrently.
fn handled(run: &Run) -> Vec<String> {
    let mut keys = run.script.handled_keys();
    keys.sort();
    keys
}

/// The failure topic's records by original offset: different keys fail concurrently.
fn failures(run: &Run) -> Vec<Record> {
    let mut records = kafka_read::read_all(run.failure_topic.as_deref().expect("failure topic"), 1);
    records.sort_by_key(|record| record.header("prosody-original-offset").to_owned());
    records
}

fn assert_failure_record(run: &Run, record: &Record, key: &str, offset: i64, attempts: u32) {
    assert_eq!(record.key.as_deref(), Some(key.as_bytes()));
    let expected_payload = match key {
        "p" => json!({"fail": "permanent"}),
        _ => json!({"fail": "transient", "times": 5}),
    };
    assert_eq!(record.json(), expected_payload, "payload kept");
    assert_eq!(record.header("prosody-original-topic"), run.topic);
    assert_eq!(record.header("prosody-original-partition"), "0");
    assert_eq!(record.header("prosody-original-offset"), offset.to_string());
    assert_eq!(record.header("prosody-attempts"), attempts.to_string());
    let error = record.header("prosody-error");
    let expected_error = if key == "p" {
        "permanent handler error: scripted permanent failure".to_owned()
    } else {
        format!("transient handler error: scripted transient failure {attempts}")
    };
    assert_eq!(error, expected_error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_retries_transient_until_success_and_sends_permanent_to_the_failure_topic() {
    let run = run(Mode::Pipeline, 3, true).await;
    let attempts: Vec<u32> = RECORDS.iter().map(|key| run.script.attempts(key)).collect();
    assert_eq!(attempts, [3, 1, 6, 1], "t2, p, t5, ok");
    assert_eq!(handled(&run), ["ok", "t2", "t5"]);
    let failures = failures(&run);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_failure_record(&run, &failures[0], "p", 1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_without_failure_topic_logs_permanent_failures_and_commits() {
    let run = run(Mode::Pipeline, 3, false).await;
    let attempts: Vec<u32> = RECORDS.iter().map(|key| run.script.attempts(key)).collect();
    assert_eq!(attempts, [3, 1, 6, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_latency_gives_up_after_max_retries_to_the_failure_topic() {
    let run = run(Mode::LowLatency, 2, true).await;
    let attempts: Vec<u32> = RECORDS.iter().map(|key| run.script.attempts(key)).collect();
    assert_eq!(attempts, [3, 1, 3, 1], "t5 gets 1 + 2 retries");
    assert_eq!(handled(&run), ["ok", "t2"]);
    let failures = failures(&run);
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert_failure_record(&run, &failures[0], "p", 1, 1);
    assert_failure_record(&run, &failures[1], "t5", 2, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_never_retries_and_writes_nothing() {
    let run = run(Mode::BestEffort, 3, true).await;
    let attempts: Vec<u32> = RECORDS.iter().map(|key| run.script.attempts(key)).collect();
    assert_eq!(attempts, [1, 1, 1, 1]);
    assert_eq!(handled(&run), ["ok"]);
    assert_eq!(
        kafka_read::end_offsets(run.failure_topic.as_deref().expect("set"), 1),
        [0],
        "best-effort logs failures, even with a failure topic configured"
    );
}

/// Creates `topic` (1 partition) that accepts records of at most `max_bytes`.
async fn create_small_record_topic(topic: &str, max_bytes: usize) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", common::bootstrap_servers())
        .create()
        .expect("admin");
    let max_bytes = max_bytes.to_string();
    let new_topic =
        NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("max.message.bytes", &max_bytes);
    let results = admin
        .create_topics([&new_topic], &AdminOptions::new())
        .await
        .expect("create topics");
    for result in results {
        result.expect("topic created");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_topic_that_refuses_records_holds_the_offset_until_it_takes_them() {
    let topic = common::unique_name("modes_refused");
    let group = common::unique_name("modes_group");
    harness::create_topic(&topic, 1).await;
    // Not created yet: the broker does not auto-create topics.
    let failure_topic = format!("{topic}_failures");
    let client = ProsodyClient::from_options(ClientOptions {
        failure_topic: Some(failure_topic.clone()),
        defer_enabled: Some(false),
        send_timeout_ms: Some(Duration::from_secs(2)),
        retry_base_ms: Some(Duration::from_millis(10)),
        max_retry_delay_ms: Some(Duration::from_millis(200)),
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    let sender = ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(&topic, &common::unique_name("modes_sender"))
    })
    .await
    .expect("sender");
    // Too large for the failure topic created below (2 KiB against 1 KiB).
    let big = json!({"fail": "permanent", "padding": "x".repeat(2048)});
    sender.send(&topic, "p", &big).await.expect("send");
    sender.send(&topic, "ok", &json!({})).await.expect("send");
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");

    // `ok` is handled, but `p` has no failure record yet, so nothing commits past it.
    script.wait_for(1, Duration::from_secs(60)).await;
    assert_eq!(script.handled_keys(), ["ok"]);
    // Absence cannot be awaited: give the 100 ms commit interval ten turns to go wrong.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        kafka_read::committed(&group, &topic, 1),
        [0],
        "nothing past p"
    );
    assert_eq!(
        script.attempts("p"),
        1,
        "a permanent failure is not retried"
    );

    // The failure topic appears, refuses the 2 KiB value, takes the record without it.
    create_small_record_topic(&failure_topic, 1024).await;
    kafka_read::until_committed(&group, &topic, &[2], Duration::from_secs(60)).await;
    let records = kafka_read::read_all(&failure_topic, 1);
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record.key.as_deref(), Some(b"p".as_slice()));
    assert_eq!(
        record.value.as_deref(),
        Some(b"".as_slice()),
        "value left out, not null"
    );
    assert_eq!(record.header("prosody-original-offset"), "0");
    assert_eq!(record.header("prosody-original-topic"), topic);
    assert!(
        record.header("prosody-value-omitted").contains("too large")
            || record.header("prosody-value-omitted").contains("TooLarge"),
        "{record:?}"
    );
    client.shutdown().await.expect("shutdown");
    sender.shutdown().await.expect("shutdown");
}
