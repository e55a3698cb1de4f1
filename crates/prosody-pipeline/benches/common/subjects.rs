//! The subjects of the middleware benches (`middleware`: CPU time per event, and
//! `middleware_allocations`: heap allocations per event): the bare handler service and the
//! pipeline-mode stack at FEATURES.md's defaults with the in-memory stores, and the events both
//! receive.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prosody_api::storage::Ttl;
use prosody_api::{
    CoarseSystemClock, ConsumerGroup, EventContext, EventHandler, ExciseMessage, HandlerError,
    Headers, Key, Message, Offset, Partition, Payload, SlabSize, SystemClock, Timer, Timestamp,
    Topic,
};
use prosody_pipeline::Event;
use prosody_pipeline::consumer::{
    Admission, CancelSignal, CancelWatch, Dispatch, Outcome, PermitSlot, SemaphoreAdmission,
    TaskClass, admit,
};
use prosody_pipeline::dispatch::HandlerService;
use prosody_pipeline::kafka::ProducerConfig;
use prosody_pipeline::kafka::loader::{LoadError, LoadRecord};
use prosody_pipeline::middleware::dedup::DedupLayer;
use prosody_pipeline::middleware::defer::{DeferLayer, DeferSettings, DeferStatus, NewFailures};
use prosody_pipeline::middleware::failure_policy::Destination;
use prosody_pipeline::middleware::monopolization::{
    MonopolizationLayer, MonopolizationSettings, MonopolizationStatus,
};
use prosody_pipeline::middleware::retry::RetryPolicy;
use prosody_pipeline::middleware::telemetry::TelemetryLayer;
use prosody_pipeline::middleware::{ModePolicy, StackDispatch, StackSettings};
use prosody_pipeline::monotonic;
use prosody_pipeline::scheduler::{FairScheduler, SchedulerSettings};
use prosody_pipeline::telemetry::{SpanRelation, TelemetrySink};
use prosody_pipeline::timers::{TimerSettings, Timers};
use serde_json::{Value, json};
use storage_memory::{MemoryDedupStore, MemoryDeferStore, MemoryTimerStore};

pub const EVENTS: usize = 200_000;
pub const KEYS: usize = 10_000;
pub const PARTITIONS: i32 = 8;
const GROUP: &str = "bench";
/// FEATURES.md section 9's `idempotenceTtlS` default.
const WEEK: Ttl = match Ttl::from_secs(604_800) {
    Some(ttl) => ttl,
    None => panic!("a week is not zero"),
};
/// FEATURES.md section 9's `maxConcurrency` default.
const MAX_CONCURRENCY: usize = 32;

/// A handler that does nothing, as in the throughput bench: at once, or after suspending once
/// as an asynchronous handler does (the Node.js binding's waits for JavaScript's promise), so
/// the layers' work for a pending attempt and the wake that resumes it are counted too.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NoOp {
    AtOnce,
    Suspending,
}

#[async_trait]
impl EventHandler for NoOp {
    type Error = HandlerError;

    async fn on_message(&self, _: &dyn EventContext, _: &Message) -> Result<Value, HandlerError> {
        if *self == Self::Suspending {
            suspend_once().await;
        }
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        _: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Pending once, woken at once: the wake goes straight to the task, as a completion does, where
/// `tokio::task::yield_now` would also poll the runtime's I/O driver (a system call) each time.
async fn suspend_once() {
    let mut suspended = false;
    std::future::poll_fn(|context| {
        if suspended {
            std::task::Poll::Ready(())
        } else {
            suspended = true;
            context.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Nothing is ever deferred here, so nothing is reloaded.
struct NoReload;

#[async_trait]
impl LoadRecord for NoReload {
    async fn load(&self, _: &Topic, _: Partition, _: Offset) -> Result<Event, LoadError> {
        Err(LoadError::Kafka(
            "the middleware bench never reloads".to_owned(),
        ))
    }

    fn forget(&self, _: &Topic, _: Partition, _: Offset) {}
}

/// A dispatch and the admission the engine would acquire its permits from.
pub struct Subject {
    pub name: &'static str,
    pub dispatch: Arc<dyn Dispatch>,
    pub admission: Arc<dyn Admission>,
    /// Whether the subject's events carry a payload `id` (only those are deduplicated).
    pub ids: bool,
}

/// The subjects, in the order the benches run them.
pub const SUBJECTS: [fn() -> Subject; 2] = [core, pipeline];

/// The pipeline with one part left out or replaced, each named for what it lacks: run by name
/// (`--only`), the difference to `pipeline` is what that part costs per event. The timeout and
/// telemetry layers are in every stack and have no variant.
pub const VARIANTS: [fn() -> Subject; 4] = [
    || pipeline_without(Part::Dedup),
    || pipeline_without(Part::Defer),
    || pipeline_without(Part::Monopolization),
    || pipeline_without(Part::FairScheduler),
];

/// Both subjects with a handler that suspends once per message before answering (run by name,
/// `--only`): the difference to the plain subject is what a pending handler costs, the case of
/// every event in the Node.js binding.
pub const SUSPENDING: [fn() -> Subject; 2] = [
    || core_of("core-suspending", NoOp::Suspending),
    || pipeline_of("pipeline-suspending", None, NoOp::Suspending),
];

/// The pipeline emitting its lifecycle events into a telemetry sink (run by name, `--only`):
/// the difference to `pipeline` is what emitting costs the handler's thread. The sink's producer
/// points at a port nothing listens on, so its sender thread serializes and queues the events
/// (librdkafka refuses them once its queue is full) and no broker shares the CPU.
pub const TELEMETRY: [fn() -> Subject; 1] = [|| {
    let sink = TelemetrySink::start(
        &ProducerConfig::new("127.0.0.1:1", GROUP),
        "bench-telemetry".to_owned(),
        TELEMETRY_QUEUE,
    )
    .unwrap_or_else(|error| panic!("middleware bench: no telemetry sink: {error}"));
    pipeline_emitting("pipeline-telemetry", None, NoOp::AtOnce, Some(sink))
}];

/// The client's room per worker for lifecycle events between the sender's turns.
const TELEMETRY_QUEUE: usize = 8_192;

/// A part of the pipeline a variant goes without.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Payloads carry no `id`, so the dedup layer only looks for one.
    Dedup,
    Defer,
    Monopolization,
    /// A first come, first served semaphore admits instead.
    FairScheduler,
}

/// Admits and dispatches `event` as the engine does: a permit from the subject's admission,
/// then `dispatch_admitted`, the permit dropped after the outcome is recorded. `cancel` is the
/// event's partition's, enlisted by the task that dispatches, as a runner's is.
pub async fn dispatch_one(subject: &Subject, event: Event, cancel: &CancelWatch) {
    let key = event.key().clone();
    let permit = PermitSlot::holding(admit(&*subject.admission, &key, TaskClass::Normal).await);
    let outcome = subject
        .dispatch
        .dispatch_admitted(&event, cancel, &permit)
        .await;
    drop(permit);
    if outcome != Outcome::Completed {
        eprintln!(
            "middleware bench: {} did not complete an event",
            subject.name
        );
    }
}

/// One cancellation per partition, each enlisted by the calling task (which dispatches the
/// events, as a runner does).
pub async fn partition_watches() -> Vec<CancelWatch> {
    let mut watches = Vec::new();
    for _ in 0..PARTITIONS {
        watches.push(Arc::new(CancelSignal::new()).enlist().await);
    }
    watches
}

/// The throughput bench's `core`: the handler service alone, first come first served.
pub fn core() -> Subject {
    core_of("core", NoOp::AtOnce)
}

fn core_of(name: &'static str, handler: NoOp) -> Subject {
    Subject {
        name,
        dispatch: Arc::new(StackDispatch::from_service(Arc::new(HandlerService::new(
            Arc::new(handler),
        )))),
        admission: Arc::new(SemaphoreAdmission::new(MAX_CONCURRENCY)),
        ids: true,
    }
}

/// The client's pipeline-mode stack with every layer at FEATURES.md's defaults, the in-memory
/// stores and no telemetry topic: what the throughput bench's `client` dispatches to.
pub fn pipeline() -> Subject {
    pipeline_of("pipeline", None, NoOp::AtOnce)
}

fn pipeline_without(part: Part) -> Subject {
    let name = match part {
        Part::Dedup => "pipeline-without-dedup",
        Part::Defer => "pipeline-without-defer",
        Part::Monopolization => "pipeline-without-monopolization",
        Part::FairScheduler => "pipeline-with-semaphore",
    };
    pipeline_of(name, Some(part), NoOp::AtOnce)
}

fn pipeline_of(name: &'static str, without: Option<Part>, handler: NoOp) -> Subject {
    pipeline_emitting(name, without, handler, None)
}

/// The pipeline, its lifecycle events going to `sink` when there is one.
fn pipeline_emitting(
    name: &'static str,
    without: Option<Part>,
    handler: NoOp,
    sink: Option<TelemetrySink>,
) -> Subject {
    let has = |part| without != Some(part);
    let timers = Timers::new(
        Arc::new(MemoryTimerStore::new(SlabSize::DEFAULT)),
        GROUP,
        Arc::new(SystemClock),
        TimerSettings::default(),
    );
    let admission: Arc<dyn Admission> = if has(Part::FairScheduler) {
        Arc::new(FairScheduler::new(SchedulerSettings {
            max_concurrency: MAX_CONCURRENCY,
            failure_weight: 0.3,
            max_wait: Duration::from_secs(120),
            wait_weight: 200.0,
            cache_size: 8192,
        }))
    } else {
        Arc::new(SemaphoreAdmission::new(MAX_CONCURRENCY))
    };
    let retry = RetryPolicy {
        base: Duration::from_millis(20),
        max_delay: Duration::from_secs(300),
    };
    let defer = DeferSettings {
        new_failures: NewFailures::Defer,
        base: Duration::from_secs(1),
        max_delay: Duration::from_secs(24 * 3600),
        failure_threshold: 0.9,
        failure_window: Duration::from_secs(300),
        min_samples: 20,
        cache_size: 8192,
    };
    let settings = StackSettings {
        mode: ModePolicy::Pipeline,
        group_id: GROUP.to_owned(),
        allowed_events: Vec::new(),
        failures: Destination::Log,
        timers: Some(timers.clone()),
        retry,
        dedup: DedupLayer {
            store: Arc::new(MemoryDedupStore::new(CoarseSystemClock)),
            cache_size: 8192,
            group_id: GROUP.to_owned(),
            version: "1".to_owned(),
            ttl: WEEK,
        },
        defer: has(Part::Defer).then(|| DeferLayer {
            status: DeferStatus::new(&defer),
            settings: defer,
            store: Arc::new(MemoryDeferStore::new()),
            timers: timers.clone(),
            loader: Arc::new(NoReload),
            give_up: Destination::Log,
        }),
        monopolization: has(Part::Monopolization).then(|| MonopolizationLayer {
            settings: MonopolizationSettings {
                threshold: 0.9,
                window: Duration::from_secs(300),
                cache_size: 8192,
            },
            status: MonopolizationStatus::default(),
            clock: Arc::new(monotonic::SystemClock),
        }),
        admission: admission.clone(),
        timeout: Duration::from_secs(240),
        shutdown_timeout: Duration::from_secs(30),
        telemetry: TelemetryLayer {
            sink,
            group_id: ConsumerGroup::from(GROUP),
            message_spans: SpanRelation::Child,
            timer_spans: SpanRelation::FollowsFrom,
        },
    };
    let handler = HandlerService::new(Arc::new(handler)).with_timers(timers);
    Subject {
        name,
        dispatch: Arc::new(StackDispatch::new(settings, handler)),
        admission,
        ids: has(Part::Dedup),
    }
}

/// The events of one round: fresh ids each round so deduplication never skips one (as with a
/// fresh topic), keys spread over partitions as Kafka's partitioner would keep them together.
/// Without `ids` the payloads have `"id": null` instead: not deduplicated, and one string
/// fewer to free (a few dozen instructions of the difference).
pub fn events(round: usize, ids: bool) -> Vec<(usize, Event)> {
    let topic = Topic::from("bench-topic");
    let keys: Vec<Key> = (0..KEYS)
        .map(|index| Key::from(format!("key-{index:05}")))
        .collect();
    let mut offsets = [0_i64; PARTITIONS as usize];
    (0..EVENTS)
        .map(|sequence| {
            let key_index = sequence % KEYS;
            let partition = i32::try_from(key_index).unwrap_or(0) % PARTITIONS;
            let slot = usize::try_from(partition).unwrap_or(0);
            let offset = offsets[slot];
            offsets[slot] += 1;
            let document = json!({
                "type": "bench.event",
                "id": if ids { Value::from(format!("{round}-{sequence}")) } else { Value::Null },
                "key": keys[key_index].as_str(),
                "pad": "x".repeat(40),
            });
            // As consumed: the text, checked; the tree is parsed only if something reads it.
            let payload = Payload::from_json(document.to_string())
                .unwrap_or_else(|_| Payload::from(document));
            let event = Event::Message(Message {
                topic: topic.clone(),
                partition: Partition(partition),
                offset: Offset(offset),
                timestamp: Timestamp::from_millis(1_700_000_000_000),
                key: keys[key_index].clone(),
                payload,
                headers: Headers::default(),
            });
            (slot, event)
        })
        .collect()
}
