//! Reloading a stored message from Kafka by (topic, partition, offset).
//!
//! [`MessageLoader`] is the seam: message collections only need "give me the record at this
//! offset". In production it is the subscription's shared [`kafka::loader::MessageLoader`]
//! (the one deferred messages are reloaded through); unit tests use a map.
//!
//! [`kafka::loader::MessageLoader`]: crate::kafka::loader::MessageLoader

use std::fmt;

use async_trait::async_trait;
use prosody_api::{Message, Offset, Partition, StorageError, StorageErrorKind, Topic};

use crate::event::Event;
use crate::kafka::loader::{LoadError, LoadRecord, MessageLoader as KafkaLoader};

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

#[async_trait]
impl MessageLoader for KafkaLoader {
    async fn load(
        &self,
        topic: &Topic,
        partition: Partition,
        offset: Offset,
    ) -> Result<Message, StorageError> {
        match LoadRecord::load(self, topic, partition, offset).await {
            Ok(Event::Message(message)) => Ok(message),
            Ok(_) => Err(gone(topic, partition, offset, "it is a tombstone now")),
            Err(error @ LoadError::Gone { .. }) => {
                Err(gone(topic, partition, offset, &error.to_string()))
            }
            Err(LoadError::Decode(error)) => Err(StorageError::new(
                OPERATION,
                StorageErrorKind::Corrupt,
                error,
            )),
            Err(error) => Err(StorageError::backend(OPERATION, error.to_string())),
        }
    }
}
