//! Why a send failed, naming the record, and whether retrying can help.

use prosody_api::{ClassifyError, ErrorClass};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::kafka::classify::class_of_kafka_error;

/// A failed [`Producer`](super::Producer) operation.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// librdkafka refused the producer configuration.
    #[error("cannot create Kafka producer for bootstrap servers {bootstrap_servers:?}: {source}")]
    Create {
        /// The configured bootstrap servers.
        bootstrap_servers: String,
        /// librdkafka's reason (boxed: `KafkaError` is large and errors travel by value).
        #[source]
        source: Box<KafkaError>,
    },
    /// Prosody requires a non-empty key for per-key ordering; consumers reject empty keys.
    #[error("cannot send to topic {topic:?}: the key is empty")]
    EmptyKey {
        /// Destination topic.
        topic: String,
    },
    /// The send was not acknowledged within `send_timeout` (queueing plus delivery).
    #[error("send to topic {topic:?}, key {key:?} timed out after {timeout_ms} ms")]
    TimedOut {
        /// Destination topic.
        topic: String,
        /// Record key.
        key: String,
        /// The configured send timeout in milliseconds.
        timeout_ms: u128,
    },
    /// The caller cancelled the send before it was acknowledged. The record may still reach
    /// the broker if librdkafka had already transmitted it.
    #[error("send to topic {topic:?}, key {key:?} was cancelled")]
    Cancelled {
        /// Destination topic.
        topic: String,
        /// Record key.
        key: String,
    },
    /// Kafka or librdkafka rejected the record.
    #[error("send to topic {topic:?}, key {key:?} failed: {source}")]
    Kafka {
        /// Destination topic.
        topic: String,
        /// Record key.
        key: String,
        /// The rdkafka error (boxed: it is large).
        #[source]
        source: Box<KafkaError>,
    },
}

/// Queue full, timeouts, cancellation and broker/transport trouble are transient; unknown
/// topic, oversized record, serialization, empty key and configuration are permanent.
impl ClassifyError for ProducerError {
    fn error_class(&self) -> ErrorClass {
        match self {
            Self::TimedOut { .. } | Self::Cancelled { .. } => ErrorClass::Transient,
            Self::Create { .. } | Self::EmptyKey { .. } => ErrorClass::Permanent,
            Self::Kafka { source, .. } => class_of_kafka_error(source),
        }
    }
}

impl ProducerError {
    /// The librdkafka error code, when Kafka reported one.
    #[must_use]
    pub fn kafka_code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            Self::Create { source, .. } | Self::Kafka { source, .. } => source.rdkafka_error_code(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(code: RDKafkaErrorCode) -> ProducerError {
        ProducerError::Kafka {
            topic: "orders".to_owned(),
            key: "k1".to_owned(),
            source: Box::new(KafkaError::MessageProduction(code)),
        }
    }

    #[test]
    fn messages_name_topic_and_key() {
        let error = ProducerError::TimedOut {
            topic: "orders".to_owned(),
            key: "k1".to_owned(),
            timeout_ms: 1000,
        };
        assert_eq!(
            error.to_string(),
            r#"send to topic "orders", key "k1" timed out after 1000 ms"#
        );
        let error = kafka(RDKafkaErrorCode::MessageSizeTooLarge);
        let text = error.to_string();
        assert!(
            text.contains(r#""orders""#) && text.contains(r#""k1""#),
            "{text}"
        );
    }

    #[test]
    fn classification() {
        assert!(!kafka(RDKafkaErrorCode::QueueFull).is_permanent());
        assert!(!kafka(RDKafkaErrorCode::BrokerTransportFailure).is_permanent());
        assert!(kafka(RDKafkaErrorCode::UnknownTopicOrPartition).is_permanent());
        assert!(kafka(RDKafkaErrorCode::MessageSizeTooLarge).is_permanent());
        let timed_out = ProducerError::TimedOut {
            topic: String::new(),
            key: String::new(),
            timeout_ms: 1,
        };
        assert!(!timed_out.is_permanent());
    }
}
