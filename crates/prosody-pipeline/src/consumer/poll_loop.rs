//! The poll loop: one thread that owns the librdkafka consumer, feeds received records to the
//! [`Engine`], commits watermarks every commit interval, and drains partitions on revocation.
//!
//! A dedicated OS thread (not a tokio task) polls because librdkafka runs the rebalance
//! callback inside `poll`, and that callback must block until the revoked partitions' handlers
//! finish and their offsets are committed, before the partitions are released.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prosody_api::Offset;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientContext, Message as _, TopicPartitionList};
use tokio::runtime::Handle;
use tracing::{debug, error, info, warn};

use super::engine::{Engine, FlowControl};
use super::topic_partition::TopicPartition;
use crate::event::Event;
use crate::kafka::decode::{DecodeLimits, decode, reject};

/// What the poll loop needs to know about Kafka.
#[derive(Clone, Debug)]
pub struct PollSettings {
    /// Kafka bootstrap servers.
    pub bootstrap_servers: String,
    /// Consumer group id.
    pub group_id: String,
    /// Topics; a name starting with `^` is a regular expression.
    pub topics: Vec<String>,
    /// How often committable offsets are committed.
    pub commit_interval: Duration,
    /// The longest a single poll blocks (bounds how fast a stop request is noticed).
    pub poll_interval: Duration,
    /// Limits applied while decoding records.
    pub decode: DecodeLimits,
    /// Extra librdkafka properties, applied last.
    pub overrides: Vec<(String, String)>,
}

type KafkaConsumer = BaseConsumer<RebalanceContext>;

/// Routes librdkafka's rebalance callbacks to the engine.
struct RebalanceContext {
    engine: Engine,
    runtime: Handle,
}

impl ClientContext for RebalanceContext {}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, consumer: &KafkaConsumer, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                let partitions = partitions_of(list);
                info!(?partitions, "partitions revoked: draining");
                let offsets = self.runtime.block_on(self.engine.revoke(&partitions));
                commit(consumer, &offsets, CommitMode::Sync);
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => warn!(%error, "rebalance error"),
        }
    }

    fn post_rebalance(&self, _: &KafkaConsumer, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            let partitions = partitions_of(list);
            info!(?partitions, "partitions assigned");
            self.engine.assign(partitions);
        }
    }
}

/// Pauses and resumes partitions on the live consumer. Holds it weakly: the consumer owns the
/// context, which owns the engine, which owns this.
#[derive(Default)]
pub struct KafkaFlowControl {
    consumer: OnceLock<Weak<KafkaConsumer>>,
}

impl KafkaFlowControl {
    fn apply(&self, partition: &TopicPartition, pause: bool) {
        let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) else {
            return;
        };
        let mut list = TopicPartitionList::new();
        list.add_partition(partition.topic.as_str(), partition.partition.0);
        let result = if pause {
            consumer.pause(&list)
        } else {
            consumer.resume(&list)
        };
        if let Err(error) = result {
            // Pausing a partition revoked a moment ago fails harmlessly.
            debug!(%partition, %error, pause, "pause/resume failed");
        }
    }
}

impl FlowControl for KafkaFlowControl {
    fn pause(&self, partition: &TopicPartition) {
        self.apply(partition, true);
    }

    fn resume(&self, partition: &TopicPartition) {
        self.apply(partition, false);
    }
}

/// A running poll loop. Stop it with [`PollLoop::stop`]; dropping it stops it too.
pub struct PollLoop {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PollLoop {
    /// Creates the consumer, subscribes and starts polling on a new thread. `flow` must be the
    /// flow control the `engine` was built with.
    ///
    /// # Errors
    /// When librdkafka rejects the configuration or the subscription.
    pub fn start(
        settings: &PollSettings,
        engine: Engine,
        flow: &Arc<KafkaFlowControl>,
        runtime: Handle,
    ) -> KafkaResult<Self> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &settings.bootstrap_servers)
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("partition.assignment.strategy", "cooperative-sticky");
        for (name, value) in &settings.overrides {
            config.set(name, value);
        }
        let context = RebalanceContext {
            engine: engine.clone(),
            runtime,
        };
        let consumer: Arc<KafkaConsumer> = Arc::new(config.create_with_context(context)?);
        let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        // Set once, right after creation and before any record can cause a pause.
        let _ = flow.consumer.set(Arc::downgrade(&consumer));

        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name(format!("prosody-poll-{}", settings.group_id))
            .spawn({
                let stop = stop.clone();
                let settings = settings.clone();
                move || poll_until_stopped(&consumer, &engine, &settings, &stop)
            })
            .map_err(|error| {
                rdkafka::error::KafkaError::ClientCreation(format!("poll thread: {error}"))
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops polling, drains every partition (within the engine's shutdown timeout), commits,
    /// leaves the group, and waits for the thread to end.
    pub async fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // The thread blocks on the engine's drain; wait for it off the async workers.
            let joined = tokio::task::spawn_blocking(move || thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                error!("poll thread panicked");
            }
        }
    }
}

impl Drop for PollLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn poll_until_stopped(
    consumer: &Arc<KafkaConsumer>,
    engine: &Engine,
    settings: &PollSettings,
    stop: &AtomicBool,
) {
    let mut committed: HashMap<TopicPartition, Offset> = HashMap::new();
    let mut last_commit = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        match consumer.poll(settings.poll_interval) {
            Some(Ok(record)) => receive(engine, &record, &settings.decode),
            Some(Err(error)) => warn!(%error, "consumer error"),
            None => {}
        }
        if last_commit.elapsed() >= settings.commit_interval {
            commit_changed(consumer, engine, &mut committed);
            last_commit = Instant::now();
        }
    }
    let partitions = engine.assigned();
    let offsets = consumer
        .context()
        .runtime
        .block_on(engine.revoke(&partitions));
    commit(consumer, &offsets, CommitMode::Sync);
    // Leaving the group happens when the last reference drops: librdkafka's close runs the
    // revoke callback once more, which finds nothing left to drain.
    consumer.unsubscribe();
}

fn receive(engine: &Engine, record: &BorrowedMessage<'_>, limits: &DecodeLimits) {
    let partition = TopicPartition::new(record.topic(), record.partition());
    match decode(record, limits) {
        Ok(event) => engine.offer(&partition, event),
        Err(problem) => {
            error!(%partition, offset = record.offset(), %problem,
                "record rejected: cannot decode; the mode's failure policy routes it");
            // Queued like any record so its offset commits only once the policy has run.
            let rejected = reject(record, &problem, limits);
            engine.offer(&partition, Event::Rejected(Box::new(rejected)));
        }
    }
}

fn commit_changed(
    consumer: &KafkaConsumer,
    engine: &Engine,
    committed: &mut HashMap<TopicPartition, Offset>,
) {
    let changed: Vec<(TopicPartition, Offset)> = engine
        .committable()
        .into_iter()
        .filter(|(partition, offset)| committed.get(partition) != Some(offset))
        .collect();
    if changed.is_empty() {
        return;
    }
    commit(consumer, &changed, CommitMode::Async);
    committed.extend(changed);
}

fn commit(consumer: &KafkaConsumer, offsets: &[(TopicPartition, Offset)], mode: CommitMode) {
    if offsets.is_empty() {
        return;
    }
    let mut list = TopicPartitionList::new();
    for (partition, offset) in offsets {
        if let Err(error) = list.add_partition_offset(
            partition.topic.as_str(),
            partition.partition.0,
            rdkafka::Offset::Offset(offset.0),
        ) {
            warn!(%partition, %error, "offset not committable");
        }
    }
    match consumer.commit(&list, mode) {
        Ok(()) => debug!(?offsets, "committed"),
        Err(error) => warn!(%error, ?offsets, "commit failed; retried at the next interval"),
    }
}

fn partitions_of(list: &TopicPartitionList) -> Vec<TopicPartition> {
    list.elements()
        .iter()
        .map(|element| TopicPartition::new(element.topic(), element.partition()))
        .collect()
}
