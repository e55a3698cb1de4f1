//! Quickstart on the embedded default: no external services.
//!
//! `mock: true` starts librdkafka's in-process mock Kafka cluster and keeps storage in memory (mock mode creates the subscribed topic). The client subscribes a
//! handler, sends a few keyed JSON messages and an excise record, and prints what the handler
//! receives: each key's events in order, different keys concurrently. Run with
//! `cargo run --example quickstart`.

use std::error::Error;
use std::time::Duration;

use async_trait::async_trait;
use prosody::api::{EventContext, EventHandler, ExciseMessage, HandlerError, Message, Timer};
use prosody::config::ProbePort;
use prosody::{ClientOptions, ProsodyClient};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const TOPIC: &str = "quickstart";

/// Prints every event and reports it on a channel so `main` knows when all arrived.
struct PrintingHandler {
    received: mpsc::UnboundedSender<String>,
}

#[async_trait]
impl EventHandler for PrintingHandler {
    type Error = HandlerError;

    async fn on_message(
        &self,
        _: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let line = format!(
            "message key={} partition={} offset={} payload={}",
            message.key, message.partition, message.offset, message.payload
        );
        println!("{line}");
        self.received.send(line).map_err(HandlerError::permanent)?;
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        message: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        let line = format!("excise key={} offset={}", message.key, message.offset);
        println!("{line}");
        self.received.send(line).map_err(HandlerError::permanent)?;
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, timer: &Timer) -> Result<(), HandlerError> {
        println!("timer key={} time={}", timer.key, timer.time);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let client = ProsodyClient::from_options(ClientOptions {
        mock: Some(true),
        group_id: Some("quickstart".to_owned()),
        // This client consumes what it sends itself. A consumer skips records stamped with its
        // own group as their source system (loop prevention), and the stamp defaults to the
        // group id, so a loopback needs a source system that differs from the group id.
        source_system: Some("quickstart-producer".to_owned()),
        subscribed_topics: Some(vec![TOPIC.to_owned()]),
        probe_port: Some(ProbePort::Disabled),
        ..ClientOptions::default()
    })
    .await?;
    println!("mock Kafka cluster at {}", client.bootstrap_servers());

    let (received, mut events) = mpsc::unbounded_channel();
    client.subscribe(PrintingHandler { received }).await?;

    client
        .send(
            TOPIC,
            "customer-1",
            &json!({"type": "order.created", "amount": 10}),
        )
        .await?;
    client
        .send(
            TOPIC,
            "customer-2",
            &json!({"type": "order.created", "amount": 25}),
        )
        .await?;
    client
        .send(
            TOPIC,
            "customer-1",
            &json!({"type": "order.paid", "amount": 10}),
        )
        .await?;
    client.excise(TOPIC, "customer-2").await?;

    for _ in 0..4 {
        tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await?
            .ok_or("handler stopped")?;
    }
    client.shutdown().await?;
    println!("done: 4 events handled, client shut down");
    Ok(())
}
