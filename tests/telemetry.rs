//! Telemetry against a real broker: lifecycle events on the telemetry topic, and the handler
//! span continuing the trace context sent in the record's headers (checked with an in-memory
//! span exporter).

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::harness;
use common::kafka_read;
use common::scripted::Script;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use prosody::ProsodyClient;
use prosody::SendOptions;
use prosody::config::{ClientOptions, SpanRelation, StorageBackend};
use prosody::pipeline::kafka::TraceContext;
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_ID: &str = "00f067aa0ba902b7";

/// The spans of this test binary. Installed before any client exists, so the client keeps
/// this subscriber instead of installing its own.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let subscriber = tracing_subscriber::registry()
                .with(tracing_subscriber::EnvFilter::new("info"))
                .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
            tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
            (exporter, provider)
        })
        .0
}

async fn sender(topic: &str) -> ProsodyClient {
    ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(topic, &common::unique_name("telemetry_sender"))
    })
    .await
    .expect("sender")
}

fn handler_span(key: &str) -> SpanData {
    let spans = exporter().get_finished_spans().expect("spans");
    spans
        .into_iter()
        .find(|span| {
            span.name == "prosody.handle"
                && span.attributes.iter().any(|attribute| {
                    attribute.key.as_str() == "key" && attribute.value.as_str() == key
                })
        })
        .unwrap_or_else(|| panic!("no handler span for {key}"))
}

/// Sends one record with a known trace context and returns its handler span.
async fn span_of_traced_record(relation: SpanRelation) -> SpanData {
    exporter();
    let topic = common::unique_name("traced");
    let group = common::unique_name("traced_group");
    harness::create_topic(&topic, 1).await;
    let key = common::unique_name("traced_key");
    sender(&topic)
        .await
        .send_with(
            &topic,
            &key,
            &json!({}),
            SendOptions::default()
                .with_trace_context(TraceContext::new(format!("00-{TRACE_ID}-{SPAN_ID}-01"))),
        )
        .await
        .expect("send");
    let client = ProsodyClient::from_options(ClientOptions {
        message_spans: Some(relation),
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    client
        .subscribe(Script::new().handler())
        .await
        .expect("subscribe");
    // Committed only after the dispatch, and so the span, ended.
    kafka_read::until_committed(&group, &topic, &[1], Duration::from_secs(60)).await;
    client.shutdown().await.expect("shutdown");
    handler_span(&key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_context_in_headers_is_the_parent_of_the_handler_span() {
    let span = span_of_traced_record(SpanRelation::Child).await;
    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    assert_eq!(span.parent_span_id, SpanId::from_hex(SPAN_ID).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_from_starts_a_new_trace_linked_to_the_producer() {
    let span = span_of_traced_record(SpanRelation::FollowsFrom).await;
    assert_ne!(
        span.span_context.trace_id(),
        TraceId::from_hex(TRACE_ID).unwrap()
    );
    let linked: Vec<_> = span
        .links
        .iter()
        .map(|link| (link.span_context.trace_id(), link.span_context.span_id()))
        .collect();
    assert_eq!(
        linked,
        [(
            TraceId::from_hex(TRACE_ID).unwrap(),
            SpanId::from_hex(SPAN_ID).unwrap()
        )]
    );
}

/// The events on `telemetry_topic` (one partition) once `expected` are there, flushing the
/// client's until they are (at most 30 s): a handler counts itself done before it returns and
/// the layer emits `succeeded`, so one flush may overtake the last events.
async fn lifecycle_events(
    client: &ProsodyClient,
    telemetry_topic: &str,
    expected: usize,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let expected = vec![i64::try_from(expected).unwrap()];
    while kafka_read::end_offsets(telemetry_topic, 1) < expected && Instant::now() < deadline {
        client.flush_telemetry().await;
    }
    kafka_read::read_all(telemetry_topic, 1)
        .iter()
        .map(kafka_read::Record::json)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_events_reach_the_telemetry_topic() {
    exporter();
    let topic = common::unique_name("lifecycle");
    let group = common::unique_name("lifecycle_group");
    let telemetry_topic = format!("{topic}_telemetry");
    harness::create_topic(&topic, 1).await;
    harness::create_topic(&telemetry_topic, 1).await;
    let sender = sender(&topic).await;
    sender
        .send(&topic, "flaky", &json!({"fail": "transient", "times": 1}))
        .await
        .expect("send");
    let began_ms = wall_clock_ms();
    // Telemetry is off in mock mode: a real (non-mock) client with the memory backend.
    let client = ProsodyClient::from_options(ClientOptions {
        mock: Some(false),
        storage_backend: Some(StorageBackend::Memory),
        telemetry_enabled: Some(true),
        telemetry_topic: Some(telemetry_topic.clone()),
        retry_base_ms: Some(Duration::from_millis(1)),
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");
    script.wait_for(1, Duration::from_secs(60)).await;
    let events = lifecycle_events(&client, &telemetry_topic, 4).await;
    client.shutdown().await.expect("shutdown");
    let stages: Vec<(&str, u64)> = events
        .iter()
        .map(|event| {
            (
                event["stage"].as_str().unwrap(),
                event["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        stages,
        [
            ("dispatched", 1),
            ("failed", 1),
            ("dispatched", 2),
            ("succeeded", 2)
        ]
    );
    for event in &events {
        assert_eq!(event["event"], "message");
        assert_eq!(event["key"], "flaky");
        assert_eq!(event["topic"], topic.as_str());
        assert_eq!(event["partition"], 0);
        assert_eq!(event["offset"], 0);
        assert_eq!(event["groupId"], group.as_str());
    }
    assert!(events[1]["durationMs"].as_f64().unwrap() >= 0.0);
    assert_eq!(
        events[1]["error"],
        "transient handler error: scripted transient failure 1"
    );
    assert!(events[3]["durationMs"].is_number());
    assert!(events[0].get("durationMs").is_none());
    // Wall-clock milliseconds of when each stage was reached, in order, within the test.
    let ended_ms = wall_clock_ms();
    let stamps: Vec<u64> = events
        .iter()
        .map(|event| event["timestampMs"].as_u64().unwrap())
        .collect();
    assert!(stamps.is_sorted(), "{stamps:?}");
    assert!(
        stamps
            .iter()
            .all(|stamp| (began_ms..=ended_ms).contains(stamp)),
        "{stamps:?} outside {began_ms}..={ended_ms}"
    );
}

/// Milliseconds since the Unix epoch, now.
fn wall_clock_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// With room in the queues nothing is dropped: every record of a burst has its two events on
/// the topic, dispatched before succeeded, although handlers that suspend may resume on
/// another worker than the one that queued the first event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_within_the_queues_room_keeps_every_event_in_order() {
    const RECORDS: usize = 2_000;
    let topic = common::unique_name("burst");
    let group = common::unique_name("burst_group");
    let telemetry_topic = format!("{topic}_telemetry");
    harness::create_topic(&topic, 4).await;
    harness::create_topic(&telemetry_topic, 1).await;
    harness::produce(&sender(&topic).await, &topic, RECORDS, 50).await;
    let client = ProsodyClient::from_options(ClientOptions {
        telemetry_enabled: Some(true),
        telemetry_topic: Some(telemetry_topic.clone()),
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    let recorder = harness::Recorder::new();
    // Up to a millisecond's sleep per record: handlers suspend and resume.
    let behaviour = harness::Behaviour {
        max_sleep_ms: 1,
        gate: None,
    };
    client
        .subscribe(recorder.handler("burst", behaviour))
        .await
        .expect("subscribe");
    recorder.wait_for(RECORDS, Duration::from_secs(60)).await;
    let events = lifecycle_events(&client, &telemetry_topic, 2 * RECORDS).await;
    client.shutdown().await.expect("shutdown");
    assert_eq!(events.len(), 2 * RECORDS);
    let mut stages: HashMap<(u64, u64), Vec<String>> = HashMap::new();
    for event in &events {
        let record = (
            event["partition"].as_u64().unwrap(),
            event["offset"].as_u64().unwrap(),
        );
        stages
            .entry(record)
            .or_default()
            .push(event["stage"].as_str().unwrap().to_owned());
    }
    assert_eq!(stages.len(), RECORDS);
    for (record, seen) in &stages {
        assert_eq!(seen, &["dispatched", "succeeded"], "record {record:?}");
    }
}
