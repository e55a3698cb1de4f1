//! Topic administration: create and delete topics, and wait until a new topic is usable.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prosody_api::{ClassifyError, ErrorClass};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient as RdAdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::time::Instant;

use super::classify::{class_of_code, class_of_kafka_error};

/// Default bound on one admin operation, including waiting for a new topic to be usable.
pub const DEFAULT_ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How often [`AdminClient::wait_for_topic`] asks for metadata. Kafka offers no notification
/// when a topic's partitions get leaders, so this is polling with a deadline.
const METADATA_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A failed admin operation; every variant names the topic it was about.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// librdkafka refused the admin client configuration.
    #[error(
        "cannot create Kafka admin client for bootstrap servers {bootstrap_servers:?}: {source}"
    )]
    Create {
        /// The configured bootstrap servers.
        bootstrap_servers: String,
        /// librdkafka's reason (boxed: `KafkaError` is large).
        #[source]
        source: Box<KafkaError>,
    },
    /// `create_topic` of a topic that already exists.
    #[error("cannot create topic {topic:?}: it already exists")]
    TopicAlreadyExists {
        /// The topic.
        topic: String,
    },
    /// `delete_topic` of a topic that does not exist.
    #[error("cannot delete topic {topic:?}: it does not exist")]
    TopicNotFound {
        /// The topic.
        topic: String,
    },
    /// The broker rejected the operation for this topic (invalid partition count, replication
    /// factor above the broker count, policy violation...).
    #[error("cannot {operation} topic {topic:?}: {code}")]
    Rejected {
        /// `"create"` or `"delete"`.
        operation: &'static str,
        /// The topic.
        topic: String,
        /// The broker's error code; its display is librdkafka's description.
        code: RDKafkaErrorCode,
    },
    /// The request failed as a whole (broker unreachable, request timed out).
    #[error("cannot {operation} topic {topic:?}: {source}")]
    Kafka {
        /// `"create"`, `"delete"` or `"describe"`.
        operation: &'static str,
        /// The topic.
        topic: String,
        /// The rdkafka error (boxed: it is large).
        #[source]
        source: Box<KafkaError>,
    },
    /// The topic did not become usable (every partition with a leader) in time.
    #[error("topic {topic:?} was not usable after {timeout_ms} ms: {last_problem}")]
    NotReady {
        /// The topic.
        topic: String,
        /// How long we waited, in milliseconds.
        timeout_ms: u128,
        /// What the last metadata answer said.
        last_problem: String,
    },
}

impl ClassifyError for AdminError {
    fn error_class(&self) -> ErrorClass {
        match self {
            Self::Create { .. } | Self::TopicAlreadyExists { .. } | Self::TopicNotFound { .. } => {
                ErrorClass::Permanent
            }
            Self::Rejected { code, .. } => class_of_code(*code),
            Self::Kafka { source, .. } => class_of_kafka_error(source),
            Self::NotReady { .. } => ErrorClass::Transient,
        }
    }
}

/// Creates and deletes topics. Cheap to clone; clones share one librdkafka client.
#[derive(Clone)]
pub struct AdminClient {
    inner: Arc<RdAdminClient<DefaultClientContext>>,
    bootstrap_servers: String,
    timeout: Duration,
}

impl fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminClient")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl AdminClient {
    /// Creates an admin client for `bootstrap_servers` (comma-separated `host:port`). Connecting
    /// happens in the background.
    ///
    /// # Errors
    /// [`AdminError::Create`] when librdkafka rejects the configuration.
    pub fn new(bootstrap_servers: &str) -> Result<Self, AdminError> {
        let inner = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers)
            .create()
            .map_err(|source| AdminError::Create {
                bootstrap_servers: bootstrap_servers.to_owned(),
                source: Box::new(source),
            })?;
        Ok(Self {
            inner: Arc::new(inner),
            bootstrap_servers: bootstrap_servers.to_owned(),
            timeout: DEFAULT_ADMIN_TIMEOUT,
        })
    }

    /// Sets the bound on each operation (default [`DEFAULT_ADMIN_TIMEOUT`]).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Creates `name` and returns once every partition has a leader, so a producer can write
    /// to it right away.
    ///
    /// # Errors
    /// [`AdminError::TopicAlreadyExists`] when it exists; [`AdminError::Rejected`] for invalid
    /// counts; [`AdminError::Kafka`] or [`AdminError::NotReady`] when the cluster does not
    /// answer in time.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i32,
    ) -> Result<(), AdminError> {
        let topic = NewTopic::new(
            name,
            partitions,
            TopicReplication::Fixed(replication_factor),
        );
        let results = self
            .inner
            .create_topics([&topic], &self.options())
            .await
            .map_err(|source| kafka_error("create", name, source))?;
        for result in results {
            if let Err((_, code)) = result {
                return Err(match code {
                    RDKafkaErrorCode::TopicAlreadyExists => AdminError::TopicAlreadyExists {
                        topic: name.to_owned(),
                    },
                    code => AdminError::Rejected {
                        operation: "create",
                        topic: name.to_owned(),
                        code,
                    },
                });
            }
        }
        self.wait_for_topic(name, self.timeout).await
    }

    /// Deletes `name`.
    ///
    /// # Errors
    /// [`AdminError::TopicNotFound`] when it does not exist; [`AdminError::Rejected`] or
    /// [`AdminError::Kafka`] otherwise.
    pub async fn delete_topic(&self, name: &str) -> Result<(), AdminError> {
        let results = self
            .inner
            .delete_topics(&[name], &self.options())
            .await
            .map_err(|source| kafka_error("delete", name, source))?;
        for result in results {
            if let Err((_, code)) = result {
                return Err(match code {
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                        AdminError::TopicNotFound {
                            topic: name.to_owned(),
                        }
                    }
                    code => AdminError::Rejected {
                        operation: "delete",
                        topic: name.to_owned(),
                        code,
                    },
                });
            }
        }
        Ok(())
    }

    /// Waits until the cluster metadata shows `name` with every partition led by a broker.
    ///
    /// # Errors
    /// [`AdminError::NotReady`] when that does not happen within `timeout`.
    pub async fn wait_for_topic(&self, name: &str, timeout: Duration) -> Result<(), AdminError> {
        let deadline = Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Some(problem) = self.topic_problem(name, remaining).await else {
                return Ok(());
            };
            if Instant::now() + METADATA_POLL_INTERVAL >= deadline {
                return Err(AdminError::NotReady {
                    topic: name.to_owned(),
                    timeout_ms: timeout.as_millis(),
                    last_problem: problem,
                });
            }
            tokio::time::sleep(METADATA_POLL_INTERVAL).await;
        }
    }

    /// What keeps `name` from being usable, or `None` when it is. Failures to fetch metadata
    /// count as problems: the caller retries until its deadline.
    async fn topic_problem(&self, name: &str, timeout: Duration) -> Option<String> {
        let inner = Arc::clone(&self.inner);
        let topic = name.to_owned();
        // fetch_metadata blocks the calling thread until the broker answers.
        let fetched = tokio::task::spawn_blocking(move || {
            inner.inner().fetch_metadata(Some(&topic), timeout)
        })
        .await;
        let metadata = match fetched {
            Ok(Ok(metadata)) => metadata,
            Ok(Err(error)) => return Some(format!("metadata request failed: {error}")),
            Err(join) => return Some(format!("metadata task failed: {join}")),
        };

        let Some(topic) = metadata.topics().iter().find(|topic| topic.name() == name) else {
            return Some("absent from metadata".to_owned());
        };
        if let Some(error) = topic.error() {
            return Some(RDKafkaErrorCode::from(error).to_string());
        }
        if topic.partitions().is_empty() {
            return Some("no partitions yet".to_owned());
        }
        let leaderless = topic
            .partitions()
            .iter()
            .filter(|partition| partition.leader() < 0 || partition.error().is_some())
            .count();
        (leaderless > 0).then(|| format!("{leaderless} partition(s) without a leader"))
    }

    fn options(&self) -> AdminOptions {
        // operation_timeout makes the broker answer only once the controller has applied the
        // change, instead of as soon as it accepted the request.
        AdminOptions::new()
            .operation_timeout(Some(self.timeout))
            .request_timeout(Some(self.timeout))
    }
}

fn kafka_error(operation: &'static str, topic: &str, source: KafkaError) -> AdminError {
    AdminError::Kafka {
        operation,
        topic: topic.to_owned(),
        source: Box::new(source),
    }
}
