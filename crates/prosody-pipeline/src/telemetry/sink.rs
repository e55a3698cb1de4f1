//! The sending end of the telemetry topic.
//!
//! Handlers must neither wait for telemetry nor share their CPU with it. [`TelemetrySink::emit`]
//! puts the event in a bounded queue and returns. A thread of its own, at the lowest scheduling
//! priority (niceness 19), takes events in batches, writes each as JSON and hands it to a
//! [`BestEffortProducer`] created on that thread, so that librdkafka's threads for it inherit
//! the priority. While the handlers keep every CPU busy, the thread gets little of them: the
//! queue fills and events are dropped and counted rather than slowing the handlers down. With
//! CPU to spare, every event is sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use thread_priority::{ThreadPriority, set_current_thread_priority};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::events::LifecycleEvent;
use crate::kafka::best_effort::{BestEffortProducer, BestEffortSettings, DeliveryFailures};
use crate::kafka::producer::{ProducerConfig, ProducerError};

/// How long the sender thread sleeps when it finds the queue empty. Senders never wake it: a
/// thread parked on the queue must be woken by a system call, and at a wake per event or two
/// that cost the handlers' workers more than building the events did.
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

enum Command {
    /// By value: a box would be allocated by a worker and freed by the sender thread, which
    /// glibc's allocator makes slow.
    Event(LifecycleEvent),
    /// Say on the sender when everything before has been delivered or failed, waiting for
    /// librdkafka at most the duration.
    Flush(oneshot::Sender<()>, Duration),
    /// End the thread.
    Stop,
}

/// The sending end of the telemetry topic. Cheap to clone; the thread stops at
/// [`close`](Self::close) or when every clone is dropped.
#[derive(Clone)]
pub struct TelemetrySink {
    commands: mpsc::Sender<Command>,
    dropped: Arc<Dropped>,
    failures: DeliveryFailures,
}

impl TelemetrySink {
    /// Starts the sender thread with a producer made from `config` (its bootstrap servers and
    /// librdkafka overrides), sending to `topic` and queueing at most `capacity` events.
    ///
    /// # Errors
    /// [`SinkError`] when the producer or the thread cannot be made.
    pub fn start(
        config: &ProducerConfig,
        topic: String,
        capacity: usize,
    ) -> Result<Self, SinkError> {
        let (commands, receiver) = mpsc::channel(capacity.max(1));
        let dropped = Arc::new(Dropped::default());
        let (made, producer) = std::sync::mpsc::sync_channel(1);
        let (config, thread_dropped) = (config.clone(), dropped.clone());
        thread::Builder::new()
            .name("prosody-telemetry".to_owned())
            .spawn(move || {
                lower_priority();
                match BestEffortProducer::new(&config, &producer_settings()) {
                    Ok(producer) => {
                        if made.send(Ok(producer.failures())).is_ok() {
                            send_events(&producer, &topic, receiver, &thread_dropped);
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
            commands,
            dropped,
            failures,
        })
    }

    /// Queues the event `build` makes, without waiting; drops it (and counts it) when the queue
    /// is full. The event is only built when the queue has room: a consumer that outruns the
    /// telemetry topic drops most of its events, and building each (its timestamp, a heap
    /// allocation) only to drop it cost the handlers' workers for nothing.
    pub fn emit(&self, build: impl FnOnce() -> LifecycleEvent) {
        // The room may be gone by the send (another worker took it): then the send fails and
        // the event is dropped all the same.
        let queued =
            self.commands.capacity() > 0 && self.commands.try_send(Command::Event(build())).is_ok();
        if !queued {
            self.dropped.count("telemetry queue full");
        }
    }

    /// Events dropped before reaching Kafka: the sink's queue or librdkafka's was full.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped.0.load(Ordering::Relaxed)
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
        let (done, sent) = oneshot::channel();
        if self
            .commands
            .send(Command::Flush(done, within))
            .await
            .is_ok()
        {
            let _ = sent.await;
        }
    }

    /// Flushes and stops the thread, waiting at most `within`.
    pub async fn close(&self, within: Duration) {
        let closed = tokio::time::timeout(within, async {
            self.flush_within(within).await;
            let _ = self.commands.send(Command::Stop).await;
        })
        .await;
        if closed.is_err() {
            warn!("telemetry events not flushed in time: remaining ones dropped");
        }
    }
}

/// Niceness 19 for this thread and the threads it starts. Lowering one's own priority needs no
/// privilege; should the system refuse anyway, events are sent at normal priority.
fn lower_priority() {
    if let Err(error) = set_current_thread_priority(ThreadPriority::Min) {
        debug!(?error, "telemetry thread keeps the normal priority");
    }
}

fn send_events(
    producer: &BestEffortProducer,
    topic: &str,
    mut commands: mpsc::Receiver<Command>,
    dropped: &Dropped,
) {
    let mut payload = Vec::new();
    loop {
        match commands.try_recv() {
            Ok(Command::Event(event)) => {
                payload.clear();
                // Straight to JSON text in a reused buffer: librdkafka copies it.
                if serde_json::to_writer(&mut payload, &event).is_err() {
                    continue;
                }
                if let Err(not_queued) =
                    producer.send(topic, event.key.as_str().as_bytes(), &payload)
                {
                    if not_queued.queue_full() {
                        dropped.count("librdkafka's queue for the telemetry topic is full");
                    } else {
                        // Not the load: this event itself (its size, say).
                        warn!(error = %not_queued, "lifecycle event refused by librdkafka");
                        dropped.count("librdkafka refused the event");
                    }
                }
            }
            Ok(Command::Flush(done, within)) => {
                if !producer.flush_blocking(within) {
                    warn!("lifecycle events not all settled at a telemetry flush");
                }
                let _ = done.send(());
            }
            Ok(Command::Stop) | Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => thread::sleep(TICK),
        }
    }
    debug!("telemetry sink stopped");
}

/// Events dropped before reaching Kafka.
#[derive(Default)]
struct Dropped(AtomicU64);

impl Dropped {
    fn count(&self, why: &'static str) {
        let dropped = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        // Logged at powers of two so a sustained overflow does not flood the log.
        if dropped.is_power_of_two() {
            warn!(dropped, last_reason = why, "lifecycle events dropped");
        }
    }
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
            timestamp_ms: 0,
        }
    }

    fn unreachable() -> ProducerConfig {
        ProducerConfig::new("127.0.0.1:1", "test")
    }

    #[test]
    fn a_full_queue_drops_events_without_building_them() {
        // A queue nothing takes from.
        let (commands, _receiver) = mpsc::channel(2);
        let producer = BestEffortProducer::new(&unreachable(), &producer_settings()).unwrap();
        let sink = TelemetrySink {
            commands,
            dropped: Arc::default(),
            failures: producer.failures(),
        };
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

    /// Niceness of the threads of this process whose name starts with `prefix`
    /// (`/proc/self/task/*/stat`: the name in parentheses, niceness the 17th field after it).
    #[cfg(target_os = "linux")]
    fn niceness_of_threads(prefix: &str) -> Vec<i64> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            .filter_map(|stat| {
                let (name, rest) = stat.split_once('(')?.1.rsplit_once(')')?;
                name.starts_with(prefix)
                    .then(|| rest.split_whitespace().nth(16)?.parse().ok())
                    .flatten()
            })
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_sender_and_its_librdkafka_threads_run_at_the_lowest_priority() {
        let sink = TelemetrySink::start(&unreachable(), "telemetry".to_owned(), 8).unwrap();
        assert_eq!(niceness_of_threads("prosody-telemet"), [19]);
        // librdkafka's main thread of the sink's producer, started from the sender thread.
        assert!(
            niceness_of_threads("rdk:main").contains(&19),
            "{:?}",
            niceness_of_threads("rdk:main")
        );
        sink.close(Duration::from_millis(100)).await;
    }
}
