//! Fair scheduling against a real broker: one key failing without end (retried forever in
//! pipeline mode) must not take throughput from the healthy keys. Prints both rates.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::time::Duration;

use common::harness;
use common::scripted::Script;
use prosody::ProsodyClient;
use prosody::config::ClientOptions;
use serde_json::json;

const HEALTHY_KEYS: usize = 40;
const PER_KEY: usize = 50;
const HANDLER_MS: u64 = 5;
const MAX_CONCURRENCY: usize = 4;

/// Healthy records per second, from the first healthy record handled to the last.
async fn healthy_rate(with_failing_key: bool) -> f64 {
    let topic = common::unique_name("fairness");
    let group = common::unique_name("fairness_group");
    harness::create_topic(&topic, 2).await;
    let sender = ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(&topic, &common::unique_name("fairness_sender"))
    })
    .await
    .expect("sender");
    if with_failing_key {
        sender
            .send(
                &topic,
                "failing",
                &json!({"fail": "always", "sleepMs": HANDLER_MS}),
            )
            .await
            .expect("send");
    }
    for index in 0..HEALTHY_KEYS * PER_KEY {
        let key = format!("healthy-{}", index % HEALTHY_KEYS);
        sender
            .send(&topic, &key, &json!({"sleepMs": HANDLER_MS}))
            .await
            .expect("send");
    }
    let client = ProsodyClient::from_options(ClientOptions {
        max_concurrency: Some(MAX_CONCURRENCY),
        retry_base_ms: Some(Duration::from_millis(1)),
        max_retry_delay_ms: Some(Duration::from_millis(HANDLER_MS)),
        shutdown_timeout_ms: Some(Duration::from_secs(2)),
        // The retry class of the fair scheduler is under test: retries in place, not deferred.
        defer_enabled: Some(false),
        ..harness::options(&topic, &group)
    })
    .await
    .expect("client");
    let script = Script::new();
    client.subscribe(script.handler()).await.expect("subscribe");
    script
        .wait_for(HEALTHY_KEYS * PER_KEY, Duration::from_secs(120))
        .await;
    client.shutdown().await.expect("shutdown");
    if with_failing_key {
        assert!(
            script.attempts("failing") > 10,
            "the failing key kept retrying"
        );
    }
    let successes = script.successes();
    let first = successes.first().expect("some").at;
    let last = successes.last().expect("some").at;
    #[allow(clippy::cast_precision_loss, reason = "a few thousand records")]
    let rate = (successes.len() - 1) as f64 / (last - first).as_secs_f64();
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuously_failing_key_leaves_healthy_throughput_within_30_percent() {
    let healthy_only = healthy_rate(false).await;
    let with_failure = healthy_rate(true).await;
    let ratio = with_failure / healthy_only;
    println!(
        "fairness: healthy keys {healthy_only:.0} records/s alone, {with_failure:.0} records/s \
         beside a key failing continuously (ratio {ratio:.2}, max concurrency {MAX_CONCURRENCY})"
    );
    assert!(
        ratio >= 0.7,
        "healthy throughput fell to {ratio:.2} of the no-failure run"
    );
}
