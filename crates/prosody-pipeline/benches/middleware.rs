//! Cost of the middleware per event, without Kafka: the same events through the bare handler
//! service (what the throughput bench's `core` subject dispatches to) and through the full
//! pipeline-mode stack with the in-memory stores (what its `client` subject does), in one
//! process, alternating over several rounds.
//!
//! The throughput bench measures the middleware's share against real Kafka, but on a shared
//! two-core machine a single pass moves by 20% with other load, which hides changes of a few
//! percent. Here each event is admitted and dispatched as the engine does it (an admission
//! permit, then `dispatch_admitted`), on one thread, so the figure is the CPU the layers add per
//! event and the rounds' medians are stable enough to compare two builds.
//!
//! Run: `cargo bench -p prosody-pipeline --bench middleware [-- ROUNDS]` (default 5 rounds of
//! 200,000 events over 10,000 keys and 8 partitions, ~100-byte payloads with an `id`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use prosody_api::storage::Ttl;
use prosody_api::{
    EventContext, EventHandler, ExciseMessage, HandlerError, Headers, Key, Message, Offset,
    Partition, SlabSize, SystemClock, Timer, Timestamp, Topic,
};
use prosody_pipeline::Event;
use prosody_pipeline::consumer::{
    Admission, Dispatch, Outcome, PermitSlot, SemaphoreAdmission, TaskClass,
};
use prosody_pipeline::dispatch::HandlerService;
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
use prosody_pipeline::scheduler::{FairScheduler, SchedulerSettings};
use prosody_pipeline::telemetry::SpanRelation;
use prosody_pipeline::timers::{TimerSettings, Timers};
use serde_json::{Value, json};
use storage_memory::{MemoryDedupStore, MemoryDeferStore, MemoryTimerStore};
use tokio_util::sync::CancellationToken;

const EVENTS: usize = 200_000;
const KEYS: usize = 10_000;
const PARTITIONS: i32 = 8;
const GROUP: &str = "bench";
/// FEATURES.md section 9's `idempotenceTtlS` default.
const WEEK: Ttl = match Ttl::from_secs(604_800) {
    Some(ttl) => ttl,
    None => panic!("a week is not zero"),
};
/// FEATURES.md section 9's `maxConcurrency` default.
const MAX_CONCURRENCY: usize = 32;

/// A handler that does nothing, as in the throughput bench.
struct NoOp;

#[async_trait]
impl EventHandler for NoOp {
    type Error = HandlerError;

    async fn on_message(&self, _: &dyn EventContext, _: &Message) -> Result<Value, HandlerError> {
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
struct Subject {
    name: &'static str,
    dispatch: Arc<dyn Dispatch>,
    admission: Arc<dyn Admission>,
}

/// The throughput bench's `core`: the handler service alone, first come first served.
fn core() -> Subject {
    Subject {
        name: "core",
        dispatch: Arc::new(StackDispatch::from_service(Arc::new(HandlerService::new(
            Arc::new(NoOp),
        )))),
        admission: Arc::new(SemaphoreAdmission::new(MAX_CONCURRENCY)),
    }
}

/// The client's pipeline-mode stack with every layer at FEATURES.md's defaults, the in-memory
/// stores and no telemetry topic: what the throughput bench's `client` dispatches to.
fn pipeline() -> Subject {
    let timers = Timers::new(
        Arc::new(MemoryTimerStore::new(SlabSize::DEFAULT)),
        GROUP,
        Arc::new(SystemClock),
        TimerSettings::default(),
    );
    let scheduler = Arc::new(FairScheduler::new(SchedulerSettings {
        max_concurrency: MAX_CONCURRENCY,
        failure_weight: 0.3,
        max_wait: Duration::from_secs(120),
        wait_weight: 200.0,
        cache_size: 8192,
    }));
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
            store: Arc::new(MemoryDedupStore::new(SystemClock)),
            cache_size: 8192,
            group_id: GROUP.to_owned(),
            version: "1".to_owned(),
            ttl: WEEK,
        },
        defer: Some(DeferLayer {
            status: DeferStatus::new(&defer),
            settings: defer,
            store: Arc::new(MemoryDeferStore::new()),
            timers: timers.clone(),
            loader: Arc::new(NoReload),
            give_up: Destination::Log,
        }),
        monopolization: Some(MonopolizationLayer {
            settings: MonopolizationSettings {
                threshold: 0.9,
                window: Duration::from_secs(300),
                cache_size: 8192,
            },
            status: MonopolizationStatus::default(),
        }),
        admission: scheduler.clone(),
        timeout: Duration::from_secs(240),
        shutdown_timeout: Duration::from_secs(30),
        telemetry: TelemetryLayer {
            sink: None,
            group_id: Arc::from(GROUP),
            message_spans: SpanRelation::Child,
            timer_spans: SpanRelation::FollowsFrom,
        },
    };
    let handler = HandlerService::new(Arc::new(NoOp)).with_timers(timers);
    Subject {
        name: "pipeline",
        dispatch: Arc::new(StackDispatch::new(settings, handler)),
        admission: scheduler,
    }
}

/// The events of one round: fresh ids each round so deduplication never skips one (as with a
/// fresh topic), keys spread over partitions as Kafka's partitioner would keep them together.
fn events(round: usize) -> Vec<(usize, Event)> {
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
            let event = Event::Message(Message {
                topic: topic.clone(),
                partition: Partition(partition),
                offset: Offset(offset),
                timestamp: Timestamp::from_millis(1_700_000_000_000),
                key: keys[key_index].clone(),
                payload: json!({
                    "type": "bench.event",
                    "id": format!("{round}-{sequence}"),
                    "key": keys[key_index].as_str(),
                    "pad": "x".repeat(40),
                }),
                headers: Headers::default(),
            });
            (slot, event)
        })
        .collect()
}

/// CPU time this thread has run, from the kernel's scheduler statistics (nanoseconds, without
/// the time the hypervisor ran others: on a shared VM the wall clock moves by 10% between
/// identical rounds). `None` where `/proc` does not offer it.
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Mean CPU time per event of `subject` over `events`, admitted and dispatched one at a time
/// (the wall clock when the CPU time is not available).
async fn run(subject: &Subject, events: Vec<(usize, Event)>) -> Duration {
    let cancel: Vec<CancellationToken> =
        (0..PARTITIONS).map(|_| CancellationToken::new()).collect();
    let count = u32::try_from(events.len()).unwrap_or(u32::MAX).max(1);
    let started = Instant::now();
    let cpu_started = thread_cpu();
    for (partition, event) in events {
        let key = event.key().clone();
        let token = cancel[partition].clone();
        let permit = PermitSlot::holding(subject.admission.acquire(&key, TaskClass::Normal).await);
        let outcome = subject
            .dispatch
            .dispatch_admitted(event, token, permit.clone())
            .await;
        drop(permit);
        if outcome != Outcome::Completed {
            eprintln!(
                "middleware bench: {} did not complete an event",
                subject.name
            );
        }
    }
    match (cpu_started, thread_cpu()) {
        (Some(before), Some(after)) => after.saturating_sub(before) / count,
        _ => started.elapsed() / count,
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[(samples.len() - 1) / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|arg| arg != "--bench")
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(5)
        .max(1);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("middleware bench: no runtime: {error}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async {
        // A fresh stack per round, as a fresh subscription has, so no round inherits a store
        // grown by the earlier ones; its caches warm up within the first of 20 events per key.
        let subjects: [fn() -> Subject; 2] = [core, pipeline];
        let mut samples = vec![Vec::new(); subjects.len()];
        let mut names = ["", ""];
        println!(
            "{EVENTS} events, {KEYS} keys, {PARTITIONS} partitions, {rounds} rounds, CPU time per event"
        );
        for round in 0..rounds {
            for ((build, samples), name) in subjects.iter().zip(&mut samples).zip(&mut names) {
                let subject = build();
                *name = subject.name;
                let per_event = run(&subject, events(round)).await;
                println!("round {round} {}: {} ns/event", subject.name, per_event.as_nanos());
                samples.push(per_event);
            }
        }
        let medians: Vec<Duration> = samples.into_iter().map(median).collect();
        for (name, median) in names.iter().zip(&medians) {
            println!("{name} median: {} ns/event", median.as_nanos());
        }
        let (core, pipeline) = (medians[0].as_secs_f64(), medians[1].as_secs_f64());
        println!(
            "middleware per event: {} ns (pipeline/core {:.2}x)",
            medians[1].saturating_sub(medians[0]).as_nanos(),
            pipeline / core
        );
    });
}
