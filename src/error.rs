//! Errors of the high-level client.

use prosody_api::{ClassifyError, ErrorClass};
use prosody_pipeline::kafka::producer::ProducerError;
use prosody_pipeline::state::RegistryError;

use crate::config::ConfigError;

/// What a client operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The configuration is invalid; the message names the option.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Sending failed.
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// librdkafka refused to create a client or subscribe.
    #[error("kafka: {0}")]
    Kafka(String),
    /// The probe server could not start (its port is taken).
    #[error("{0}")]
    Probes(String),
    /// `subscribe` while already subscribed.
    #[error("the client is already subscribed; unsubscribe first")]
    AlreadySubscribed,
    /// `unsubscribe` while not subscribed.
    #[error("the client is not subscribed")]
    NotSubscribed,
    /// `subscribe` on a client configured without topics.
    #[error("no topics to subscribe to: set subscribedTopics (PROSODY_SUBSCRIBED_TOPICS)")]
    NoTopics,
    /// Keyed-state collections could not be registered (a name stored durably with another
    /// kind or payload is permanent; a store failure is transient).
    #[error(transparent)]
    State(#[from] RegistryError),
    /// The storage backend could not be opened (a locked directory, an unreachable cluster).
    #[error("storage: {0}")]
    Storage(String),
    /// Any operation after `shutdown`.
    #[error("the client has been shut down")]
    ShutDown,
}

impl ClientError {
    pub(crate) fn kafka(error: impl std::fmt::Display) -> Self {
        Self::Kafka(error.to_string())
    }
}

impl ClassifyError for ClientError {
    fn error_class(&self) -> ErrorClass {
        match self {
            Self::Producer(error) => error.error_class(),
            Self::State(error) => error.error_class(),
            Self::Kafka(_) | Self::Probes(_) | Self::Storage(_) => ErrorClass::Transient,
            Self::Config(_)
            | Self::AlreadySubscribed
            | Self::NotSubscribed
            | Self::NoTopics
            | Self::ShutDown => ErrorClass::Permanent,
        }
    }
}
