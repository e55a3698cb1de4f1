//! librdkafka's in-process mock Kafka cluster, for mock mode (`mock: true` without bootstrap
//! servers) and tests that need no external services.
//!
//! `rdkafka::mocking::MockCluster` holds a raw pointer and is therefore neither `Send` nor
//! `Sync`, while the client that owns it must be both. Rather than assert thread safety with
//! `unsafe`, the cluster lives on a dedicated thread for its whole life; [`MockKafka`] talks to
//! it over a channel. The cluster's brokers run on librdkafka's own threads and listen on
//! loopback, so clients reach them through [`MockKafka::bootstrap_servers`] like any cluster.

use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;

/// A failed mock-cluster operation.
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    /// librdkafka could not start the mock cluster.
    #[error("cannot start the in-process mock Kafka cluster with {brokers} broker(s): {source}")]
    Start {
        /// Requested broker count.
        brokers: u16,
        /// librdkafka's reason (boxed: `KafkaError` is large).
        #[source]
        source: Box<KafkaError>,
    },
    /// The thread owning the cluster could not be spawned or is gone.
    #[error("the mock Kafka cluster thread is not running: {0}")]
    Thread(String),
    /// The mock cluster refused to create the topic.
    #[error("cannot create topic {topic:?} on the mock Kafka cluster: {source}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// librdkafka's reason.
        #[source]
        source: Box<KafkaError>,
    },
}

struct CreateTopic {
    name: String,
    partitions: i32,
    reply: mpsc::Sender<Result<(), KafkaError>>,
}

/// An in-process mock Kafka cluster. Clients using it must be dropped before it, or they lose
/// their brokers; keep it in the same owner as the clients.
#[derive(Debug)]
pub struct MockKafka {
    bootstrap_servers: String,
    commands: Option<mpsc::Sender<CreateTopic>>,
    owner: Option<JoinHandle<()>>,
}

impl MockKafka {
    /// Starts a cluster of `brokers` brokers on loopback.
    ///
    /// # Errors
    /// [`MockError::Start`] when librdkafka cannot start it.
    pub fn start(brokers: u16) -> Result<Self, MockError> {
        let (started_tx, started_rx) = mpsc::channel();
        let (commands_tx, commands_rx) = mpsc::channel::<CreateTopic>();
        let owner = thread::Builder::new()
            .name("prosody-mock-kafka".to_owned())
            .spawn(move || {
                let cluster = match MockCluster::new(i32::from(brokers)) {
                    Ok(cluster) => cluster,
                    Err(error) => {
                        let _ = started_tx.send(Err(error));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(cluster.bootstrap_servers()));
                // Ends when MockKafka drops the sender; the cluster is destroyed on return.
                for command in commands_rx {
                    let replication = 1;
                    let result =
                        cluster.create_topic(&command.name, command.partitions, replication);
                    let _ = command.reply.send(result);
                }
            })
            .map_err(|error| MockError::Thread(error.to_string()))?;

        let started = started_rx
            .recv()
            .map_err(|_| MockError::Thread("it exited before reporting".to_owned()))?;
        let bootstrap_servers = match started {
            Ok(servers) => servers,
            Err(source) => {
                let _ = owner.join();
                return Err(MockError::Start {
                    brokers,
                    source: Box::new(source),
                });
            }
        };
        Ok(Self {
            bootstrap_servers,
            commands: Some(commands_tx),
            owner: Some(owner),
        })
    }

    /// The cluster's `bootstrap.servers` list.
    #[must_use]
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// Creates `name` with `partitions` partitions (replication factor 1). The mock brokers do
    /// not implement the `CreateTopics` admin request, so `AdminClient` cannot do this here.
    ///
    /// This blocks the caller only for an in-memory update on the owner thread.
    ///
    /// # Errors
    /// [`MockError::CreateTopic`] when the cluster refuses it.
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), MockError> {
        let (reply, answer) = mpsc::channel();
        let gone = || MockError::Thread("it stopped".to_owned());
        self.commands
            .as_ref()
            .ok_or_else(gone)?
            .send(CreateTopic {
                name: name.to_owned(),
                partitions,
                reply,
            })
            .map_err(|_| gone())?;
        answer
            .recv()
            .map_err(|_| gone())?
            .map_err(|source| MockError::CreateTopic {
                topic: name.to_owned(),
                source: Box::new(source),
            })
    }
}

impl Drop for MockKafka {
    fn drop(&mut self) {
        // Closing the channel ends the owner loop, which destroys the cluster; joining makes
        // the brokers' ports free again when drop returns.
        self.commands.take();
        if let Some(owner) = self.owner.take() {
            let _ = owner.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_creates_topics_and_stops() {
        let mock = MockKafka::start(1).expect("mock cluster starts");
        assert!(!mock.bootstrap_servers().is_empty());
        mock.create_topic("orders", 3).expect("topic created");
        drop(mock);
    }

    #[test]
    fn is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<MockKafka>();
    }
}
