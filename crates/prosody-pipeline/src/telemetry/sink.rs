//! The sending end of the telemetry topic.
//!
//! Handlers must neither wait for telemetry nor share their CPU with it. [`TelemetrySink::emit`]
//! appends the event to a bounded queue of the calling thread's own and returns. A thread of
//! its own, in the idle scheduling class (see [`lower_priority`]), takes each queue's events
//! every [`TICK`], writes each as JSON and hands it to a [`BestEffortProducer`] created on that
//! thread, so that librdkafka's threads for it inherit the class. While the handlers keep every
//! CPU busy the thread gets little of them: the queues fill and events are dropped and counted
//! rather than slowing the handlers down. With CPU to spare, every event is sent.
//!
//! One queue per worker (see [`crate::thread_shard`]), taken whole by the sender thread, keeps
//! emitting on the worker's own core: its lock is on a line of its own, which the sender thread
//! takes once per tick. Through one channel shared by the workers, every event moved the
//! channel's count of free slots, its tail and the receiver's wake-up state between cores, and
//! a receiver parked on the channel had to be woken by a system call.

use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc as std_mpsc};
use std::thread;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
#[cfg(target_os = "linux")]
use thread_priority::{
    NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
    thread_native_id,
};
use thread_priority::{ThreadPriority, set_current_thread_priority};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::clock::{Moment, WallAnchor};
use super::events::{EventRecord, LifecycleEvent};
use crate::kafka::best_effort::{BestEffortProducer, BestEffortSettings, DeliveryFailures};
use crate::kafka::producer::{ProducerConfig, ProducerError};
use crate::thread_shard::{self, SHARDS};

/// How often the sender thread takes the queued events. Emitting never wakes it.
const TICK: Duration = Duration::from_millis(5);

/// The longest [`TelemetrySink::flush`] waits for librdkafka: every record is delivered or
/// has failed by the delivery timeout; some slack on top.
const FLUSH_BOUND: Duration = Duration::from_secs(35);

/// How the sink's producer batches and gives up.
fn producer_settings() -> BestEffortSettings {
    BestEffortSettings {
        failure_hint: "lifecycle events: does the telemetry topic exist? \
                       telemetryEnabled: false turns telemetry off",
        ..BestEffortSettings::default()
    }
}

/// Why the sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// librdkafka refused the producer's configuration.
    #[error("cannot create the telemetry producer: {0}")]
    Producer(#[from] ProducerError),
    /// The operating system refused a thread.
    #[error("cannot start the telemetry thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// What the sender thread is asked besides sending events.
enum Control {
    /// Say on the sender when everything queued before has been delivered or failed, waiting
    /// for librdkafka at most the duration.
    Flush(oneshot::Sender<()>, Duration),
    /// End the thread after sending what is queued.
    Stop,
}

/// One thread's queue.
#[derive(Default)]
struct Queue {
    events: Vec<LifecycleEvent>,
    /// Events this queue had no room for.
    dropped: u64,
}

/// The queues and counts the emitting threads and the sender thread share.
struct Queues {
    per_thread: [CachePadded<Mutex<Queue>>; SHARDS],
    /// Room of each queue.
    capacity: usize,
    /// Events librdkafka did not take.
    refused: AtomicU64,
}

impl Queues {
    fn new(capacity: usize) -> Self {
        Self {
            per_thread: Default::default(),
            capacity: capacity.max(1),
            refused: AtomicU64::new(0),
        }
    }

    fn dropped(&self) -> u64 {
        let full: u64 = self
            .per_thread
            .iter()
            .map(|queue| queue.lock().dropped)
            .sum();
        full + self.refused.load(Ordering::Relaxed)
    }
}

/// The sending end of the telemetry topic. Cheap to clone; the thread stops at
/// [`close`](Self::close) or when every clone is dropped.
#[derive(Clone)]
pub struct TelemetrySink {
    queues: Arc<Queues>,
    control: std_mpsc::Sender<Control>,
    failures: DeliveryFailures,
}

impl TelemetrySink {
    /// Starts the sender thread with a producer made from `config` (its bootstrap servers and
    /// librdkafka overrides), sending to `topic`; each emitting thread queues at most
    /// `capacity` events between the sender thread's ticks.
    ///
    /// # Errors
    /// [`SinkError`] when the producer or the thread cannot be made.
    pub fn start(
        config: &ProducerConfig,
        topic: String,
        capacity: usize,
    ) -> Result<Self, SinkError> {
        Moment::calibrate();
        let queues = Arc::new(Queues::new(capacity));
        let (control, requests) = std_mpsc::channel();
        let (made, producer) = std_mpsc::sync_channel(1);
        let (config, sender_queues) = (config.clone(), queues.clone());
        thread::Builder::new()
            .name("prosody-telemetry".to_owned())
            .spawn(move || {
                lower_priority();
                match BestEffortProducer::new(&config, &producer_settings()) {
                    Ok(producer) => {
                        if made.send(Ok(producer.failures())).is_ok() {
                            Sender::new(producer, topic, sender_queues).run(&requests);
                        }
                    }
                    Err(error) => {
                        let _ = made.send(Err(error));
                    }
                }
            })?;
        let failures = producer.recv().map_err(|_| {
            std::io::Error::other("the telemetry thread ended before its producer was made")
        })??;
        Ok(Self {
            queues,
            control,
            failures,
        })
    }

    /// Queues the event `build` makes, without waiting; drops it (and counts it) when the
    /// calling thread's queue is full. The event is only built when there is room: a consumer
    /// that outruns the telemetry topic drops most of its events, and building each only to
    /// drop it cost the handlers' workers for nothing.
    pub fn emit(&self, build: impl FnOnce() -> LifecycleEvent) {
        let mut queue = self.queues.per_thread[thread_shard::index()].lock();
        if queue.events.len() < self.queues.capacity {
            queue.events.push(build());
        } else {
            queue.dropped += 1;
        }
    }

    /// Events dropped before reaching Kafka: a queue or librdkafka's was full.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.queues.dropped()
    }

    /// Events handed to Kafka that it did not accept (a missing topic, a broker gone for
    /// longer than the delivery timeout).
    #[must_use]
    pub fn failed(&self) -> u64 {
        self.failures.count()
    }

    /// Waits until every event queued before the call has been delivered or failed.
    pub async fn flush(&self) {
        self.flush_within(FLUSH_BOUND).await;
    }

    async fn flush_within(&self, within: Duration) {
        let (done, flushed) = oneshot::channel();
        if self.control.send(Control::Flush(done, within)).is_ok() {
            let _ = flushed.await;
        }
    }

    /// Flushes and stops the thread, waiting at most `within`.
    pub async fn close(&self, within: Duration) {
        let flushed = tokio::time::timeout(within, self.flush_within(within)).await;
        if flushed.is_err() {
            warn!("telemetry events not flushed in time: remaining ones dropped");
        }
        let _ = self.control.send(Control::Stop);
    }
}

/// Puts this thread and the threads it starts in Linux's idle scheduling class (`SCHED_IDLE`),
/// elsewhere at niceness 19. Niceness alone was not enough: Linux's scheduler (EEVDF) may let a
/// running thread finish its slice before a thread that wakes takes the CPU, whatever their
/// niceness, so a worker woken by a fetch could wait behind the sender's JSON and librdkafka's
/// batching; a thread of the idle class gives way to any other at once. In the throughput
/// bench (eight alternations, one build, lz4), lifecycle events cost the client a median 13.1%
/// of its rate (-6.3 to 19.2%) at niceness 19 and 4.3% (0.5 to 6.4%) in the idle class, which
/// delivered fewer of them while every core was busy (0.10-0.14 per record against 0.16-0.23).
/// Lowering one's own priority needs no privilege; should the system refuse anyway, events are
/// sent at normal priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
        match set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Min, idle) {
            Ok(()) => return,
            Err(error) => debug!(
                ?error,
                "telemetry thread not in the idle class: niceness 19"
            ),
        }
    }
    if let Err(error) = set_current_thread_priority(ThreadPriority::Min) {
        debug!(?error, "telemetry thread keeps the normal priority");
    }
}

/// The sender thread's state.
struct Sender {
    producer: BestEffortProducer,
    topic: String,
    queues: Arc<Queues>,
    /// Emptied queues, handed back to the emitting threads so their room stays allocated.
    spares: Vec<Vec<LifecycleEvent>>,
    /// Events taken from the queues and not sent yet (see `send_queued`).
    batch: Vec<LifecycleEvent>,
    payload: Vec<u8>,
    /// Drops at the last warning.
    dropped_said: u64,
}

impl Sender {
    fn new(producer: BestEffortProducer, topic: String, queues: Arc<Queues>) -> Self {
        Self {
            producer,
            topic,
            queues,
            spares: Vec::new(),
            batch: Vec::new(),
            payload: Vec::new(),
            dropped_said: 0,
        }
    }

    /// Sends what is queued every tick, and flushes when asked, until stopped or every sink
    /// is dropped.
    fn run(mut self, requests: &std_mpsc::Receiver<Control>) {
        loop {
            // Asked before the queues are taken: a flush covers every event queued before it.
            let (asked, ended) = match requests.try_recv() {
                Ok(control) => (Some(control), false),
                Err(std_mpsc::TryRecvError::Empty) => (None, false),
                Err(std_mpsc::TryRecvError::Disconnected) => (None, true),
            };
            // A flush, a stop or the end sends everything; otherwise the newest events may wait
            // a turn (see `send_queued`).
            let anchor = WallAnchor::now();
            let until = (asked.is_none() && !ended).then(|| anchor.moment());
            self.send_queued(until, &anchor);
            match asked {
                Some(Control::Flush(done, within)) => {
                    if !self.producer.flush_blocking(within) {
                        warn!("lifecycle events not all settled at a telemetry flush");
                    }
                    let _ = done.send(());
                }
                // Nothing asked: wait for more events (a flush request waits at most a tick).
                None if !ended => thread::sleep(TICK),
                Some(Control::Stop) | None => break,
            }
        }
        debug!("telemetry sink stopped");
    }

    /// Sends the queued events stamped before `until` (all of them without), in the order they
    /// were emitted, their wall-clock time worked out from `anchor`; later ones wait for the next
    /// turn.
    ///
    /// A record's events may sit in two workers' queues (its handler resumed on another
    /// worker), and the topic should hold a key's events in order. Taking the queues one after
    /// another, this turn may find a record's `succeeded` in a queue taken last but miss its
    /// `dispatched`, queued after its own queue was taken. An event stamped before `until`,
    /// read before any queue is taken, was queued before: this turn has it.
    fn send_queued(&mut self, until: Option<Moment>, anchor: &WallAnchor) {
        let mut batch = mem::take(&mut self.batch);
        for queue in &self.queues.per_thread {
            let mut queue = queue.lock();
            // An idle queue keeps what it has; spare room goes to busy ones.
            if queue.events.is_empty() {
                continue;
            }
            let spare = self.spares.pop().unwrap_or_default();
            let mut taken = mem::replace(&mut queue.events, spare);
            drop(queue);
            batch.append(&mut taken);
            self.spares.push(taken);
        }
        batch.sort_by_key(|event| event.at);
        let ready = until.map_or(batch.len(), |until| {
            batch.partition_point(|event| event.at < until)
        });
        for event in batch.drain(..ready) {
            self.send(&EventRecord::new(&event, anchor));
        }
        // What waits for the next turn.
        self.batch = batch;
        let dropped = self.queues.dropped();
        // Said when the count passes a power of two: a lasting overload is said a few times.
        if crossed_power_of_two(self.dropped_said, dropped) {
            warn!(
                dropped,
                "lifecycle events dropped: the telemetry thread (which gives way to every other) or \
                 librdkafka did not keep up"
            );
            self.dropped_said = dropped;
        }
    }

    fn send(&mut self, record: &EventRecord<'_>) {
        self.payload.clear();
        // Straight to JSON text in a reused buffer: librdkafka copies it.
        if serde_json::to_writer(&mut self.payload, record).is_err() {
            return;
        }
        let key = record.key().as_str().as_bytes();
        if let Err(not_queued) = self.producer.send(&self.topic, key, &self.payload) {
            self.queues.refused.fetch_add(1, Ordering::Relaxed);
            if !not_queued.queue_full() {
                // Not the load: this event itself (its size, say).
                warn!(error = %not_queued, "lifecycle event refused by librdkafka");
            }
        }
    }
}

/// Whether a power of two lies in `(before, after]`.
fn crossed_power_of_two(before: u64, after: u64) -> bool {
    after > before && (before == 0 || after.ilog2() > before.ilog2())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use prosody_api::{ConsumerGroup, Key, Topic};

    use super::*;
    use crate::telemetry::Stage;

    fn event() -> LifecycleEvent {
        LifecycleEvent {
            event: "message",
            stage: Stage::Dispatched,
            group_id: ConsumerGroup::from("g"),
            key: Key::from("k"),
            topic: Topic::from("t"),
            partition: 0,
            offset: Some(0),
            attempt: 1,
            duration_ms: None,
            error: None,
            at: Moment::now(),
        }
    }

    fn unreachable() -> ProducerConfig {
        ProducerConfig::new("127.0.0.1:1", "test")
    }

    /// A sink without a sender thread: nothing takes from its queues.
    fn detached(capacity: usize) -> TelemetrySink {
        let producer = BestEffortProducer::new(&unreachable(), &producer_settings()).unwrap();
        TelemetrySink {
            queues: Arc::new(Queues::new(capacity)),
            control: std_mpsc::channel().0,
            failures: producer.failures(),
        }
    }

    #[test]
    fn a_full_queue_drops_events_without_building_them() {
        let sink = detached(2);
        let built = Cell::new(0);
        for _ in 0..5 {
            sink.emit(|| {
                built.set(built.get() + 1);
                event()
            });
        }
        assert_eq!(built.get(), 2, "built only while the queue had room");
        assert_eq!(sink.dropped(), 3);
    }

    #[test]
    fn each_thread_has_its_own_room() {
        let sink = detached(1);
        sink.emit(event);
        // Slots are handed to threads in turn: one of the next few threads has another slot
        // than this one (other tests' threads take turns too, hence the bound, not one try).
        let mine = thread_shard::index();
        let emitted_elsewhere = (0..100).any(|_| {
            let other = sink.clone();
            std::thread::spawn(move || {
                let elsewhere = thread_shard::index() != mine;
                if elsewhere {
                    other.emit(event);
                }
                elsewhere
            })
            .join()
            .unwrap()
        });
        assert!(emitted_elsewhere);
        assert_eq!(
            sink.dropped(),
            0,
            "the other thread used a queue of its own"
        );
        sink.emit(event);
        assert_eq!(sink.dropped(), 1);
    }

    #[test]
    fn drops_are_said_when_their_total_passes_a_power_of_two() {
        let said: Vec<u64> = (0..100_u64)
            .filter(|before| crossed_power_of_two(*before, before + 1))
            .map(|before| before + 1)
            .collect();
        assert_eq!(said, [1, 2, 4, 8, 16, 32, 64]);
        assert!(
            crossed_power_of_two(0, 300),
            "the first drops are always said"
        );
        assert!(crossed_power_of_two(300, 600));
        assert!(!crossed_power_of_two(600, 900));
        assert!(!crossed_power_of_two(5, 5));
    }

    /// The scheduling policy in a thread's `stat` line: the name in parentheses, the policy
    /// the 39th field after it.
    #[cfg(target_os = "linux")]
    fn policy_in_stat(stat: &str) -> Option<i64> {
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(38)?
            .parse()
            .ok()
    }

    /// The scheduling policy of each thread of this process whose name starts with `prefix`.
    #[cfg(target_os = "linux")]
    fn policies_of_threads(prefix: &str) -> Vec<i64> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                stat.split_once('(')
                    .is_some_and(|(_, rest)| rest.starts_with(prefix))
            })
            .filter_map(|stat| policy_in_stat(&stat))
            .collect()
    }

    /// Linux's `SCHED_IDLE`.
    #[cfg(target_os = "linux")]
    const IDLE_POLICY: i64 = 5;

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_sender_and_its_librdkafka_threads_run_in_the_idle_class() {
        let sink = TelemetrySink::start(&unreachable(), "telemetry".to_owned(), 8).unwrap();
        // Other tests in this process may have senders running too: each is in the idle class.
        let senders = policies_of_threads("prosody-telemet");
        assert!(
            !senders.is_empty() && senders.iter().all(|policy| *policy == IDLE_POLICY),
            "{senders:?}"
        );
        // librdkafka's main thread of the sink's producer, started from the sender thread
        // (other producers' main threads in this process keep the normal class).
        assert!(
            policies_of_threads("rdk:main").contains(&IDLE_POLICY),
            "{:?}",
            policies_of_threads("rdk:main")
        );
        let this_thread = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        assert_eq!(
            policy_in_stat(&this_thread),
            Some(0),
            "the thread that started the sink keeps its class"
        );
        sink.close(Duration::from_millis(100)).await;
    }
}
