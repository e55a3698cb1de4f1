//! Reloads single records from Kafka by (topic, partition, offset): how the defer layer gets a
//! deferred message back when its retry timer fires (only the offset is stored).
//!
//! One loader is shared by every partition of a consumer. It owns a consumer of its own that
//! belongs to no group (it only assigns and reads, never commits), started by the first request
//! and driven by one thread that serves requests in turn, because a librdkafka consumer is positioned on one place at a time
//! and seeking is the expensive part:
//!
//! - a request for an offset a little ahead of where the consumer already is (at most
//!   `discard_threshold` records) reads forward and discards what lies between, which is
//!   cheaper than a seek and the common case (deferred messages are retried in offset order);
//! - anything else re-assigns the partition at the offset (a seek);
//! - a request not answered within `seek_timeout` fails transiently (the broker may be slow);
//! - a record that no longer exists (retention, compaction, a transaction marker) fails
//!   permanently: the first record read is past it.
//!
//! Loaded records are kept in a bounded cache (`cache_size`), so retrying the same deferred
//! message again does not read Kafka again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prosody_api::{Offset, Partition, Topic};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message as _;
use rdkafka::{Offset as RdOffset, TopicPartitionList};
use tokio::sync::{OnceCell, mpsc, oneshot};
use tracing::{debug, warn};

use super::decode::{DecodeLimits, decode};
use crate::event::Event;

/// Requests waiting for the loader thread before `load` waits for room.
const REQUEST_QUEUE: usize = 1_024;

/// The longest single wait for a record, so the thread notices a request whose caller left.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// How the loader reads.
#[derive(Clone, Debug)]
pub struct LoaderSettings {
    /// The brokers.
    pub bootstrap_servers: String,
    /// Names the loader's client in the broker's logs (the consumer group it serves).
    pub client_id: String,
    /// Records kept in the cache (`loaderCacheSize`).
    pub cache_size: u64,
    /// How long one load may take (`loaderSeekTimeoutMs`).
    pub seek_timeout: Duration,
    /// Records read and discarded at most instead of seeking (`loaderDiscardThreshold`; 0
    /// always seeks).
    pub discard_threshold: u64,
    /// Limits of decoding, as for consumed records.
    pub decode: DecodeLimits,
    /// Extra librdkafka properties (security settings and the like).
    pub overrides: Vec<(String, String)>,
}

/// Why a record could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Nothing arrived in time; a later try may succeed.
    #[error("no record at {topic}/{partition}@{offset} within {timeout:?}")]
    Timeout {
        /// Topic.
        topic: Topic,
        /// Partition.
        partition: Partition,
        /// Offset.
        offset: Offset,
        /// The seek timeout.
        timeout: Duration,
    },
    /// The record is gone: the first record read was past it.
    #[error("record {topic}/{partition}@{offset} no longer exists (next record at {found})")]
    Gone {
        /// Topic.
        topic: Topic,
        /// Partition.
        partition: Partition,
        /// Offset asked for.
        offset: Offset,
        /// Offset of the first record read instead.
        found: i64,
    },
    /// The record cannot be decoded (it could when it was first consumed, so it changed).
    #[error("{0}")]
    Decode(String),
    /// librdkafka refused a request.
    #[error("kafka error: {0}")]
    Kafka(String),
    /// The loader was shut down.
    #[error("the message loader stopped")]
    Stopped,
}

impl LoadError {
    /// True when trying again cannot help.
    #[must_use]
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Gone { .. } | Self::Decode(_))
    }
}

type CacheKey = (Topic, Partition, Offset);

struct Request {
    topic: Topic,
    partition: Partition,
    offset: Offset,
    reply: oneshot::Sender<Result<Event, LoadError>>,
}

/// Where the defer layer gets records back from: [`MessageLoader`] in production, a map in
/// unit tests.
#[async_trait::async_trait]
pub trait LoadRecord: Send + Sync + 'static {
    /// The record at `offset` of `topic`/`partition`, decoded.
    async fn load(
        &self,
        topic: &Topic,
        partition: Partition,
        offset: Offset,
    ) -> Result<Event, LoadError>;

    /// The record was handled and will not be asked for again.
    fn forget(&self, topic: &Topic, partition: Partition, offset: Offset);
}

#[async_trait::async_trait]
impl LoadRecord for MessageLoader {
    async fn load(
        &self,
        topic: &Topic,
        partition: Partition,
        offset: Offset,
    ) -> Result<Event, LoadError> {
        MessageLoader::load(self, topic, partition, offset).await
    }

    fn forget(&self, topic: &Topic, partition: Partition, offset: Offset) {
        MessageLoader::forget(self, topic, partition, offset);
    }
}

/// The shared loader. Cheap to clone; the thread stops when the last clone is dropped.
///
/// Its consumer and thread start with the first record asked for, not with the loader: most
/// subscriptions never defer a message nor read a message collection, and a librdkafka client
/// is a connection and two or three threads. A start that fails is tried again by the next
/// load.
#[derive(Clone)]
pub struct MessageLoader {
    settings: Arc<LoaderSettings>,
    /// The started thread's request queue.
    requests: Arc<OnceCell<mpsc::Sender<Request>>>,
    cache: moka::sync::Cache<CacheKey, Arc<Event>>,
}

impl std::fmt::Debug for MessageLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageLoader")
            .field("started", &self.is_started())
            .field("cached", &self.cache.entry_count())
            .finish_non_exhaustive()
    }
}

impl MessageLoader {
    /// A loader reading with `settings`; nothing is started yet, but the configuration is
    /// checked now.
    ///
    /// # Errors
    /// When librdkafka rejects the configuration.
    pub fn new(settings: LoaderSettings) -> Result<Self, LoadError> {
        consumer_config(&settings)
            .create_native_config()
            .map_err(|error| LoadError::Kafka(error.to_string()))?;
        Ok(Self {
            cache: moka::sync::Cache::new(settings.cache_size.max(1)),
            settings: Arc::new(settings),
            requests: Arc::new(OnceCell::new()),
        })
    }

    /// True once the loader's consumer and thread run.
    #[must_use]
    pub fn is_started(&self) -> bool {
        self.requests.initialized()
    }

    /// Creates the loader's consumer and starts its thread.
    fn start(&self) -> Result<mpsc::Sender<Request>, LoadError> {
        let consumer: BaseConsumer = consumer_config(&self.settings)
            .create()
            .map_err(|error| LoadError::Kafka(error.to_string()))?;
        let (requests, receiver) = mpsc::channel(REQUEST_QUEUE);
        let worker = Worker {
            consumer,
            settings: self.settings.clone(),
            cache: self.cache.clone(),
            position: None,
        };
        std::thread::Builder::new()
            .name("prosody-loader".to_owned())
            .spawn(move || worker.run(receiver))
            .map_err(|error| LoadError::Kafka(format!("loader thread: {error}")))?;
        debug!("message loader started");
        Ok(requests)
    }

    /// The record at `offset` of `topic`/`partition`, decoded as the consumer decodes it.
    ///
    /// # Errors
    /// See [`LoadError`]; [`LoadError::is_permanent`] tells whether to try again later.
    pub async fn load(
        &self,
        topic: &Topic,
        partition: Partition,
        offset: Offset,
    ) -> Result<Event, LoadError> {
        let key = (topic.clone(), partition, offset);
        if let Some(event) = self.cache.get(&key) {
            return Ok((*event).clone());
        }
        let requests = self
            .requests
            .get_or_try_init(|| async { self.start() })
            .await?;
        let (reply, answer) = oneshot::channel();
        requests
            .send(Request {
                topic: topic.clone(),
                partition,
                offset,
                reply,
            })
            .await
            .map_err(|_| LoadError::Stopped)?;
        answer.await.map_err(|_| LoadError::Stopped)?
    }

    /// Drops a record from the cache: it was handled and will not be asked for again.
    pub fn forget(&self, topic: &Topic, partition: Partition, offset: Offset) {
        self.cache.invalidate(&(topic.clone(), partition, offset));
    }
}

/// The loader's consumer: it belongs to no group (it only assigns and reads, never commits).
fn consumer_config(settings: &LoaderSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.bootstrap_servers)
        .set("client.id", format!("{}-loader", settings.client_id))
        // A group id librdkafka requires for a consumer; the loader never joins or commits.
        .set("group.id", format!("{}-loader", settings.client_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        // One record is wanted at a time: do not prefetch megabytes per seek.
        .set("queued.max.messages.kbytes", "1024")
        .set("fetch.wait.max.ms", "50");
    for (name, value) in &settings.overrides {
        config.set(name, value);
    }
    config
}

struct Worker {
    consumer: BaseConsumer,
    settings: Arc<LoaderSettings>,
    cache: moka::sync::Cache<CacheKey, Arc<Event>>,
    /// The partition assigned and the offset the next record read will have.
    position: Option<(Topic, Partition, i64)>,
}

impl Worker {
    fn run(mut self, mut requests: mpsc::Receiver<Request>) {
        while let Some(request) = requests.blocking_recv() {
            if request.reply.is_closed() {
                continue;
            }
            let key = (request.topic.clone(), request.partition, request.offset);
            let result = match self.cache.get(&key) {
                Some(event) => Ok((*event).clone()),
                None => self.load(&request),
            };
            if let Ok(event) = &result {
                self.cache.insert(key, Arc::new(event.clone()));
            }
            let _ = request.reply.send(result);
        }
        debug!("message loader stopped");
    }

    fn load(&mut self, request: &Request) -> Result<Event, LoadError> {
        let target = request.offset.0;
        let near = self
            .position
            .as_ref()
            .is_some_and(|(topic, partition, next)| {
                *topic == request.topic
                    && *partition == request.partition
                    && *next <= target
                    && u64::try_from(target - next)
                        .is_ok_and(|gap| gap <= self.settings.discard_threshold)
            });
        if !near {
            self.seek(request)?;
        }
        let deadline = Instant::now() + self.settings.seek_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || request.reply.is_closed() {
                // Where the consumer stands is unknown after a timeout: seek next time.
                self.position = None;
                return Err(LoadError::Timeout {
                    topic: request.topic.clone(),
                    partition: request.partition,
                    offset: request.offset,
                    timeout: self.settings.seek_timeout,
                });
            }
            let record = match self.consumer.poll(left.min(POLL_SLICE)) {
                None => continue,
                Some(Err(error)) => {
                    warn!(topic = %request.topic, partition = request.partition.0, %error,
                        "message loader: fetch error, still trying");
                    continue;
                }
                Some(Ok(record)) => record,
            };
            if record.topic() != request.topic.as_str() || record.partition() != request.partition.0
            {
                continue;
            }
            self.position = Some((
                request.topic.clone(),
                request.partition,
                record.offset() + 1,
            ));
            if record.offset() < target {
                continue;
            }
            if record.offset() > target {
                return Err(LoadError::Gone {
                    topic: request.topic.clone(),
                    partition: request.partition,
                    offset: request.offset,
                    found: record.offset(),
                });
            }
            return decode(&record, &self.settings.decode)
                .map_err(|error| LoadError::Decode(error.to_string()));
        }
    }

    fn seek(&mut self, request: &Request) -> Result<(), LoadError> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(
            request.topic.as_str(),
            request.partition.0,
            RdOffset::Offset(request.offset.0),
        )
        .map_err(|error| LoadError::Kafka(error.to_string()))?;
        self.position = None;
        self.consumer
            .assign(&list)
            .map_err(|error| LoadError::Kafka(error.to_string()))?;
        self.position = Some((request.topic.clone(), request.partition, request.offset.0));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(overrides: Vec<(String, String)>) -> LoaderSettings {
        LoaderSettings {
            // Nothing listens here: a loader that connected would show it in its errors.
            bootstrap_servers: "127.0.0.1:1".to_owned(),
            client_id: "loader-unit".to_owned(),
            cache_size: 4,
            seek_timeout: Duration::from_millis(100),
            discard_threshold: 0,
            decode: DecodeLimits::default(),
            overrides,
        }
    }

    #[test]
    fn a_new_loader_checks_its_configuration_but_starts_nothing() {
        let loader = MessageLoader::new(settings(Vec::new())).expect("valid settings");
        assert!(!loader.is_started());

        let rejected = MessageLoader::new(settings(vec![(
            "fetch.wait.max.ms".to_owned(),
            "soon".to_owned(),
        )]))
        .expect_err("librdkafka rejects the value");
        assert!(
            rejected.to_string().contains("fetch.wait.max.ms"),
            "{rejected}"
        );
    }

    #[tokio::test]
    async fn the_first_load_starts_the_loader() {
        let loader = MessageLoader::new(settings(Vec::new())).expect("valid settings");
        let missing = loader
            .load(&Topic::from("t"), Partition(0), Offset(0))
            .await;
        assert!(
            matches!(missing, Err(LoadError::Timeout { .. })),
            "{missing:?}"
        );
        assert!(loader.is_started());
    }
}
