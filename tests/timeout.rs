//! Handler timeout and shutdown against a real broker: a handler past `timeoutMs` sees its
//! cancellation fire promptly, and a handler that ignores cancellation cannot hold shutdown
//! past its budget.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::harness;
use parking_lot::Mutex;
use prosody::ProsodyClient;
use prosody::api::{EventContext, EventHandler, ExciseMessage, HandlerError, Message, Timer};
use prosody::config::ClientOptions;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Waits for cancellation (or ignores it) and reports when the handler started and when it
/// observed the cancellation.
struct Sleeper {
    ignore_cancellation: bool,
    observed: mpsc::UnboundedSender<(Instant, Instant)>,
    started: Arc<tokio::sync::Notify>,
    attempts: Arc<Mutex<u32>>,
}

#[async_trait]
impl EventHandler for Sleeper {
    type Error = HandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        _: &Message,
    ) -> Result<Value, HandlerError> {
        let started = Instant::now();
        *self.attempts.lock() += 1;
        self.started.notify_one();
        if self.ignore_cancellation {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            return Ok(Value::Null);
        }
        context.cancelled().await;
        let _ = self.observed.send((started, Instant::now()));
        // Done: a timed-out handler that finishes successfully is not retried.
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        _: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_timeout_observes_cancellation_within_100_ms() {
    const TIMEOUT: Duration = Duration::from_millis(300);
    const RECORDS: usize = 5;
    let topic = common::unique_name("timeout");
    harness::create_topic(&topic, 1).await;
    let client = ProsodyClient::from_options(ClientOptions {
        timeout_ms: Some(TIMEOUT),
        ..harness::options(&topic, &common::unique_name("timeout_group"))
    })
    .await
    .expect("client");
    let sender = ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(&topic, &common::unique_name("timeout_sender"))
    })
    .await
    .expect("sender");
    for index in 0..RECORDS {
        sender
            .send(&topic, &format!("k{index}"), &json!({}))
            .await
            .expect("send");
    }
    let (observed, mut observations) = mpsc::unbounded_channel();
    client
        .subscribe(Sleeper {
            ignore_cancellation: false,
            observed,
            started: Arc::default(),
            attempts: Arc::default(),
        })
        .await
        .expect("subscribe");
    let mut latencies = Vec::new();
    for _ in 0..RECORDS {
        let (started, cancelled) =
            tokio::time::timeout(Duration::from_secs(60), observations.recv())
                .await
                .expect("a handler was cancelled")
                .expect("open");
        let ran = cancelled.duration_since(started);
        assert!(ran >= TIMEOUT, "cancelled early, after {ran:?}");
        latencies.push(ran.saturating_sub(TIMEOUT));
    }
    client.shutdown().await.expect("shutdown");
    let worst = latencies.iter().max().copied().unwrap_or_default();
    println!("timeout: cancellation observed {latencies:?} after the deadline (worst {worst:?})");
    assert!(
        worst < Duration::from_millis(100),
        "worst latency {worst:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_within_budget_when_a_handler_ignores_cancellation() {
    const BUDGET: Duration = Duration::from_secs(2);
    let topic = common::unique_name("stubborn");
    harness::create_topic(&topic, 1).await;
    let client = ProsodyClient::from_options(ClientOptions {
        shutdown_timeout_ms: Some(BUDGET),
        ..harness::options(&topic, &common::unique_name("stubborn_group"))
    })
    .await
    .expect("client");
    let sender = ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(&topic, &common::unique_name("stubborn_sender"))
    })
    .await
    .expect("sender");
    sender.send(&topic, "k", &json!({})).await.expect("send");
    let started = Arc::new(tokio::sync::Notify::new());
    let (observed, _observations) = mpsc::unbounded_channel();
    client
        .subscribe(Sleeper {
            ignore_cancellation: true,
            observed,
            started: started.clone(),
            attempts: Arc::default(),
        })
        .await
        .expect("subscribe");
    tokio::time::timeout(Duration::from_secs(60), started.notified())
        .await
        .expect("the handler started");
    let shutting_down = Instant::now();
    client.shutdown().await.expect("shutdown");
    let took = shutting_down.elapsed();
    println!("shutdown with a handler ignoring cancellation: {took:?} (budget {BUDGET:?})");
    assert!(
        took < BUDGET + Duration::from_secs(1),
        "shutdown took {took:?}"
    );
}
