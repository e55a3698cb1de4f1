//! Bad input against a real broker: records that cannot be decoded (not JSON, over 1 MiB,
//! empty key, key not UTF-8) never stop the consumer, are logged naming the problem, and are
//! routed by the mode's policy before their offsets commit.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::harness;
use common::kafka_read;
use common::scripted::Script;
use parking_lot::Mutex;
use prosody::ProsodyClient;
use prosody::config::{ClientOptions, Mode};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Room for the oversized record on the broker (the consumer's limit is 1 MiB).
const TOPIC_MAX_BYTES: &str = "4194304";
const OVERSIZED: usize = 1024 * 1024 + 1;

/// Everything logged in this test binary, so tests can check what the consumer said.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .init();
        logs
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn create_big_topic(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", common::bootstrap_servers())
        .create()
        .expect("admin");
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1))
        .set("max.message.bytes", TOPIC_MAX_BYTES);
    let results = admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create topics");
    for result in results {
        result.expect("topic created");
    }
}

/// Produces the four bad records and a good one, raw.
async fn produce_bad_records(topic: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", common::bootstrap_servers())
        .set("message.max.bytes", TOPIC_MAX_BYTES)
        .create()
        .expect("producer");
    let oversized = format!("\"{}\"", "x".repeat(OVERSIZED));
    let records: [(&[u8], &[u8]); 5] = [
        (b"not-json", b"{not json"),
        (b"too-big", oversized.as_bytes()),
        (b"", b"{}"),
        (&[0x66, 0xff, 0xfe], b"{}"),
        (b"good", br#"{"ok": true}"#),
    ];
    for (key, value) in records {
        producer
            .send(
                FutureRecord::to(topic).key(key).payload(value),
                Duration::from_secs(30),
            )
            .await
            .expect("produced");
    }
}

async fn run(mode: Mode) -> (String, Option<String>) {
    logs();
    let topic = common::unique_name("bad_input");
    let group = common::unique_name("bad_input_group");
    create_big_topic(&topic).await;
    let failure_topic = format!("{topic}_failures");
    create_big_topic(&failure_topic).await;
    produce_bad_records(&topic).await;
    let client = ProsodyClient::from_options(ClientOptions {
        mode: Some(mode),
        failure_topic: Some(failure_topic.clone()),
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");
    script.wait_for(1, Duration::from_secs(60)).await;
    kafka_read::until_committed(&group, &topic, &[5], Duration::from_secs(60)).await;
    assert_eq!(client.consumer_state(), prosody::ConsumerState::Running);
    client.shutdown().await.expect("shutdown");
    assert_eq!(script.handled_keys(), ["good"]);
    (topic, Some(failure_topic))
}

fn assert_logged(problems: &[&str]) {
    let logs = String::from_utf8_lossy(&logs().lock()).into_owned();
    for problem in problems {
        assert!(logs.contains(problem), "no log line names {problem:?}");
    }
}

const PROBLEMS: [&str; 4] = [
    "the value is not JSON",
    "over the limit of 1048576 bytes",
    "the key is empty",
    "the key is not valid UTF-8",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_routes_bad_records_to_the_failure_topic() {
    let (topic, failure_topic) = run(Mode::Pipeline).await;
    assert_logged(&PROBLEMS);
    let mut failures = kafka_read::read_all(&failure_topic.expect("set"), 1);
    // Records of different keys are routed concurrently: order them as they were consumed.
    failures.sort_by_key(|record| {
        record
            .header("prosody-original-offset")
            .parse::<i64>()
            .expect("offset")
    });
    assert_eq!(failures.len(), 4, "{failures:?}");
    let keys: Vec<Option<Vec<u8>>> = failures.iter().map(|record| record.key.clone()).collect();
    assert_eq!(
        keys,
        [
            Some(b"not-json".to_vec()),
            Some(b"too-big".to_vec()),
            Some(Vec::new()),
            Some(vec![0x66, 0xff, 0xfe]),
        ]
    );
    for (offset, (record, problem)) in failures.iter().zip(PROBLEMS).enumerate() {
        assert_eq!(record.header("prosody-original-topic"), topic);
        assert_eq!(record.header("prosody-original-offset"), offset.to_string());
        assert_eq!(record.header("prosody-attempts"), "0");
        let error = record.header("prosody-error");
        assert!(
            error.contains(problem) && error.contains(&format!("{topic}/0@{offset}")),
            "{error}"
        );
    }
    assert_eq!(failures[0].value.as_deref(), Some(&b"{not json"[..]));
    assert_eq!(
        failures[1].value.as_deref(),
        Some(&b""[..]),
        "the oversized value is not forwarded"
    );
    assert_eq!(failures[2].value.as_deref(), Some(&b"{}"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_logs_bad_records_and_commits() {
    let (_, failure_topic) = run(Mode::BestEffort).await;
    assert_logged(&PROBLEMS);
    assert_eq!(
        kafka_read::end_offsets(&failure_topic.expect("set"), 1),
        [0]
    );
}
