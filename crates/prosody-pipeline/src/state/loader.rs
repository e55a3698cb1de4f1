//! Reloading a stored message from Kafka by (topic, partition, offset).
//!
//! [`MessageLoader`] is the seam: message collections only need "give me the record at this
//! offset". [`KafkaMessageLoader`] is a minimal implementation (one assign-and-poll consumer,
//! loads serialized); a shared loader with caching and batching (`kafka/loader.rs`, being
//! built for deferred messages) can replace it by implementing the trait.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::{Message, Offset, Partition, StorageError, StorageErrorKind, Topic};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset as RdOffset, TopicPartitionList};

use crate::event::Event;
use crate::kafka::decode::{DecodeLimits, decode};

/// Loads the Kafka record a message collection refers to.
#[async_trait]
pub trait MessageLoader: Send + Sync + fmt::Debug {
    /// The message at `offset` of `topic`/`partition`.
    ///
    /// # Errors
    /// A permanent error when the record is gone (retention, compaction) or is not a JSON
    /// message any more; a transient one when Kafka did not answer in time.
    async fn load(
        &self,
        topic: &Topic,
        partition: Partition,
        offset: Offset,
    ) -> Result<Message, StorageError>;
}

const OPERATION: &str = "state.load_message";

/// Loads records with one dedicated consumer (manual assignment, no group commits).
pub struct KafkaMessageLoader {
    consumer: Arc<Mutex<BaseConsumer>>,
    timeout: Duration,
}

impl fmt::Debug for KafkaMessageLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaMessageLoader")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaMessageLoader {
    /// A loader reading from `bootstrap_servers`, giving up on a record after `timeout`.
    ///
    /// # Errors
    /// librdkafka's error creating the consumer.
    pub fn new(bootstrap_servers: &str, timeout: Duration) -> Result<Self, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers)
            // Never joins the group (manual assignment); the id is required by librdkafka.
            .set("group.id", "prosody-message-loader")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "true")
            .create()?;
        Ok(Self {
            consumer: Arc::new(Mutex::new(consumer)),
            timeout,
        })
    }
}

fn gone(topic: &Topic, partition: Partition, offset: Offset, why: &str) -> StorageError {
    StorageError::new(
        OPERATION,
        StorageErrorKind::InvalidRequest,
        format!(
            "the stored message {topic}/{}@{} is no longer available in Kafka ({why}); message \
             collections need the topic's retention to cover the state's lifetime",
            partition.0, offset.0
        ),
    )
}

fn load_blocking(
    consumer: &BaseConsumer,
    topic: &Topic,
    partition: Partition,
    offset: Offset,
    timeout: Duration,
) -> Result<Message, StorageError> {
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic.as_str(), partition.0, RdOffset::Offset(offset.0))
        .map_err(|error| StorageError::backend(OPERATION, error.to_string()))?;
    consumer
        .assign(&assignment)
        .map_err(|error| StorageError::backend(OPERATION, error.to_string()))?;
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StorageError::backend(
                OPERATION,
                format!(
                    "no answer for {topic}/{}@{} within {timeout:?}",
                    partition.0, offset.0
                ),
            ));
        }
        match consumer.poll(left.min(Duration::from_millis(500))) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {
                return Err(gone(
                    topic,
                    partition,
                    offset,
                    "past the end of the partition",
                ));
            }
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                return Err(gone(topic, partition, offset, "offset out of range"));
            }
            Some(Err(error)) => return Err(StorageError::backend(OPERATION, error.to_string())),
            Some(Ok(record)) => {
                // Compaction removes records: the next one readable is a later offset.
                if record.offset() != offset.0 {
                    return Err(gone(topic, partition, offset, "removed by compaction"));
                }
                return match decode(&record, &DecodeLimits::default()) {
                    Ok(Event::Message(message)) => Ok(message),
                    Ok(_) => Err(gone(topic, partition, offset, "it is a tombstone now")),
                    Err(error) => Err(StorageError::new(
                        OPERATION,
                        StorageErrorKind::Corrupt,
                        error.to_string(),
                    )),
                };
            }
        }
    }
}

#[async_trait]
impl MessageLoader for KafkaMessageLoader {
    async fn load(
        &self,
        topic: &Topic,
        partition: Partition,
        offset: Offset,
    ) -> Result<Message, StorageError> {
        let consumer = self.consumer.clone();
        let (topic, timeout) = (topic.clone(), self.timeout);
        tokio::task::spawn_blocking(move || {
            load_blocking(&consumer.lock(), &topic, partition, offset, timeout)
        })
        .await
        .map_err(|error| StorageError::backend(OPERATION, error.to_string()))?
    }
}
