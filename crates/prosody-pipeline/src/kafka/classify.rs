//! Which librdkafka errors a retry can fix.
//!
//! Prosody treats every failure as transient unless it is known to be permanent (FEATURES.md
//! section 2), so this module lists only the permanent codes: retrying them would fail the same
//! way forever and, in pipeline mode, block the key.

use prosody_api::ErrorClass;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The class of a librdkafka error code.
#[must_use]
pub fn class_of_code(code: RDKafkaErrorCode) -> ErrorClass {
    use RDKafkaErrorCode as C;
    match code {
        C::UnknownTopicOrPartition
        | C::UnknownTopic
        | C::UnknownPartition
        | C::UnknownTopicId
        | C::InvalidTopic
        | C::MessageSizeTooLarge
        | C::InvalidMessageSize
        | C::MessageBatchTooLarge
        | C::InvalidRecord
        | C::InvalidMessage
        | C::InvalidArgument
        | C::InvalidRequiredAcks
        | C::InvalidRequest
        | C::InvalidConfig
        | C::InvalidPartitions
        | C::InvalidReplicationFactor
        | C::PolicyViolation
        | C::UnsupportedVersion
        | C::TopicAlreadyExists
        | C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::Authentication
        | C::Fatal
        | C::Fenced => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// The class of an rdkafka error. Errors without a librdkafka code that stem from the caller's
/// input (configuration, client creation, NUL bytes in names) never heal; the rest are
/// transient.
#[must_use]
pub fn class_of_kafka_error(error: &KafkaError) -> ErrorClass {
    match error {
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) | KafkaError::Nul(_) => {
            ErrorClass::Permanent
        }
        other => other
            .rdkafka_error_code()
            .map_or(ErrorClass::Transient, class_of_code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_and_queue_trouble_is_transient() {
        for code in [
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::NotEnoughReplicas,
        ] {
            assert_eq!(class_of_code(code), ErrorClass::Transient, "{code:?}");
        }
    }

    #[test]
    fn unknown_topic_and_oversized_records_are_permanent() {
        for code in [
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert_eq!(class_of_code(code), ErrorClass::Permanent, "{code:?}");
        }
    }

    #[test]
    fn errors_without_code_follow_their_kind() {
        let production = KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull);
        assert_eq!(class_of_kafka_error(&production), ErrorClass::Transient);
        let creation = KafkaError::ClientCreation("bad".to_owned());
        assert_eq!(class_of_kafka_error(&creation), ErrorClass::Permanent);
        assert_eq!(
            class_of_kafka_error(&KafkaError::Canceled),
            ErrorClass::Transient
        );
    }
}
