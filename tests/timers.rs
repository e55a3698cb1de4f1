//! Durable timers through the client against a real broker, on the in-memory backend: fire
//! once and never early under load (with measured lateness), the timers API through real
//! records, excise, restart over a store that outlives the client, and a rebalance between
//! two clients sharing one store.
//!
//! Runs on the backend `PROSODY_TEST_STORAGE_BACKEND` names (see `common::harness`). The
//! memory backend keeps timers in the client's process, so a plain restart loses them
//! (documented on `ProsodyClient::new`): there the restart and rebalance cases give the clients
//! one store through `ProsodyClient::with_timer_store`. On Cassandra both cases use the
//! configured backend itself (one keyspace, one session per client); on `RocksDB` the restart
//! reopens the first client's directory, and the rebalance (two live clients, which one
//! embedded directory cannot serve) shares one `RocksStore` between them.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use common::harness;
use parking_lot::Mutex;
use prosody::ProsodyClient;
use prosody::api::storage::{PartitionScope, TimerStore};
use prosody::api::{
    EventContext, EventHandler, ExciseMessage, HandlerError, Key, Message, Partition, SlabId,
    SlabSize, Timer, TimerKind, TimerTime,
};
use prosody::config::StorageBackend;
use prosody::config::{ClientOptions, Config};
use serde_json::{Value, json};
use storage_memory::MemoryTimerStore;
use storage_rocksdb::{RocksOptions, RocksStore};
use tokio::sync::watch;

/// One timer that fired, as a handler saw it.
#[derive(Clone, Debug)]
struct Fired {
    client: String,
    key: String,
    time: TimerTime,
    at: SystemTime,
}

/// Everything the handlers of a test saw, with a version counter tests await.
#[derive(Default)]
struct Seen {
    fired: Mutex<Vec<Fired>>,
    scheduled: Mutex<HashMap<String, Vec<TimerTime>>>,
    attempts: Mutex<HashMap<(String, i64), usize>>,
    changes: Mutex<Option<watch::Sender<u64>>>,
}

impl Seen {
    fn new() -> Arc<Self> {
        let seen = Arc::new(Self::default());
        *seen.changes.lock() = Some(watch::channel(0).0);
        seen
    }

    fn changed(&self) {
        if let Some(changes) = self.changes.lock().as_ref() {
            changes.send_modify(|version| *version += 1);
        }
    }

    /// Waits (at most `within`) until `condition` holds.
    async fn until(&self, what: &str, within: Duration, mut condition: impl FnMut(&Self) -> bool) {
        let mut changes = self.changes.lock().as_ref().unwrap().subscribe();
        let reached = tokio::time::timeout(within, async {
            while !condition(self) {
                changes.changed().await.unwrap();
            }
        })
        .await;
        assert!(
            reached.is_ok(),
            "timed out after {within:?} waiting for: {what} ({} fired)",
            self.fired.lock().len()
        );
    }

    fn fired_count(&self) -> usize {
        self.fired.lock().len()
    }
}

/// Runs the timer calls a record's payload lists: `{"ops": [["schedule", secs], ...],
/// "fail_first": n}` (the first `n` attempts fail transiently after making their calls), and
/// records `scheduled()` after them under the record's key.
struct TimerHandler {
    client: String,
    seen: Arc<Seen>,
}

impl TimerHandler {
    fn new(client: &str, seen: &Arc<Seen>) -> Self {
        Self {
            client: client.to_owned(),
            seen: seen.clone(),
        }
    }
}

#[async_trait]
impl EventHandler for TimerHandler {
    type Error = HandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let key = message.key.to_string();
        let attempt = {
            let mut attempts = self.seen.attempts.lock();
            let count = attempts.entry((key.clone(), message.offset.0)).or_default();
            *count += 1;
            *count
        };
        for op in message.payload["ops"].as_array().into_iter().flatten() {
            let name = op[0].as_str().unwrap();
            let time = TimerTime::from_secs(op[1].as_u64().unwrap_or(0));
            match name {
                "schedule" => context.schedule(time).await,
                "unschedule" => context.unschedule(time).await,
                "clear_and_schedule" => context.clear_and_schedule(time).await,
                "clear" => context.clear_scheduled().await,
                other => panic!("unknown op {other}"),
            }
            .map_err(HandlerError::transient)?;
        }
        let fail_first = message.payload["fail_first"].as_u64().unwrap_or(0);
        if u64::try_from(attempt).unwrap() <= fail_first {
            return Err(HandlerError::transient("scripted failure"));
        }
        if message.payload["check"].as_bool().unwrap_or(false) {
            let scheduled = context.scheduled().await.map_err(HandlerError::transient)?;
            self.seen.scheduled.lock().insert(key, scheduled);
        }
        self.seen.changed();
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        context: &dyn EventContext,
        _: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        context
            .clear_scheduled()
            .await
            .map_err(HandlerError::transient)?;
        self.seen.changed();
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, timer: &Timer) -> Result<(), HandlerError> {
        self.seen.fired.lock().push(Fired {
            client: self.client.clone(),
            key: timer.key.to_string(),
            time: timer.time,
            at: SystemTime::now(),
        });
        self.seen.changed();
        Ok(())
    }
}

fn now_secs() -> u64 {
    TimerTime::from_system_time(SystemTime::now()).as_secs()
}

/// Options for timer tests: a one-minute slab so the due window spans slab boundaries and the
/// loader's frontier moves during the test.
fn options(topic: &str, group: &str) -> ClientOptions {
    ClientOptions {
        slab_size_ms: Some(Duration::from_secs(60)),
        ..harness::options(topic, group)
    }
}

/// The store clients of one test share explicitly, when the backend cannot share by itself.
fn shared_store(for_rebalance: bool) -> Option<Arc<dyn TimerStore>> {
    let slab = SlabSize::from_secs(60).unwrap();
    match harness::storage_backend() {
        StorageBackend::Memory => Some(Arc::new(MemoryTimerStore::new(slab))),
        StorageBackend::RocksDb if for_rebalance => Some(Arc::new(
            RocksStore::open_temporary(&RocksOptions::new().with_slab_size(slab)).unwrap(),
        )),
        StorageBackend::RocksDb | StorageBackend::Cassandra => None,
    }
}

async fn client_on(options: ClientOptions, store: Option<&Arc<dyn TimerStore>>) -> ProsodyClient {
    let config = Config::from_options(options).expect("config");
    match store {
        Some(store) => ProsodyClient::with_timer_store(config, store.clone()).await,
        None => ProsodyClient::new(config).await,
    }
    .expect("client")
}

async fn wait_assigned(client: &ProsodyClient, partitions: usize) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while client.assigned_partition_count() < partitions {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("partitions assigned");
}

/// Every timer left in `store` for `group`/`topic`, over `partitions` partitions.
async fn remaining(
    store: &Arc<dyn TimerStore>,
    group: &str,
    topic: &str,
    partitions: i32,
) -> usize {
    let mut count = 0;
    for partition in 0..partitions {
        let scope = PartitionScope::new(group, topic, Partition(partition));
        for slab in store.slabs(&scope, SlabId(u64::MAX)).await.unwrap() {
            count += store.slab(&scope, slab).await.unwrap().len();
        }
    }
    count
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into a short vector"
    )]
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_timers_over_a_thousand_keys_fire_once_and_never_early() {
    const KEYS: u64 = 1_000;
    const PER_KEY: u64 = 10;
    const SPREAD_SECS: u64 = 20;
    let topic = common::unique_name("timers_load");
    let group = common::unique_name("timers_load_group");
    harness::create_topic(&topic, 4).await;
    let client = client_on(options(&topic, &group), None).await;
    let store = client.timer_store().clone();
    let seen = Seen::new();
    client
        .subscribe(TimerHandler::new("a", &seen))
        .await
        .expect("subscribe");
    wait_assigned(&client, 4).await;

    // Due from a few seconds ahead, so every timer is scheduled before the first is due and
    // lateness measures the runtime, not the scheduling.
    let base = now_secs() + 6;
    let expected_total = usize::try_from(KEYS * PER_KEY).unwrap();
    let sends = (0..KEYS).map(|key| {
        // Ten distinct seconds per key, spread over the whole window.
        let ops: Vec<Value> = (0..PER_KEY)
            .map(|index| json!(["schedule", base + (key + 2 * index) % SPREAD_SECS]))
            .collect();
        let client = client.clone();
        let topic = topic.clone();
        async move {
            client
                .send(&topic, &format!("key-{key}"), &json!({ "ops": ops }))
                .await
        }
    });
    for result in futures::future::join_all(sends).await {
        result.expect("send");
    }
    let scheduled_by = now_secs();
    assert!(
        scheduled_by < base,
        "sending took too long for the lateness measurement to mean anything"
    );

    seen.until(
        "every timer fired",
        Duration::from_secs(SPREAD_SECS + 60),
        |seen| seen.fired_count() >= expected_total,
    )
    .await;
    // Nothing left to fire: every fired timer was removed from the store.
    tokio::time::timeout(Duration::from_secs(30), async {
        while remaining(&store, &group, &topic, 4).await > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the store empties once every timer is handled");
    client.shutdown().await.expect("shutdown");

    let fired = seen.fired.lock().clone();
    let mut counts: HashMap<(String, TimerTime), usize> = HashMap::new();
    for timer in &fired {
        *counts.entry((timer.key.clone(), timer.time)).or_default() += 1;
    }
    assert_eq!(counts.len(), expected_total, "every timer fired");
    let repeated: Vec<_> = counts.iter().filter(|(_, count)| **count > 1).collect();
    assert!(repeated.is_empty(), "fired more than once: {repeated:?}");
    let mut lateness: Vec<Duration> = fired
        .iter()
        .map(|timer| {
            timer
                .at
                .duration_since(timer.time.to_system_time())
                .unwrap_or_else(|_| panic!("fired early: {timer:?}"))
        })
        .collect();
    lateness.sort();
    let (p50, p99) = (percentile(&lateness, 0.5), percentile(&lateness, 0.99));
    let max = lateness.last().copied().unwrap_or_default();
    println!(
        "timers: {} fired once each over {SPREAD_SECS} s; lateness p50 {p50:?}, p99 {p99:?}, \
         max {max:?}",
        fired.len()
    );
    assert!(p99 < Duration::from_millis(1_500), "lateness p99 {p99:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timers_api_through_real_records() {
    let topic = common::unique_name("timers_api");
    let group = common::unique_name("timers_api_group");
    harness::create_topic(&topic, 2).await;
    let client = client_on(options(&topic, &group), None).await;
    let store = client.timer_store().clone();
    let seen = Seen::new();
    client
        .subscribe(TimerHandler::new("a", &seen))
        .await
        .expect("subscribe");
    let far = now_secs() + 3_600;
    let t = |offset: u64| TimerTime::from_secs(far + offset);
    let send = |key: &'static str, payload: Value| {
        let client = client.clone();
        let topic = topic.clone();
        async move { client.send(&topic, key, &payload).await.expect("send") }
    };

    // Upsert and unschedule: the same second twice is one timer.
    send(
        "upsert",
        json!({"ops": [["schedule", far], ["schedule", far], ["schedule", far + 5],
            ["unschedule", far + 5], ["schedule", far + 9]], "check": true}),
    )
    .await;
    // Replace everything with one timer.
    send(
        "replace",
        json!({"ops": [["schedule", far + 1], ["schedule", far + 2]]}),
    )
    .await;
    send(
        "replace",
        json!({"ops": [["clear_and_schedule", far + 3]], "check": true}),
    )
    .await;
    // A failed attempt's schedule does not persist; the successful retry's does.
    send(
        "retried",
        json!({"ops": [["schedule", far + 7]], "fail_first": 2, "check": true}),
    )
    .await;
    send(
        "retried",
        json!({"ops": [["unschedule", far + 7], ["schedule", far + 8]], "check": true}),
    )
    .await;
    // Excise: on_excise clears the key's timers.
    send("excised", json!({"ops": [["schedule", far + 4]]})).await;
    client.excise(&topic, "excised").await.expect("excise");
    send("excised", json!({"check": true})).await;

    seen.until("every check recorded", Duration::from_secs(60), |seen| {
        let scheduled = seen.scheduled.lock();
        scheduled.len() == 4
            && scheduled
                .get("retried")
                .is_some_and(|times| times == &[t(8)])
    })
    .await;
    client.shutdown().await.expect("shutdown");

    let scheduled = seen.scheduled.lock().clone();
    assert_eq!(scheduled["upsert"], vec![t(0), t(9)]);
    assert_eq!(scheduled["replace"], vec![t(3)]);
    assert_eq!(scheduled["retried"], vec![t(8)]);
    assert_eq!(scheduled["excised"], vec![]);
    let attempts = seen.attempts.lock().clone();
    assert!(
        attempts
            .iter()
            .any(|((key, _), count)| key == "retried" && *count == 3),
        "the failing record ran three times: {attempts:?}"
    );
    // The store holds exactly what the handlers saw.
    let mut stored: BTreeMap<String, Vec<TimerTime>> = BTreeMap::new();
    for partition in 0..2 {
        let scope = PartitionScope::new(group.as_str(), topic.as_str(), Partition(partition));
        for key in ["upsert", "replace", "retried", "excised"] {
            let times = store
                .scheduled(&scope, &Key::from(key), TimerKind::Application)
                .await
                .unwrap();
            if !times.is_empty() {
                stored.insert(key.to_owned(), times);
            }
        }
    }
    let expected: BTreeMap<String, Vec<TimerTime>> = scheduled
        .into_iter()
        .filter(|(_, times)| !times.is_empty())
        .collect();
    assert_eq!(stored, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_timers_fire_after_a_restart_on_a_store_that_outlives_the_client() {
    const KEYS: u64 = 50;
    let topic = common::unique_name("timers_restart");
    let group = common::unique_name("timers_restart_group");
    harness::create_topic(&topic, 2).await;
    let shared = shared_store(false);
    let options = options(&topic, &group);
    let first = client_on(options.clone(), shared.as_ref()).await;
    let seen = Seen::new();
    first
        .subscribe(TimerHandler::new("first", &seen))
        .await
        .expect("subscribe first");
    let base = now_secs() + 8;
    for key in 0..KEYS {
        first
            .send(
                &topic,
                &format!("key-{key}"),
                &json!({"ops": [["schedule", base + key % 4]], "check": true}),
            )
            .await
            .expect("send");
    }
    seen.until("all scheduled", Duration::from_secs(60), |seen| {
        seen.scheduled.lock().len() == usize::try_from(KEYS).unwrap()
    })
    .await;
    first.shutdown().await.expect("shutdown first");
    assert!(
        now_secs() < base,
        "the first client ended before any timer was due"
    );
    assert_eq!(seen.fired_count(), 0);
    let store = shared
        .clone()
        .unwrap_or_else(|| first.timer_store().clone());
    assert_eq!(
        remaining(&store, &group, &topic, 2).await,
        usize::try_from(KEYS).unwrap()
    );
    // The first client is gone before the second starts: on RocksDB this releases the
    // directory the second reopens.
    drop(store);
    drop(first);

    let second = client_on(options, shared.as_ref()).await;
    second
        .subscribe(TimerHandler::new("second", &seen))
        .await
        .expect("subscribe second");
    seen.until("pending timers fire", Duration::from_secs(60), |seen| {
        seen.fired_count() >= usize::try_from(KEYS).unwrap()
    })
    .await;
    second.shutdown().await.expect("shutdown second");
    let fired = seen.fired.lock().clone();
    assert_eq!(fired.len(), usize::try_from(KEYS).unwrap());
    assert!(fired.iter().all(|timer| timer.client == "second"));
    assert!(
        fired
            .iter()
            .all(|timer| timer.at >= timer.time.to_system_time())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_of_moved_partitions_fire_on_the_new_owner_once() {
    const KEYS: u64 = 600;
    const SPREAD_SECS: u64 = 24;
    const PARTITIONS: i32 = 6;
    let topic = common::unique_name("timers_rebalance");
    let group = common::unique_name("timers_rebalance_group");
    harness::create_topic(&topic, PARTITIONS).await;
    let shared = shared_store(true);
    let first = client_on(options(&topic, &group), shared.as_ref()).await;
    let second = client_on(options(&topic, &group), shared.as_ref()).await;
    let store = shared.unwrap_or_else(|| first.timer_store().clone());
    let seen = Seen::new();
    first
        .subscribe(TimerHandler::new("first", &seen))
        .await
        .expect("subscribe first");
    wait_assigned(&first, usize::try_from(PARTITIONS).unwrap()).await;
    let base = now_secs() + 4;
    for key in 0..KEYS {
        first
            .send(
                &topic,
                &format!("key-{key}"),
                &json!({"ops": [["schedule", base + key % SPREAD_SECS]]}),
            )
            .await
            .expect("send");
    }
    // Join while timers are firing: the moved partitions' timers must not fire twice (old and
    // new owner) nor be lost between them.
    seen.until("firing started", Duration::from_secs(60), |seen| {
        seen.fired_count() > 0
    })
    .await;
    second
        .subscribe(TimerHandler::new("second", &seen))
        .await
        .expect("subscribe second");
    let total = usize::try_from(KEYS).unwrap();
    seen.until(
        "every timer fired",
        Duration::from_secs(SPREAD_SECS + 90),
        |seen| seen.fired_count() >= total,
    )
    .await;
    tokio::time::timeout(Duration::from_secs(30), async {
        while remaining(&store, &group, &topic, PARTITIONS).await > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the store empties");
    first.shutdown().await.expect("shutdown first");
    second.shutdown().await.expect("shutdown second");

    let fired = seen.fired.lock().clone();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for timer in &fired {
        *counts.entry(timer.key.as_str()).or_default() += 1;
    }
    let repeated: Vec<_> = counts.iter().filter(|(_, count)| **count > 1).collect();
    assert!(repeated.is_empty(), "fired twice: {repeated:?}");
    assert_eq!(counts.len(), total);
    let by_second = fired
        .iter()
        .filter(|timer| timer.client == "second")
        .count();
    println!(
        "rebalance: {} timers fired once each, {by_second} by the client that joined",
        fired.len()
    );
    assert!(
        by_second > 0,
        "the joining client fired the timers of the partitions it took over"
    );
    assert!(
        fired
            .iter()
            .all(|timer| timer.at >= timer.time.to_system_time())
    );
}
