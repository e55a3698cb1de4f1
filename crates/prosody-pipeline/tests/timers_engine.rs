//! The timers runtime inside the engine, without a broker: records are offered to the engine
//! directly and time is a [`ManualClock`], so every case is deterministic. Covers the timers
//! API (upsert, unschedule, clear-and-schedule, `scheduled()`), staging (a failed attempt's
//! writes never land), firing (at or after the time, once, removed only after `on_timer`
//! succeeds), per-key serialization with messages, excise, and revocation.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::storage::{PartitionScope, StoredTimer, TimerStore};
use prosody_api::{
    Clock, EventContext, EventHandler, ExciseMessage, HandlerError, Headers, Key, ManualClock,
    Message, Offset, Partition, SlabId, SlabSize, StorageError, Timer, TimerKind, TimerTime,
    Timestamp, Topic,
};
use prosody_pipeline::consumer::{Engine, EngineLimits, FlowControl, TopicPartition};
use prosody_pipeline::dispatch::HandlerService;
use prosody_pipeline::middleware::failure_policy::{Destination, FailurePolicyLayer};
use prosody_pipeline::middleware::retry::{RetryLayer, RetryPolicy};
use prosody_pipeline::middleware::{Layer, StackDispatch};
use prosody_pipeline::probes::HealthRegistry;
use prosody_pipeline::timers::{TimerSettings, Timers};
use prosody_pipeline::{Event, consumer::Load};
use serde_json::{Value, json};
use storage_memory::MemoryTimerStore;
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, watch};

const GROUP: &str = "timers-engine";
const TOPIC: &str = "t";

/// One call of the timers API, as a record's payload asks for it.
#[derive(Clone, Debug)]
enum Op {
    Schedule(u64),
    Unschedule(u64),
    ClearAndSchedule(u64),
    Clear,
}

/// What a record asks the handler to do, per attempt (the last entry repeats).
#[derive(Clone, Debug, Default)]
struct Script {
    attempts: Vec<(Vec<Op>, Outcome)>,
    block: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Outcome {
    #[default]
    Succeed,
    FailTransient,
    FailPermanent,
}

#[derive(Clone, Debug)]
struct Fired {
    key: String,
    time: TimerTime,
    clock: SystemTime,
    started: Instant,
    finished: Instant,
    scheduled: Vec<TimerTime>,
}

#[derive(Clone, Debug)]
struct Ran {
    key: String,
    offset: i64,
    started: Instant,
    finished: Instant,
}

#[derive(Default)]
struct Seen {
    fired: Vec<Fired>,
    timer_attempts: HashMap<String, usize>,
    messages: Vec<Ran>,
    scheduled: HashMap<i64, Vec<TimerTime>>,
    attempts: HashMap<i64, usize>,
    running: HashSet<String>,
    overlapped: bool,
}

/// A handler driven by its records' scripts; reports every change on a watch channel.
struct Scripted {
    clock: ManualClock,
    base: u64,
    scripts: Mutex<HashMap<i64, Script>>,
    timer_failures: Mutex<HashMap<String, usize>>,
    gate: Arc<Semaphore>,
    seen: Mutex<Seen>,
    changed: watch::Sender<u64>,
}

impl Scripted {
    fn t(&self, offset: u64) -> TimerTime {
        TimerTime::from_secs(self.base + offset)
    }

    fn enter(&self, key: &str) {
        let mut seen = self.seen.lock();
        if !seen.running.insert(key.to_owned()) {
            seen.overlapped = true;
        }
    }

    fn leave(&self, key: &str) {
        self.seen.lock().running.remove(key);
        self.changed.send_modify(|version| *version += 1);
    }

    async fn run(&self, context: &dyn EventContext, ops: &[Op]) {
        for op in ops {
            match *op {
                Op::Schedule(at) => context.schedule(self.t(at)).await,
                Op::Unschedule(at) => context.unschedule(self.t(at)).await,
                Op::ClearAndSchedule(at) => context.clear_and_schedule(self.t(at)).await,
                Op::Clear => context.clear_scheduled().await,
            }
            .expect("timer call");
        }
    }
}

#[async_trait]
impl EventHandler for Scripted {
    type Error = HandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let key = message.key.to_string();
        self.enter(&key);
        let started = Instant::now();
        let offset = message.offset.0;
        let script = self
            .scripts
            .lock()
            .get(&offset)
            .cloned()
            .unwrap_or_default();
        let attempt = {
            let mut seen = self.seen.lock();
            let count = seen.attempts.entry(offset).or_default();
            *count += 1;
            *count - 1
        };
        let (ops, outcome) = script
            .attempts
            .get(attempt)
            .or(script.attempts.last())
            .cloned()
            .unwrap_or_default();
        self.run(context, &ops).await;
        let scheduled = context.scheduled().await.expect("scheduled");
        if script.block {
            self.gate.acquire().await.expect("gate").forget();
        }
        let result = match outcome {
            Outcome::Succeed => {
                let mut seen = self.seen.lock();
                seen.scheduled.insert(offset, scheduled);
                seen.messages.push(Ran {
                    key: key.clone(),
                    offset,
                    started,
                    finished: Instant::now(),
                });
                Ok(Value::Null)
            }
            Outcome::FailTransient => Err(HandlerError::transient("scripted transient failure")),
            Outcome::FailPermanent => Err(HandlerError::permanent("scripted permanent failure")),
        };
        self.leave(&key);
        result
    }

    async fn on_excise(
        &self,
        context: &dyn EventContext,
        excise: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        let key = excise.key.to_string();
        self.enter(&key);
        context.clear_scheduled().await.expect("clear");
        self.leave(&key);
        Ok(Value::Null)
    }

    async fn on_timer(
        &self,
        context: &dyn EventContext,
        timer: &Timer,
    ) -> Result<(), HandlerError> {
        let key = timer.key.to_string();
        self.enter(&key);
        let started = Instant::now();
        let scheduled = context.scheduled().await.expect("scheduled");
        self.seen
            .lock()
            .timer_attempts
            .entry(key.clone())
            .and_modify(|count| *count += 1)
            .or_insert(1);
        let fail = {
            let mut failures = self.timer_failures.lock();
            failures.get_mut(&key).is_some_and(|left| {
                let fail = *left > 0;
                *left = left.saturating_sub(1);
                fail
            })
        };
        if !fail {
            self.seen.lock().fired.push(Fired {
                key: key.clone(),
                time: timer.time,
                clock: self.clock.now(),
                started,
                finished: Instant::now(),
                scheduled,
            });
        }
        self.leave(&key);
        if fail {
            Err(HandlerError::transient("scripted timer failure"))
        } else {
            Ok(())
        }
    }
}

struct NoFlow;

impl FlowControl for NoFlow {
    fn pause(&self, _: &TopicPartition) {}
    fn resume(&self, _: &TopicPartition) {}
}

struct Rig {
    engine: Engine,
    timers: Timers,
    store: MemoryTimerStore,
    clock: ManualClock,
    handler: Arc<Scripted>,
    partition: TopicPartition,
    next_offset: AtomicI64,
}

/// Slabs of 60 s, and a start aligned to a slab so cases can reason about slab boundaries.
fn rig_with(store: MemoryTimerStore, clock: ManualClock) -> Rig {
    rig_over(Arc::new(store.clone()), store, clock)
}

/// A rig whose runtime uses `timers_store` (which must keep its timers in `store`).
fn rig_over(timers_store: Arc<dyn TimerStore>, store: MemoryTimerStore, clock: ManualClock) -> Rig {
    // Every rig counts seconds from the manual clock's fixed start (a multiple of 60), so two
    // rigs sharing a clock agree on what `t(n)` means.
    let base = ManualClock::DEFAULT_START_SECS;
    let handler = Arc::new(Scripted {
        clock: clock.clone(),
        base,
        scripts: Mutex::default(),
        timer_failures: Mutex::default(),
        gate: Arc::new(Semaphore::new(0)),
        seen: Mutex::default(),
        changed: watch::channel(0).0,
    });
    let timers = Timers::new(
        timers_store,
        GROUP,
        Arc::new(clock.clone()),
        TimerSettings {
            recheck_interval: Duration::from_millis(5),
            ..TimerSettings::default()
        },
    );
    // Pipeline mode's failure handling without the other layers: transient failures retried
    // until they succeed, permanent ones logged and given up (which removes a fired timer).
    let handle = HandlerService::new(handler.clone()).with_timers(timers.clone());
    let retried = Box::new(RetryLayer {
        policy: RetryPolicy {
            base: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        max_retries: None,
    })
    .wrap(handle);
    let dispatch = StackDispatch::from_service(Arc::new(
        Box::new(FailurePolicyLayer {
            destination: Destination::Log,
            timers: Some(timers.clone()),
        })
        .wrap(retried),
    ));
    let engine = Engine::with_timers(
        EngineLimits {
            max_concurrency: 8,
            max_uncommitted: 64,
            shutdown_timeout: Duration::from_secs(5),
        },
        Arc::new(dispatch),
        Arc::new(NoFlow),
        HealthRegistry::new(),
        Handle::current(),
        timers.clone(),
    );
    let partition = TopicPartition::new(TOPIC, 0);
    engine.assign([partition.clone()]);
    Rig {
        engine,
        timers,
        store,
        clock,
        handler,
        partition,
        next_offset: AtomicI64::new(0),
    }
}

fn rig() -> Rig {
    rig_with(
        MemoryTimerStore::new(SlabSize::from_secs(60).unwrap()),
        ManualClock::new(),
    )
}

impl Rig {
    fn t(&self, offset: u64) -> TimerTime {
        self.handler.t(offset)
    }

    /// Offers a record of `key` running `script`; returns its offset.
    fn send(&self, key: &str, script: Script) -> i64 {
        let offset = self.next_offset.fetch_add(1, Ordering::SeqCst);
        self.handler.scripts.lock().insert(offset, script);
        self.engine.offer(
            &self.partition,
            Event::Message(Message {
                topic: Topic::from(TOPIC),
                partition: Partition(0),
                offset: Offset(offset),
                timestamp: Timestamp::from_millis(0),
                key: Key::from(key),
                payload: json!({}).into(),
                headers: Headers::new(),
            }),
        );
        offset
    }

    fn send_ops(&self, key: &str, ops: Vec<Op>) -> i64 {
        self.send(
            key,
            Script {
                attempts: vec![(ops, Outcome::Succeed)],
                block: false,
            },
        )
    }

    fn excise(&self, key: &str) {
        let offset = self.next_offset.fetch_add(1, Ordering::SeqCst);
        self.engine.offer(
            &self.partition,
            Event::Excise(ExciseMessage {
                topic: Topic::from(TOPIC),
                partition: Partition(0),
                offset: Offset(offset),
                timestamp: Timestamp::from_millis(0),
                key: Key::from(key),
                headers: Headers::new(),
            }),
        );
    }

    /// Waits (at most 10 s) until `condition` holds over what the handler saw.
    async fn until(&self, what: &str, mut condition: impl FnMut(&Seen) -> bool) {
        let mut changes = self.handler.changed.subscribe();
        let reached = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if condition(&self.handler.seen.lock()) {
                    return;
                }
                changes.changed().await.expect("handler alive");
            }
        })
        .await;
        assert!(reached.is_ok(), "timed out waiting for: {what}");
    }

    /// Waits until the engine has nothing queued or running (the handler's last change may
    /// precede the engine's bookkeeping by a moment).
    async fn until_idle(&self) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.engine.load() != Load::default()
                || self
                    .timers
                    .stats(&self.partition)
                    .is_some_and(|stats| stats.in_flight > 0 || stats.loading)
            {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("engine idle");
    }

    async fn stored(&self, key: &str) -> Vec<TimerTime> {
        self.store
            .scheduled(
                &PartitionScope::new(GROUP, TOPIC, Partition(0)),
                &Key::from(key),
                TimerKind::Application,
            )
            .await
            .unwrap()
    }

    fn advance_to(&self, offset: u64) {
        self.clock.set(self.t(offset).to_system_time());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_unschedule_clear_and_schedule_and_scheduled_lists_exactly_the_pending() {
    let rig = rig();
    let first = rig.send_ops(
        "a",
        vec![
            Op::Schedule(100),
            Op::Schedule(100),
            Op::Schedule(200),
            Op::Unschedule(200),
            Op::Schedule(300),
        ],
    );
    rig.until("first message", |seen| seen.scheduled.contains_key(&first))
        .await;
    rig.until_idle().await;
    let expected = vec![rig.t(100), rig.t(300)];
    assert_eq!(
        rig.handler.seen.lock().scheduled[&first],
        expected,
        "the handler's view"
    );
    assert_eq!(rig.stored("a").await, expected, "the store after commit");

    let second = rig.send_ops("a", vec![Op::ClearAndSchedule(400)]);
    rig.until("second", |seen| seen.scheduled.contains_key(&second))
        .await;
    rig.until_idle().await;
    assert_eq!(rig.handler.seen.lock().scheduled[&second], vec![rig.t(400)]);
    assert_eq!(rig.stored("a").await, vec![rig.t(400)]);

    let third = rig.send_ops("a", vec![Op::Clear]);
    rig.until("third", |seen| seen.scheduled.contains_key(&third))
        .await;
    rig.until_idle().await;
    assert_eq!(rig.handler.seen.lock().scheduled[&third], vec![]);
    assert_eq!(rig.stored("a").await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempts_timer_writes_never_land() {
    let rig = rig();
    let retried = rig.send(
        "b",
        Script {
            attempts: vec![
                (vec![Op::Schedule(50)], Outcome::FailTransient),
                (vec![Op::Schedule(55)], Outcome::FailTransient),
                (vec![Op::Schedule(60)], Outcome::Succeed),
            ],
            block: false,
        },
    );
    rig.until("retried record done", |seen| {
        seen.scheduled.contains_key(&retried)
    })
    .await;
    rig.until_idle().await;
    assert_eq!(rig.handler.seen.lock().attempts[&retried], 3);
    assert_eq!(
        rig.stored("b").await,
        vec![rig.t(60)],
        "only the successful attempt's timer"
    );

    let given_up = rig.send(
        "b",
        Script {
            attempts: vec![(vec![Op::Clear, Op::Schedule(70)], Outcome::FailPermanent)],
            block: false,
        },
    );
    rig.until("permanent failure attempted", |seen| {
        seen.attempts.contains_key(&given_up)
    })
    .await;
    rig.until_idle().await;
    assert_eq!(
        rig.stored("b").await,
        vec![rig.t(60)],
        "nothing of it landed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_fire_once_never_early_and_leave_the_store_after_success() {
    let rig = rig();
    for index in 0..10_u64 {
        // Two slabs: seconds 55..=64 straddle the boundary at 60.
        rig.send_ops(&format!("k{index}"), vec![Op::Schedule(55 + index)]);
    }
    rig.send_ops("far", vec![Op::Schedule(10_000)]);
    rig.until("scheduled", |seen| seen.scheduled.len() == 11)
        .await;
    rig.until_idle().await;
    let stats = rig.timers.stats(&rig.partition).unwrap();
    assert_eq!(
        stats.pending, 10,
        "the far-future timer stays in the store: {stats:?}"
    );

    for second in 50..=70_u64 {
        rig.advance_to(second);
        let due = usize::try_from(second.saturating_sub(54).min(10)).unwrap();
        rig.until(&format!("{due} fired at +{second}"), |seen| {
            seen.fired.len() >= due
        })
        .await;
    }
    rig.until_idle().await;
    let fired_timers = rig.handler.seen.lock().fired.clone();
    assert_eq!(fired_timers.len(), 10, "each timer once: {fired_timers:?}");
    for fired in &fired_timers {
        assert!(
            fired.clock >= fired.time.to_system_time(),
            "fired early: {fired:?}"
        );
        assert!(
            !fired.scheduled.contains(&fired.time),
            "the firing timer is not pending in its own handler: {fired:?}"
        );
    }
    for index in 0..10 {
        assert_eq!(rig.stored(&format!("k{index}")).await, vec![]);
    }
    assert_eq!(rig.stored("far").await, vec![rig.t(10_000)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_timer_stays_stored_until_on_timer_succeeds() {
    let rig = rig();
    rig.handler.timer_failures.lock().insert("c".to_owned(), 2);
    rig.send_ops("c", vec![Op::Schedule(5)]);
    rig.until("scheduled", |seen| seen.scheduled.len() == 1)
        .await;
    rig.until_idle().await;
    rig.advance_to(5);
    rig.until("timer handled", |seen| !seen.fired.is_empty())
        .await;
    rig.until_idle().await;
    assert_eq!(rig.handler.seen.lock().timer_attempts["c"], 3);
    assert_eq!(rig.stored("c").await, vec![]);
    assert_eq!(rig.handler.seen.lock().fired.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_timer_waits_for_its_running_message() {
    let rig = rig();
    rig.send_ops("d", vec![Op::Schedule(3)]);
    rig.until("scheduled", |seen| seen.scheduled.len() == 1)
        .await;
    rig.until_idle().await;
    let blocked = rig.send(
        "d",
        Script {
            attempts: vec![(vec![], Outcome::Succeed)],
            block: true,
        },
    );
    tokio::time::timeout(Duration::from_secs(10), async {
        while rig.engine.load().running == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("message running");
    rig.advance_to(3);
    // The timer is due while d's message runs: it must queue behind it, not run beside it.
    tokio::time::timeout(Duration::from_secs(10), async {
        while rig.engine.load().backlog < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("timer queued behind the message");
    assert!(rig.handler.seen.lock().fired.is_empty());
    rig.handler.gate.add_permits(1);
    rig.until("timer fired", |seen| !seen.fired.is_empty())
        .await;
    let seen = rig.handler.seen.lock();
    assert!(!seen.overlapped);
    let message = seen
        .messages
        .iter()
        .find(|ran| ran.offset == blocked)
        .unwrap();
    assert_eq!(message.key, "d");
    assert!(seen.fired[0].started >= message.finished);
    assert!(seen.fired[0].finished >= seen.fired[0].started);
    assert!(message.finished >= message.started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_scheduled_in_on_excise_removes_the_keys_timers() {
    let rig = rig();
    rig.send_ops("gone", vec![Op::Schedule(3), Op::Schedule(4)]);
    rig.send_ops("kept", vec![Op::Schedule(3)]);
    rig.until("scheduled", |seen| seen.scheduled.len() == 2)
        .await;
    rig.excise("gone");
    rig.until_idle().await;
    assert_eq!(rig.stored("gone").await, vec![]);
    rig.advance_to(5);
    rig.until("kept fired", |seen| !seen.fired.is_empty()).await;
    rig.until_idle().await;
    let stats = rig.timers.stats(&rig.partition).unwrap();
    assert_eq!((stats.pending, stats.in_flight), (0, 0));
    let seen = rig.handler.seen.lock();
    let keys: Vec<&str> = seen.fired.iter().map(|fired| fired.key.as_str()).collect();
    assert_eq!(keys, vec!["kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partitions_timers_fire_on_the_next_owner_once() {
    let store = MemoryTimerStore::new(SlabSize::from_secs(60).unwrap());
    let clock = ManualClock::new();
    let old = rig_with(store.clone(), clock.clone());
    for index in 0..20 {
        old.send_ops(&format!("m{index}"), vec![Op::Schedule(2 + index)]);
    }
    old.until("scheduled", |seen| seen.scheduled.len() == 20)
        .await;
    old.advance_to(6);
    old.until("five fired on the old owner", |seen| seen.fired.len() >= 5)
        .await;
    old.engine
        .revoke(std::slice::from_ref(&old.partition))
        .await;
    assert!(
        old.timers.stats(&old.partition).is_none(),
        "manager stopped"
    );
    let fired_by_old = old.handler.seen.lock().fired.len();

    let new = rig_with(store, clock);
    new.advance_to(40);
    new.until("the rest fired on the new owner", |seen| {
        seen.fired.len() + fired_by_old >= 20
    })
    .await;
    new.until_idle().await;
    let mut keys: Vec<String> = old
        .handler
        .seen
        .lock()
        .fired
        .iter()
        .chain(new.handler.seen.lock().fired.iter())
        .map(|fired| fired.key.clone())
        .collect();
    assert_eq!(
        old.handler.seen.lock().fired.len(),
        fired_by_old,
        "old owner stopped firing"
    );
    keys.sort();
    let mut expected: Vec<String> = (0..20).map(|index| format!("m{index}")).collect();
    expected.sort();
    assert_eq!(keys, expected, "every timer fired once across both owners");
}

/// The memory store, failing its next `fail_loads` slab reads and `fail_writes` writes with a
/// transient error.
#[derive(Debug)]
struct Flaky {
    inner: MemoryTimerStore,
    fail_loads: AtomicUsize,
    fail_writes: AtomicUsize,
}

impl Flaky {
    fn fail(counter: &AtomicUsize, operation: &'static str) -> Result<(), StorageError> {
        let failing = counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failing {
            Err(StorageError::backend(operation, "scripted outage"))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl TimerStore for Flaky {
    fn slab_size(&self) -> SlabSize {
        self.inner.slab_size()
    }

    async fn schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        Self::fail(&self.fail_writes, "timer.schedule")?;
        self.inner.schedule(scope, key, kind, time).await
    }

    async fn clear_and_schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        Self::fail(&self.fail_writes, "timer.clear_and_schedule")?;
        self.inner.clear_and_schedule(scope, key, kind, time).await
    }

    async fn unschedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        Self::fail(&self.fail_writes, "timer.unschedule")?;
        self.inner.unschedule(scope, key, kind, time).await
    }

    async fn clear(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<(), StorageError> {
        Self::fail(&self.fail_writes, "timer.clear")?;
        self.inner.clear(scope, key, kind).await
    }

    async fn scheduled(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError> {
        self.inner.scheduled(scope, key, kind).await
    }

    async fn slab(
        &self,
        scope: &PartitionScope,
        slab: SlabId,
    ) -> Result<Vec<StoredTimer>, StorageError> {
        Self::fail(&self.fail_loads, "timer.slab")?;
        self.inner.slab(scope, slab).await
    }

    async fn slabs(
        &self,
        scope: &PartitionScope,
        until: SlabId,
    ) -> Result<Vec<SlabId>, StorageError> {
        self.inner.slabs(scope, until).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_failures_delay_timers_but_lose_nothing() {
    let store = MemoryTimerStore::new(SlabSize::from_secs(60).unwrap());
    let clock = ManualClock::new();
    // Timers already stored when the partition is assigned, as after a restart.
    let scope = PartitionScope::new(GROUP, TOPIC, Partition(0));
    for index in 0..5_u64 {
        store
            .schedule(
                &scope,
                &Key::from(format!("s{index}").as_str()),
                TimerKind::Application,
                TimerTime::from_secs(ManualClock::DEFAULT_START_SECS + 1 + index),
            )
            .await
            .unwrap();
    }
    let flaky = Arc::new(Flaky {
        inner: store.clone(),
        fail_loads: AtomicUsize::new(2),
        fail_writes: AtomicUsize::new(0),
    });
    let rig = rig_over(flaky.clone(), store, clock);
    rig.advance_to(10);
    rig.until("stored timers fire after the loads recover", |seen| {
        seen.fired.len() == 5
    })
    .await;
    assert_eq!(
        flaky.fail_loads.load(Ordering::SeqCst),
        0,
        "both failures hit"
    );
    // The fired timers' removals are writes too: let them land before failing the next one.
    rig.until_idle().await;

    // A commit that fails is a failed attempt: the handler runs again and its writes land
    // once it succeeds.
    flaky.fail_writes.store(1, Ordering::SeqCst);
    let offset = rig.send_ops("w", vec![Op::Schedule(30)]);
    rig.until("record handled", |seen| {
        seen.scheduled.contains_key(&offset)
    })
    .await;
    rig.until_idle().await;
    assert_eq!(rig.handler.seen.lock().attempts[&offset], 2);
    assert_eq!(rig.stored("w").await, vec![rig.t(30)]);
    rig.advance_to(30);
    rig.until("its timer fires", |seen| seen.fired.len() == 6)
        .await;
    rig.until_idle().await;
    for index in 0..5 {
        assert_eq!(rig.stored(&format!("s{index}")).await, vec![]);
    }
    assert_eq!(rig.stored("w").await, vec![]);
}
