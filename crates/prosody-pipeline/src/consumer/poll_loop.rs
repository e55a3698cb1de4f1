//! The poll loop: one thread that owns the librdkafka consumer, feeds received records to the
//! [`Engine`], commits watermarks every commit interval, and drains partitions on revocation.
//!
//! A dedicated OS thread (not a tokio task) polls because librdkafka runs the rebalance
//! callback inside `poll`, and that callback must block until the revoked partitions' handlers
//! finish and their offsets are committed, before the partitions are released.
//!
//! Every assigned partition gets its own librdkafka queue (`split_partition_queue`), read by a
//! [`PartitionReader`] on the async runtime, so partitions are read in parallel; the poll
//! thread itself serves only the main queue (rebalances, errors, and records fetched before a
//! queue was split) and commits. A partition whose backlog is full is paused by no longer
//! reading its queue: librdkafka stops fetching once that queue holds
//! `queued.max.messages.kbytes`, and resumes where it stopped. Pausing through librdkafka's
//! pause API instead would discard the prefetched records on every pause and fetch them again
//! on resume, which under steady backpressure costs a broker round trip per few dozen records.
//!
//! Stopping comes in two kinds. [`PollLoop::stop`] drains: running handlers finish (within the
//! engine's shutdown timeout) and their offsets commit. Dropping the loop without stopping it
//! abandons: the thread commits what is already done and leaves the group without waiting on
//! the async runtime, which may itself be shutting down (a client dropped with its runtime);
//! whatever was still running is redelivered to the next owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prosody_api::Offset;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientContext, Message as _, TopicPartitionList};
use tokio::runtime::Handle;
use tracing::{debug, error, info, warn};

use super::engine::{Engine, FlowControl};
use super::partition_reader::PartitionReader;
use super::topic_partition::TopicPartition;
use super::wakeup::Wakeup;
use crate::event::Event;
use crate::kafka::decode::{DecodeLimits, decode, reject};

/// librdkafka's prefetch bound per partition queue, in KiB (`queued.max.messages.kbytes`).
const PREFETCH_KBYTES_PER_PARTITION: &str = "4096";

/// librdkafka's prefetch target per partition queue, in records (`queued.min.messages`).
const PREFETCH_RECORDS_PER_PARTITION: &str = "10000";

/// How long librdkafka waits before fetching a partition again once its queue was over the
/// prefetch bounds above (`fetch.queue.backoff.ms`). Its default, one second, suits its own
/// default bounds (64 MiB, 100,000 records), which a queue rarely reaches; with the bounds per
/// partition set here a partition's queue reaches them at every fetch under load, and the
/// consumer then sat idle for up to a second after draining it (measured: the engine empty for
/// ~500 ms twice in a 1.8 s run). A few milliseconds keeps the next fetch close behind the drain
/// at the cost of a cheap threshold check per partition per period.
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// What the poll thread has been asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Request {
    Poll = 0,
    /// Stop after draining every partition (graceful).
    Drain = 1,
    /// Stop now: commit what is done, wait on nothing (the loop was dropped).
    Abandon = 2,
}

/// The [`Request`] shared by the loop's owner, its thread and the rebalance callback.
#[derive(Debug, Default)]
struct Requests(AtomicU8);

impl Requests {
    fn get(&self) -> Request {
        match self.0.load(Ordering::SeqCst) {
            0 => Request::Poll,
            1 => Request::Drain,
            _ => Request::Abandon,
        }
    }

    /// Asks for `request` unless a stop was asked already: the first stop request wins.
    fn ask(&self, request: Request) {
        let _ = self.0.compare_exchange(
            Request::Poll as u8,
            request as u8,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
}

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
    /// The longest the loop sleeps without checking for a stop request.
    pub poll_interval: Duration,
    /// Limits applied while decoding records.
    pub decode: DecodeLimits,
    /// Extra librdkafka properties, applied last.
    pub overrides: Vec<(String, String)>,
}

type KafkaConsumer = BaseConsumer<RebalanceContext>;
type Reader = PartitionReader<RebalanceContext>;

/// The readers of the assigned partitions. Each holds its partition's queue, which holds a
/// strong reference to the consumer, so they are closed on revocation and before the consumer
/// is dropped.
#[derive(Default)]
struct Readers {
    assigned: Mutex<HashMap<TopicPartition, Arc<Reader>>>,
}

impl Readers {
    fn signal(&self, partition: &TopicPartition) {
        let reader = self.assigned.lock().get(partition).cloned();
        if let Some(reader) = reader {
            reader.signal();
        }
    }

    fn all(&self) -> Vec<Arc<Reader>> {
        self.assigned.lock().values().cloned().collect()
    }

    /// Closes the readers of `partitions` (all when `None`), waiting for reads in progress.
    fn close(&self, partitions: Option<&[TopicPartition]>) {
        let closed: Vec<Arc<Reader>> = {
            let mut assigned = self.assigned.lock();
            match partitions {
                Some(partitions) => partitions
                    .iter()
                    .filter_map(|partition| assigned.remove(partition))
                    .collect(),
                None => assigned.drain().map(|(_, reader)| reader).collect(),
            }
        };
        for reader in closed {
            reader.close();
        }
    }
}

/// Routes librdkafka's rebalance callbacks to the engine and keeps the partition readers.
struct RebalanceContext {
    engine: Engine,
    runtime: Handle,
    requests: Arc<Requests>,
    wakeup: Arc<Wakeup>,
    decode: DecodeLimits,
    /// The consumer itself, to split partition queues from inside the callback. Weak: the
    /// consumer owns this context.
    consumer: OnceLock<Weak<KafkaConsumer>>,
    readers: Arc<Readers>,
}

impl ClientContext for RebalanceContext {}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, consumer: &KafkaConsumer, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                let partitions = partitions_of(list);
                // First, so nothing more of these partitions is offered while they drain.
                self.readers.close(Some(&partitions));
                if self.requests.get() == Request::Abandon {
                    // Closing an abandoned consumer: the runtime may be gone, so no draining.
                    info!(
                        ?partitions,
                        "partitions revoked: abandoned, committing what is done"
                    );
                    commit(
                        consumer,
                        &self.engine.abandon(&partitions),
                        CommitMode::Sync,
                    );
                } else {
                    info!(?partitions, "partitions revoked: draining");
                    let offsets = self.runtime.block_on(self.engine.revoke(&partitions));
                    commit(consumer, &offsets, CommitMode::Sync);
                }
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => warn!(%error, "rebalance error"),
        }
    }

    fn post_rebalance(&self, _: &KafkaConsumer, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(list) = rebalance else {
            return;
        };
        let partitions = partitions_of(list);
        info!(?partitions, "partitions assigned");
        self.engine.assign(partitions.iter().cloned());
        // Split after the assignment: assigning resets queue forwarding. Fetching starts
        // asynchronously, so records reach the split queues; any that reached the main queue
        // first are offered by the poll thread before it activates the readers, keeping order.
        if let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) {
            for partition in partitions {
                let split =
                    consumer.split_partition_queue(partition.topic.as_str(), partition.partition.0);
                let Some(queue) = split else {
                    warn!(%partition, "no queue for an assigned partition");
                    continue;
                };
                let reader = Reader::new(
                    partition.clone(),
                    self.engine.clone(),
                    self.decode.clone(),
                    self.runtime.clone(),
                );
                reader.attach(queue);
                let replaced = self.readers.assigned.lock().insert(partition, reader);
                if let Some(replaced) = replaced {
                    replaced.close();
                }
            }
        }
        self.wakeup.notify();
    }
}

/// Pausing needs no call into librdkafka: a partition's reader reads only what the partition
/// has [room](Engine::room) for (see the module docs). Resuming signals the reader, which
/// stopped when the partition was full.
#[derive(Default)]
pub struct QueueFlowControl {
    readers: Arc<Readers>,
}

impl std::fmt::Debug for QueueFlowControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueFlowControl").finish_non_exhaustive()
    }
}

impl FlowControl for QueueFlowControl {
    fn pause(&self, _: &TopicPartition) {}

    fn resume(&self, partition: &TopicPartition) {
        self.readers.signal(partition);
    }
}

/// The librdkafka configuration of the consumer: Prosody's settings, then the overrides.
fn consumer_config(settings: &PollSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.bootstrap_servers)
        .set("group.id", &settings.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("partition.assignment.strategy", "cooperative-sticky")
        // With a queue per partition, librdkafka's prefetch bounds apply per partition,
        // not per consumer: its defaults (64 MiB, 100,000 records) would let a consumer of
        // many partitions buffer gigabytes. A few MiB per partition covers a fetch round
        // trip at full speed.
        .set("queued.max.messages.kbytes", PREFETCH_KBYTES_PER_PARTITION)
        .set("queued.min.messages", PREFETCH_RECORDS_PER_PARTITION)
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
        // librdkafka keeps one fetch request in flight per broker, and a partition whose
        // prefetch queue is full is left out of it. When every partition in the request is
        // caught up, the broker holds it for this long, and a partition that drained its queue
        // meanwhile waits for it before it is fetched again. Under a backlog that happens at
        // every refill, so librdkafka's default (500 ms) stalled a catching-up consumer for up
        // to half a second at a time (the Node.js bench: 0.5 s runs with 100-300 ms gaps, 130k
        // records/s, against 180-190k with 20-100 ms). The poll interval already says how long
        // the consumer may take to notice new records, so it bounds the wait too (never above
        // librdkafka's default); idle, this costs one empty fetch per broker per interval.
        .set(
            "fetch.wait.max.ms",
            fetch_wait_millis(settings.poll_interval),
        );
    for (name, value) in &settings.overrides {
        config.set(name, value);
    }
    config
}

/// The broker's longest wait for records (`fetch.wait.max.ms`) for a poll interval: the
/// interval in whole milliseconds, at least 1 and at most librdkafka's default of 500.
fn fetch_wait_millis(poll_interval: Duration) -> String {
    poll_interval.as_millis().clamp(1, 500).to_string()
}

/// A running poll loop. Stop it with [`PollLoop::stop`]; dropping it stops it too.
pub struct PollLoop {
    requests: Arc<Requests>,
    wakeup: Arc<Wakeup>,
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
        flow: &Arc<QueueFlowControl>,
        runtime: Handle,
    ) -> KafkaResult<Self> {
        let config = consumer_config(settings);
        let wakeup = Arc::new(Wakeup::default());
        let requests = Arc::new(Requests::default());
        let context = RebalanceContext {
            engine: engine.clone(),
            runtime,
            requests: requests.clone(),
            wakeup: wakeup.clone(),
            decode: settings.decode.clone(),
            consumer: OnceLock::new(),
            readers: flow.readers.clone(),
        };
        let mut consumer: KafkaConsumer = config.create_with_context(context)?;
        consumer.set_nonempty_callback({
            let wakeup = wakeup.clone();
            move || wakeup.notify()
        });
        let consumer = Arc::new(consumer);
        // Set before subscribing, so the first assignment can split its queues.
        let _ = consumer.context().consumer.set(Arc::downgrade(&consumer));
        let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;

        let thread = std::thread::Builder::new()
            .name(format!("prosody-poll-{}", settings.group_id))
            .spawn({
                let requests = requests.clone();
                let settings = settings.clone();
                move || poll_until_stopped(&consumer, &engine, &settings, &requests)
            })
            .map_err(|error| {
                rdkafka::error::KafkaError::ClientCreation(format!("poll thread: {error}"))
            })?;
        Ok(Self {
            requests,
            wakeup,
            thread: Some(thread),
        })
    }

    /// Stops polling, drains every partition (within the engine's shutdown timeout), commits,
    /// leaves the group, and waits for the thread to end.
    pub async fn stop(mut self) {
        self.request(Request::Drain);
        if let Some(thread) = self.thread.take() {
            // The thread blocks on the engine's drain; wait for it off the async workers.
            let joined = tokio::task::spawn_blocking(move || thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                error!("poll thread panicked");
            }
        }
    }

    fn request(&self, request: Request) {
        self.requests.ask(request);
        self.wakeup.notify();
    }
}

impl Drop for PollLoop {
    fn drop(&mut self) {
        // After `stop` this changes nothing: the first request wins.
        self.request(Request::Abandon);
    }
}

fn poll_until_stopped(
    consumer: &Arc<KafkaConsumer>,
    engine: &Engine,
    settings: &PollSettings,
    requests: &Requests,
) {
    let context = consumer.context();
    let mut committed: HashMap<TopicPartition, Offset> = HashMap::new();
    let mut last_commit = Instant::now();
    while requests.get() == Request::Poll {
        // The main queue serves rebalances and errors, and holds records fetched before their
        // partition's queue was split; those come first to keep each partition in order, so
        // a new assignment's readers start only after it is drained.
        let received = drain_main_queue(consumer, engine, &settings.decode);
        for reader in context.readers.all() {
            reader.activate();
        }
        if last_commit.elapsed() >= settings.commit_interval {
            commit_changed(consumer, engine, &mut committed);
            last_commit = Instant::now();
        }
        if received == 0 && !context.wakeup.wait(settings.poll_interval) {
            // A quiet poll interval. Readers are signalled by librdkafka and by resumes; this
            // bounds the delay should a signal ever be missed (a read with nothing to read
            // costs one task).
            for reader in context.readers.all() {
                reader.signal();
            }
        }
    }
    // No record is offered after this: what was offered drains below.
    context.readers.close(None);
    let partitions = engine.assigned();
    let offsets = match requests.get() {
        Request::Abandon => engine.abandon(&partitions),
        _ => context.runtime.block_on(engine.revoke(&partitions)),
    };
    commit(consumer, &offsets, CommitMode::Sync);
    // The readers released the partition queues, which hold the consumer, so it closes when
    // dropped. Leaving the group happens then: librdkafka's close runs the revoke callback once
    // more, which finds nothing left to drain.
    consumer.unsubscribe();
}

fn drain_main_queue(consumer: &KafkaConsumer, engine: &Engine, limits: &DecodeLimits) -> usize {
    let mut received = 0;
    while let Some(result) = consumer.poll(Duration::ZERO) {
        match result {
            Ok(record) => {
                receive(engine, &record, limits);
                received += 1;
            }
            Err(error) => warn!(%error, "consumer error"),
        }
    }
    received
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(poll_interval: Duration, overrides: &[(&str, &str)]) -> PollSettings {
        PollSettings {
            bootstrap_servers: "127.0.0.1:9092".to_owned(),
            group_id: "group".to_owned(),
            topics: vec!["topic".to_owned()],
            commit_interval: Duration::from_secs(1),
            poll_interval,
            decode: DecodeLimits::default(),
            overrides: overrides
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn the_broker_waits_for_records_no_longer_than_the_poll_interval() {
        let wait = |interval| {
            consumer_config(&settings(interval, &[]))
                .get("fetch.wait.max.ms")
                .map(str::to_owned)
        };
        assert_eq!(wait(Duration::from_millis(100)).as_deref(), Some("100"));
        assert_eq!(wait(Duration::from_millis(20)).as_deref(), Some("20"));
        assert_eq!(wait(Duration::from_micros(10)).as_deref(), Some("1"));
        assert_eq!(wait(Duration::from_secs(30)).as_deref(), Some("500"));
    }

    #[test]
    fn overrides_are_applied_last() {
        let config = consumer_config(&settings(
            Duration::from_millis(100),
            &[("fetch.wait.max.ms", "250"), ("client.id", "mine")],
        ));
        assert_eq!(config.get("fetch.wait.max.ms"), Some("250"));
        assert_eq!(config.get("client.id"), Some("mine"));
        assert_eq!(config.get("enable.auto.commit"), Some("false"));
    }
}
