//! Mock-mode drain before shutdown.
//!
//! In mock mode the Kafka cluster lives inside the client and disappears with it, so records the
//! client sent to its own subscribed topics but had not consumed yet would simply be lost at
//! shutdown. The README's Quick Start (send, then shut down at once) relies on them being
//! handled. So, in mock mode only, shutdown first waits until the consumer group's committed
//! offsets reach the high watermark of every partition of the subscribed topics (filtered and
//! skipped records are committed too), bounded by [`MAX_DRAIN`] and `shutdownTimeoutMs`.
//! With real Kafka nothing is lost (another consumer or the next start picks the records up),
//! so shutdown does not wait.
//!
//! This is client lifecycle behaviour and belongs in the facade's `ProsodyClient::shutdown`;
//! it lives here until the facade adopts it.

use std::time::{Duration, Instant};

use prosody::ProsodyClient;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

/// The longest a mock-mode shutdown waits for the consumer to catch up.
pub const MAX_DRAIN: Duration = Duration::from_secs(5);

const CALL_TIMEOUT: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(50);

/// Waits until the subscribed topics are consumed, in mock mode while subscribed; returns at
/// once otherwise.
pub async fn drain(client: &ProsodyClient) {
    let config = client.config();
    if !config.kafka.mock || client.consumer_state() != prosody::ConsumerState::Running {
        return;
    }
    let topics: Vec<String> = config
        .consumer
        .subscribed_topics
        .iter()
        .filter(|topic| !topic.starts_with('^'))
        .cloned()
        .collect();
    let servers = client.bootstrap_servers().to_owned();
    let group = config.kafka.group_id.clone();
    let budget = config.consumer.shutdown_timeout.min(MAX_DRAIN);
    let waited =
        tokio::task::spawn_blocking(move || wait_caught_up(&servers, &group, &topics, budget));
    if let Ok(Err(error)) = waited.await {
        tracing::debug!(%error, "mock drain skipped");
    }
}

fn wait_caught_up(
    servers: &str,
    group: &str,
    topics: &[String],
    budget: Duration,
) -> Result<(), rdkafka::error::KafkaError> {
    let deadline = Instant::now() + budget;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    while Instant::now() < deadline {
        if caught_up(&consumer, topics)? {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

fn caught_up(
    consumer: &BaseConsumer,
    topics: &[String],
) -> Result<bool, rdkafka::error::KafkaError> {
    let mut partitions = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), CALL_TIMEOUT)?;
        for described in metadata.topics() {
            for partition in described.partitions() {
                partitions.add_partition(topic, partition.id());
            }
        }
    }
    let committed = consumer.committed_offsets(partitions, CALL_TIMEOUT)?;
    for element in committed.elements() {
        let (_, high) =
            consumer.fetch_watermarks(element.topic(), element.partition(), CALL_TIMEOUT)?;
        let done = match element.offset() {
            Offset::Offset(offset) => offset >= high,
            _ => high == 0,
        };
        if !done {
            return Ok(false);
        }
    }
    Ok(true)
}
