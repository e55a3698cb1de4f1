//! Quickstart on the embedded default: no external services.
//!
//! Starts librdkafka's in-process mock cluster, produces a few keyed JSON records and consumes
//! them back in a consumer group, printing each one. Run with `cargo run --example quickstart`.

use std::error::Error;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

const TOPIC: &str = "quickstart";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let cluster = MockCluster::new(1)?;
    cluster.create_topic(TOPIC, 2, 1)?;
    let bootstrap = cluster.bootstrap_servers();
    println!("mock Kafka cluster at {bootstrap}");

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let records = [
        ("customer-1", r#"{"type":"order.created","amount":10}"#),
        ("customer-2", r#"{"type":"order.created","amount":25}"#),
        ("customer-1", r#"{"type":"order.paid","amount":10}"#),
    ];
    for (key, payload) in records {
        producer
            .send(
                FutureRecord::to(TOPIC).key(key).payload(payload),
                Timeout::After(Duration::from_secs(5)),
            )
            .await
            .map_err(|(error, _)| error)?;
    }

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "quickstart")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[TOPIC])?;
    for _ in 0..records.len() {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv()).await??;
        let key = message.key().map(String::from_utf8_lossy).unwrap_or_default();
        let payload = message.payload().map(String::from_utf8_lossy).unwrap_or_default();
        println!(
            "received key={key} partition={} offset={} payload={payload}",
            message.partition(),
            message.offset()
        );
    }
    Ok(())
}
