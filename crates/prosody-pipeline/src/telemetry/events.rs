//! Lifecycle events (dispatched, succeeded, failed) produced as JSON to the telemetry topic.
//!
//! Handlers must not wait for telemetry: [`TelemetrySink::emit`] puts the event in a bounded
//! channel and returns; a background task takes events in batches and sends each batch
//! concurrently (librdkafka batches them again on the wire). When the channel is full the
//! event is dropped and counted rather than slowing the handler down.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use prosody_api::{ConsumerGroup, Key, Topic};

use crate::kafka::producer::{Producer, RawRecord, SendOptions};

/// Events taken from the channel per batch.
const BATCH: usize = 256;

/// Where in its life a handler invocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The handler was called.
    Dispatched,
    /// It returned successfully.
    Succeeded,
    /// It returned an error (or panicked).
    Failed,
}

/// One lifecycle event, as it is written to the telemetry topic.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleEvent {
    /// What was handled: `message`, `excise` or `timer`.
    pub event: &'static str,
    /// The stage.
    pub stage: Stage,
    /// The consumer group handling it.
    pub group_id: ConsumerGroup,
    /// Record key (shared with the record: no copy per event).
    pub key: Key,
    /// Record topic.
    pub topic: Topic,
    /// Record partition.
    pub partition: i32,
    /// Record offset.
    pub offset: Option<i64>,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Handler run time in milliseconds (succeeded and failed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// The failure text (failed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the stage was reached, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
}

impl LifecycleEvent {
    /// Milliseconds since the Unix epoch, now.
    #[must_use]
    pub fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            })
    }
}

enum Command {
    Event(Box<LifecycleEvent>),
    Flush(oneshot::Sender<()>),
}

/// The sending end of the telemetry topic. Cheap to clone; the background task stops when
/// every clone is dropped, after sending what was queued.
#[derive(Clone)]
pub struct TelemetrySink {
    commands: mpsc::Sender<Command>,
    dropped: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: Arc<parking_lot::Mutex<Option<JoinHandle<()>>>>,
}

impl TelemetrySink {
    /// Starts the background task on `runtime`, sending to `topic` with `producer` and
    /// queueing at most `capacity` events.
    #[must_use]
    pub fn start(producer: Producer, topic: String, capacity: usize, runtime: &Handle) -> Self {
        let (commands, receiver) = mpsc::channel(capacity.max(1));
        let failed = Arc::new(AtomicU64::new(0));
        let task = runtime.spawn(send_batches(producer, topic, receiver, failed.clone()));
        Self {
            commands,
            dropped: Arc::new(AtomicU64::new(0)),
            failed,
            task: Arc::new(parking_lot::Mutex::new(Some(task))),
        }
    }

    /// Queues the event `build` makes, without waiting; drops it (and counts it) when the queue
    /// is full. The event is only built when the queue has room: a consumer that outruns the
    /// telemetry topic drops most of its events, and building each (its timestamp, a heap
    /// allocation) only to drop it cost the handlers' workers for nothing.
    pub fn emit(&self, build: impl FnOnce() -> LifecycleEvent) {
        // The room may be gone by the send (another worker took it): then the send fails and
        // the event is dropped all the same.
        let queued = self.commands.capacity() > 0
            && self
                .commands
                .try_send(Command::Event(Box::new(build())))
                .is_ok();
        if !queued {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // Logged at powers of two so a sustained overflow does not flood the log.
            if dropped.is_power_of_two() {
                warn!(dropped, "telemetry queue full: lifecycle events dropped");
            }
        }
    }

    /// Events dropped because the queue was full.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events the telemetry topic did not accept.
    #[must_use]
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Waits until every event queued before the call has been sent (or failed).
    pub async fn flush(&self) {
        let (done, sent) = oneshot::channel();
        if self.commands.send(Command::Flush(done)).await.is_ok() {
            let _ = sent.await;
        }
    }

    /// Flushes and stops the background task, waiting at most `within`.
    pub async fn close(&self, within: Duration) {
        let flushed = tokio::time::timeout(within, self.flush()).await;
        if flushed.is_err() {
            warn!("telemetry events not flushed in time: remaining ones dropped");
        }
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }
}

async fn send_batches(
    producer: Producer,
    topic: String,
    mut commands: mpsc::Receiver<Command>,
    failed: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while commands.recv_many(&mut batch, BATCH).await > 0 {
        let mut flushes = Vec::new();
        let mut sends = Vec::with_capacity(batch.len());
        for command in batch.drain(..) {
            match command {
                Command::Event(event) => {
                    let producer = &producer;
                    let topic = topic.as_str();
                    sends.push(async move {
                        // Straight to JSON text: no tree of values per event on the way.
                        let payload = serde_json::to_vec(&*event).unwrap_or_default();
                        let record = RawRecord {
                            key: Some(event.key.as_str().as_bytes()),
                            value: Some(&payload),
                            headers: &[],
                        };
                        producer
                            .send_raw(topic, record, SendOptions::default())
                            .await
                    });
                }
                Command::Flush(done) => flushes.push(done),
            }
        }
        let results = futures::future::join_all(sends).await;
        let errors: Vec<_> = results.into_iter().filter_map(Result::err).collect();
        if let Some(first) = errors.first() {
            let before = failed.fetch_add(errors.len() as u64, Ordering::Relaxed);
            // A missing telemetry topic fails every batch: log when the total crosses a power
            // of two, so a lasting cause is said a few times rather than once per batch.
            if crossed_power_of_two(before, before + errors.len() as u64) {
                warn!(failed = before + errors.len() as u64, error = %first, %topic,
                    "lifecycle events not sent (does the telemetry topic exist? \
                     telemetryEnabled: false turns telemetry off)");
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
    debug!("telemetry sink stopped");
}

/// Whether a power of two lies in `(before, after]`.
fn crossed_power_of_two(before: u64, after: u64) -> bool {
    after > before && (before == 0 || after.ilog2() > before.ilog2())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::kafka::producer::ProducerConfig;

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

    #[test]
    fn a_full_queue_drops_events_without_building_them() {
        // A runtime nothing drives: the sink's task never takes an event from the queue.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let producer = Producer::new(&ProducerConfig::new("127.0.0.1:1", "test")).unwrap();
        let sink = TelemetrySink::start(producer, "telemetry".to_owned(), 2, runtime.handle());
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
    fn failures_are_logged_when_their_total_crosses_a_power_of_two() {
        let logged: Vec<u64> = (0..100_u64)
            .filter(|before| crossed_power_of_two(*before, before + 1))
            .map(|before| before + 1)
            .collect();
        assert_eq!(logged, [1, 2, 4, 8, 16, 32, 64]);
        assert!(
            crossed_power_of_two(0, 256),
            "the first batch is always said"
        );
        assert!(crossed_power_of_two(300, 600));
        assert!(!crossed_power_of_two(600, 900));
        assert!(!crossed_power_of_two(5, 5));
    }
}
