//! Keyed state through the client against a real broker: the README's counter and activity
//! window, transactions (commit floor, rollback, failed attempts, leaked handles), scans,
//! deque capacity and chunked scans, durable identity, excise and key independence.
//!
//! Runs on the backend `PROSODY_TEST_STORAGE_BACKEND` names (see `common::harness`); stored
//! state is read back through the client's own store.
//!
//! Handlers report what they observed on a channel; each scenario awaits the reports it needs
//! (state is read back through a later event of the same key, which runs only after the
//! previous event's commit).

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use common::harness;
use futures::StreamExt;
use parking_lot::Mutex;
use prosody::api::context::ValueState;
use prosody::api::storage::{ScanDirection, ScanRequest, StateScope, StateStore};
use prosody::api::{
    ClassifyError, ContextError, EventContext, EventHandler, ExciseMessage, HandlerError, Key,
    Message, Timer, TimerTime,
};
use prosody::config::{ClientOptions, Config, StorageBackend};
use prosody::pipeline::state::{self, Definition, StateContextExt, kinds};
use prosody::{ClientError, ProsodyClient};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};

const DAY: u64 = 24 * 60 * 60;

static COUNT: LazyLock<Definition<kinds::Value>> =
    LazyLock::new(|| state::value("count").ttl_seconds(30 * DAY));
static WINDOW: LazyLock<Definition<kinds::Value>> =
    LazyLock::new(|| state::value("window").ttl_seconds(DAY));
static PENDING: LazyLock<Definition<kinds::MessageDeque>> = LazyLock::new(|| {
    state::message_deque("pending")
        .ttl_seconds(DAY)
        .capacity(100)
});
static REGISTER: LazyLock<Definition<kinds::Value>> = LazyLock::new(|| state::value("register"));
static THROUGH: LazyLock<Definition<kinds::Value>> =
    LazyLock::new(|| state::value("through").read_uncommitted(true));
static ENTRIES: LazyLock<Definition<kinds::Map>> =
    LazyLock::new(|| state::map("entries").keyset_limit(0));
static ITEMS: LazyLock<Definition<kinds::Deque>> = LazyLock::new(|| state::deque("items"));
static RECENT: LazyLock<Definition<kinds::Deque>> =
    LazyLock::new(|| state::deque("recent").capacity(3));

fn definitions() -> Vec<prosody::pipeline::state::CollectionDefinition> {
    vec![
        COUNT.config().clone(),
        WINDOW.config().clone(),
        PENDING.config().clone(),
        REGISTER.config().clone(),
        THROUGH.config().clone(),
        ENTRIES.config().clone(),
        ITEMS.config().clone(),
        RECENT.config().clone(),
    ]
}

/// Window length of the activity example (five minutes in the README).
const WINDOW_SECS: u64 = 2;
const WAIT: Duration = Duration::from_secs(60);

/// One observation of a handler.
#[derive(Debug, Clone)]
struct Report {
    key: String,
    what: String,
    value: Value,
}

/// Observations, awaited by key and name.
struct Reports {
    receiver: tokio::sync::Mutex<mpsc::UnboundedReceiver<Report>>,
    early: Mutex<Vec<Report>>,
}

impl Reports {
    async fn next(&self, key: &str, what: &str) -> Value {
        let found = |report: &Report| report.key == key && report.what == what;
        {
            let mut early = self.early.lock();
            if let Some(index) = early.iter().position(found) {
                return early.remove(index).value;
            }
        }
        let mut receiver = self.receiver.lock().await;
        tokio::time::timeout(WAIT, async {
            loop {
                let report = receiver.recv().await.expect("handler alive");
                if found(&report) {
                    return report.value;
                }
                self.early.lock().push(report);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no `{what}` report for key `{key}` within {WAIT:?}"))
    }
}

/// The handler of every scenario: the payload's `op` says what to do.
struct Scripted {
    reports: mpsc::UnboundedSender<Report>,
    /// Attempts per (key, offset), so an op can fail its first attempt only.
    attempts: Mutex<HashMap<(String, i64), u32>>,
    leaked: Mutex<Option<Box<dyn ValueState<Value>>>>,
    gate: Arc<Semaphore>,
}

fn transient(error: ContextError) -> HandlerError {
    HandlerError::transient(error)
}

impl Scripted {
    fn report(&self, key: &Key, what: &str, value: Value) {
        let _ = self.reports.send(Report {
            key: key.to_string(),
            what: what.to_owned(),
            value,
        });
    }

    fn attempt(&self, message: &Message) -> u32 {
        let mut attempts = self.attempts.lock();
        let attempt = attempts
            .entry((message.key.to_string(), message.offset.0))
            .or_default();
        *attempt += 1;
        *attempt
    }

    #[allow(clippy::too_many_lines, reason = "one arm per scenario step")]
    async fn run(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let key = &message.key;
        let op = message.payload["op"].as_str().unwrap_or_default();
        match op {
            // The README's counter.
            "count" => {
                let count = context.state(&COUNT).map_err(transient)?;
                let next = count
                    .get()
                    .await
                    .map_err(transient)?
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0)
                    + 1;
                count.set(json!(next)).await.map_err(transient)?;
                self.report(key, "count", json!(next));
            }
            // The README's activity window (shortened).
            "activity" => {
                let window = context.state(&WINDOW).map_err(transient)?;
                let pending = context.state(&PENDING).map_err(transient)?;
                if window.get().await.map_err(transient)?.is_some() {
                    pending.push(message.clone()).await.map_err(transient)?;
                    self.report(key, "held", json!(message.offset.0));
                    return Ok(Value::Null);
                }
                self.report(key, "notify", json!([message.offset.0]));
                window.set(json!(true)).await.map_err(transient)?;
                let due = TimerTime::from_system_time(
                    SystemTime::now() + Duration::from_secs(WINDOW_SECS),
                );
                context.clear_and_schedule(due).await.map_err(transient)?;
            }
            // Commit floor: write, commit, write again, fail; the retry sees the commit only.
            "floor" => {
                let register = context.state(&REGISTER).map_err(transient)?;
                if self.attempt(message) == 1 {
                    register.set(json!("committed")).await.map_err(transient)?;
                    register.commit().await.map_err(transient)?;
                    register.set(json!("pending")).await.map_err(transient)?;
                    assert_eq!(register.get().await.unwrap(), Some(json!("pending")));
                    return Err(HandlerError::transient("fail after a commit"));
                }
                let seen = register.get().await.map_err(transient)?;
                self.report(key, "floor", seen.unwrap_or(Value::Null));
            }
            // Rollback drops back to the last commit.
            "rollback" => {
                let register = context.state(&REGISTER).map_err(transient)?;
                register.set(json!(10)).await.map_err(transient)?;
                register.commit().await.map_err(transient)?;
                register.set(json!(20)).await.map_err(transient)?;
                register.rollback().await.map_err(transient)?;
                let seen = register.get().await.map_err(transient)?;
                self.report(key, "rollback", seen.unwrap_or(Value::Null));
            }
            // A failed attempt leaves no pending write; readUncommitted writes through.
            "fail_once" => {
                let register = context.state(&REGISTER).map_err(transient)?;
                let through = context.state(&THROUGH).map_err(transient)?;
                if self.attempt(message) == 1 {
                    register.set(json!("lost")).await.map_err(transient)?;
                    through.set(json!("kept")).await.map_err(transient)?;
                    return Err(HandlerError::transient("fail the first attempt"));
                }
                let seen = register.get().await.map_err(transient)?;
                let kept = through.get().await.map_err(transient)?;
                self.report(key, "fail_once", json!([seen, kept]));
            }
            // A handle kept past its attempt (successful or failed).
            "leak" => {
                let register = context.state(&REGISTER).map_err(transient)?;
                register
                    .set(json!("before leak"))
                    .await
                    .map_err(transient)?;
                *self.leaked.lock() = Some(register);
                if message.payload["fail"].as_bool() == Some(true) && self.attempt(message) == 1 {
                    return Err(HandlerError::transient("fail while leaking"));
                }
            }
            "use_leaked" => {
                let leaked = self.leaked.lock().take().expect("a leaked handle");
                let write = leaked.set(json!("after leak")).await;
                let read = leaked.get().await;
                let fresh = context.state(&REGISTER).map_err(transient)?;
                self.report(
                    key,
                    "use_leaked",
                    json!({
                        "write": error_name(write.err()),
                        "read": error_name(read.err()),
                        "value": fresh.get().await.map_err(transient)?,
                    }),
                );
            }
            "null" => {
                let register = context.state(&REGISTER).map_err(transient)?;
                let error = register.set(Value::Null).await.expect_err("null rejected");
                self.report(
                    key,
                    "null",
                    json!([
                        error_name(Some(error)),
                        register.get().await.map_err(transient)?
                    ]),
                );
            }
            "mismatch" => {
                let error = context
                    .map("count")
                    .map(|_| ())
                    .expect_err("count is a value");
                self.report(key, "mismatch", json!(error.is_permanent()));
            }
            "map_fill" => {
                let map = context.state(&ENTRIES).map_err(transient)?;
                for entry in message.payload["entries"].as_array().unwrap() {
                    let entry = entry.as_str().unwrap();
                    map.set(entry, json!(entry.chars().count()))
                        .await
                        .map_err(transient)?;
                }
            }
            "map_scan" => {
                let map = context.state(&ENTRIES).map_err(transient)?;
                let forward: Vec<String> = map
                    .keys(ScanDirection::Forward)
                    .map(|key| key.unwrap())
                    .collect()
                    .await;
                let backward: Vec<String> = map
                    .keys(ScanDirection::Backward)
                    .map(|key| key.unwrap())
                    .collect()
                    .await;
                // Stop early, then keep using the collection (pending writes included).
                let first_two: Vec<(String, Value)> = map
                    .entries(ScanDirection::Forward)
                    .take(2)
                    .map(|entry| entry.unwrap())
                    .collect()
                    .await;
                map.set("b-late", json!(6)).await.map_err(transient)?;
                let deleted = map.delete("a").await.map_err(transient)?;
                let after: Vec<String> = map
                    .keys(ScanDirection::Forward)
                    .map(|key| key.unwrap())
                    .collect()
                    .await;
                let many = map
                    .get_many(&["b-late".to_owned(), "zz".to_owned(), "日本".to_owned()])
                    .await
                    .map_err(transient)?;
                self.report(
                    key,
                    "map_scan",
                    json!({
                        "forward": forward, "backward": backward, "first_two": first_two,
                        "deleted": deleted, "after": after, "many": many,
                        "has": map.has("b-late").await.map_err(transient)?,
                    }),
                );
            }
            "deque_fill" => {
                let items = context.state(&ITEMS).map_err(transient)?;
                let count = message.payload["count"].as_u64().unwrap();
                for index in 0..count {
                    items.push(json!(index)).await.map_err(transient)?;
                }
                // Scanned before the commit too: the staged items, in order.
                let staged = items.values(ScanDirection::Forward).count().await;
                self.report(key, "deque_staged", json!(staged));
            }
            "deque_scan" => {
                let items = context.state(&ITEMS).map_err(transient)?;
                let mut expected = 0_u64;
                let mut ordered = true;
                let mut values = items.values(ScanDirection::Forward);
                while let Some(item) = values.next().await {
                    ordered &= item.map_err(transient)? == json!(expected);
                    expected += 1;
                }
                drop(values);
                let last_three: Vec<Value> = items
                    .values(ScanDirection::Backward)
                    .take(3)
                    .map(|item| item.unwrap())
                    .collect()
                    .await;
                let popped = items.pop().await.map_err(transient)?;
                let shifted = items.shift().await.map_err(transient)?;
                items.unshift(json!("front")).await.map_err(transient)?;
                self.report(
                    key,
                    "deque_scan",
                    json!({
                        "scanned": expected, "ordered": ordered, "last_three": last_three,
                        "popped": popped, "shifted": shifted,
                        "length": items.length().await.map_err(transient)?,
                        "at0": items.at(0).await.map_err(transient)?,
                        "at_last": items.at(-1).await.map_err(transient)?,
                    }),
                );
            }
            "capacity" => {
                let recent = context.state(&RECENT).map_err(transient)?;
                for index in 1..=5 {
                    recent.push(json!(index)).await.map_err(transient)?;
                }
                let values: Vec<Value> = recent
                    .values(ScanDirection::Forward)
                    .map(|item| item.unwrap())
                    .collect()
                    .await;
                self.report(key, "capacity", json!(values));
            }
            "block" => {
                self.report(key, "blocked", Value::Null);
                self.gate.acquire().await.unwrap().forget();
                let count = context.state(&COUNT).map_err(transient)?;
                count.set(json!(1000)).await.map_err(transient)?;
            }
            other => panic!("unknown op {other}"),
        }
        Ok(Value::Null)
    }
}

fn error_name(error: Option<ContextError>) -> Value {
    match error {
        None => Value::Null,
        Some(ContextError::AttemptEnded) => json!("attempt ended"),
        Some(ContextError::InvalidRequest(_)) => json!("invalid request"),
        Some(other) => json!(other.to_string()),
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
        self.run(context, message).await
    }

    async fn on_excise(
        &self,
        context: &dyn EventContext,
        message: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        context.clear_all().await.map_err(transient)?;
        context.clear_scheduled().await.map_err(transient)?;
        self.report(&message.key, "excised", Value::Null);
        Ok(Value::Null)
    }

    async fn on_timer(
        &self,
        context: &dyn EventContext,
        timer: &Timer,
    ) -> Result<(), HandlerError> {
        let pending = context.state(&PENDING).map_err(transient)?;
        let held: Vec<i64> = pending
            .values(ScanDirection::Forward)
            .map(|message| message.map(|message| message.offset.0))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(transient)?;
        if !held.is_empty() {
            self.report(&timer.key, "summary", json!(held));
        }
        pending.clear().await.map_err(transient)?;
        context
            .state(&WINDOW)
            .map_err(transient)?
            .clear()
            .await
            .map_err(transient)?;
        self.report(&timer.key, "window_closed", Value::Null);
        Ok(())
    }
}

struct Running {
    client: ProsodyClient,
    store: Arc<dyn StateStore>,
    reports: Arc<Reports>,
    gate: Arc<Semaphore>,
    topic: String,
    group: String,
}

impl Running {
    async fn send(&self, key: &str, payload: Value) {
        self.client
            .send(&self.topic, key, &payload)
            .await
            .expect("send");
    }

    async fn next(&self, key: &str, what: &str) -> Value {
        self.reports.next(key, what).await
    }

    /// The stored value of a collection of `key`, bypassing the client.
    async fn stored_value(&self, collection: &str, key: &str) -> Option<Value> {
        self.store
            .get_value(
                &StateScope::group(self.group.as_str(), collection),
                &Key::from(key),
            )
            .await
            .unwrap()
    }
}

fn options(topic: &str, group: &str) -> ClientOptions {
    harness::options(topic, group)
}

async fn client_on(
    topic: &str,
    group: &str,
    shared_state: Option<Arc<dyn StateStore>>,
) -> ProsodyClient {
    let config =
        Config::from_options(harness::with_storage(options(topic, group), group)).expect("config");
    match shared_state {
        Some(store) => {
            let timers = Arc::new(storage_memory::MemoryTimerStore::new(
                prosody::api::SlabSize::from_secs(60).unwrap(),
            ));
            ProsodyClient::with_stores(config, timers, store).await
        }
        None => ProsodyClient::new(config).await,
    }
    .expect("client")
}

async fn start(partitions: i32) -> Running {
    let topic = common::unique_name("state");
    let group = common::unique_name("state_group");
    harness::create_topic(&topic, partitions).await;
    start_on(&topic, &group, None).await
}

/// A client of `group` on the run's backend. `shared_state` (memory backend only) is the
/// keyed-state store of an earlier client of the group: in-memory state dies with its client,
/// while the durable backends find the earlier client's state on their own.
async fn start_on(topic: &str, group: &str, shared_state: Option<Arc<dyn StateStore>>) -> Running {
    let client = client_on(topic, group, shared_state).await;
    let store = client.state_store().expect("a keyed-state store");
    client
        .define_collections(definitions())
        .await
        .expect("valid definitions");
    let (sender, receiver) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    client
        .subscribe(Scripted {
            reports: sender,
            attempts: Mutex::new(HashMap::new()),
            leaked: Mutex::new(None),
            gate: gate.clone(),
        })
        .await
        .expect("subscribe");
    Running {
        client,
        store,
        reports: Arc::new(Reports {
            receiver: tokio::sync::Mutex::new(receiver),
            early: Mutex::new(Vec::new()),
        }),
        gate,
        topic: topic.to_owned(),
        group: group.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_counter_counts_each_key_independently() {
    let running = start(2).await;
    for _ in 0..5 {
        running.send("alice", json!({"op": "count"})).await;
    }
    for _ in 0..3 {
        running.send("bob", json!({"op": "count"})).await;
    }
    for expected in 1..=5 {
        assert_eq!(running.next("alice", "count").await, json!(expected));
    }
    for expected in 1..=3 {
        assert_eq!(running.next("bob", "count").await, json!(expected));
    }
    // The null check and a later event show the count is committed, not just staged.
    running.send("alice", json!({"op": "mismatch"})).await;
    assert_eq!(
        running.next("alice", "mismatch").await,
        json!(true),
        "permanent"
    );
    assert_eq!(running.stored_value("count", "alice").await, Some(json!(5)));
    assert_eq!(running.stored_value("count", "bob").await, Some(json!(3)));
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_window_notifies_first_then_summarises_the_window() {
    let running = start(2).await;
    running.send("user-1", json!({"op": "activity"})).await;
    let first = running.next("user-1", "notify").await;
    let mut held = Vec::new();
    for _ in 0..3 {
        running.send("user-1", json!({"op": "activity"})).await;
        held.push(running.next("user-1", "held").await);
    }
    // The timer reloads the held messages from Kafka through their stored references.
    assert_eq!(running.next("user-1", "summary").await, json!(held));
    running.next("user-1", "window_closed").await;
    // A new window starts with an immediate notification.
    running.send("user-1", json!({"op": "activity"})).await;
    let second = running.next("user-1", "notify").await;
    assert_ne!(first, second);
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_commit_floor_rollback_failed_attempts_and_null() {
    let running = start(1).await;
    running.send("floor", json!({"op": "floor"})).await;
    assert_eq!(running.next("floor", "floor").await, json!("committed"));
    assert_eq!(
        running.stored_value("register", "floor").await,
        Some(json!("committed"))
    );

    running.send("rb", json!({"op": "rollback"})).await;
    assert_eq!(running.next("rb", "rollback").await, json!(10));

    running.send("failed", json!({"op": "fail_once"})).await;
    assert_eq!(
        running.next("failed", "fail_once").await,
        json!([null, "kept"]),
        "the failed attempt's staged write is gone; the readUncommitted one went through"
    );

    running.send("null", json!({"op": "null"})).await;
    assert_eq!(
        running.next("null", "null").await,
        json!(["invalid request", null])
    );
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_handles_are_rejected_and_write_nothing() {
    let running = start(1).await;
    for fail in [false, true] {
        let key = format!("leak-{fail}");
        running
            .send(&key, json!({"op": "leak", "fail": fail}))
            .await;
        running.send(&key, json!({"op": "use_leaked"})).await;
        let used = running.next(&key, "use_leaked").await;
        assert_eq!(used["write"], json!("attempt ended"), "{used}");
        assert_eq!(used["read"], json!("attempt ended"), "{used}");
        // A failed attempt leaked its handle: its retry leaked a second one, which committed.
        assert_eq!(used["value"], json!("before leak"), "{used}");
    }
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_scans_both_directions_with_unicode_keys_and_early_exit() {
    let running = start(1).await;
    let entries = ["b", "a", "日本", "é", "z", "A", "ß"];
    running
        .send("m", json!({"op": "map_fill", "entries": entries}))
        .await;
    running.send("m", json!({"op": "map_scan"})).await;
    let scan = running.next("m", "map_scan").await;
    let mut sorted: Vec<&str> = entries.to_vec();
    sorted.sort_unstable(); // UTF-8 byte order, which `str` order is.
    let reversed: Vec<&str> = sorted.iter().rev().copied().collect();
    assert_eq!(scan["forward"], json!(sorted));
    assert_eq!(scan["backward"], json!(reversed));
    assert_eq!(scan["first_two"], json!([["A", 1], ["a", 1]]));
    assert_eq!(scan["deleted"], json!(true));
    let mut after: Vec<&str> = sorted.iter().copied().filter(|key| *key != "a").collect();
    after.push("b-late");
    after.sort_unstable();
    assert_eq!(scan["after"], json!(after));
    assert_eq!(scan["many"], json!([6, null, 2]));
    assert_eq!(scan["has"], json!(true));
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deque_of_ten_thousand_scans_in_chunks_and_capacity_drops_the_oldest() {
    let running = start(1).await;
    running
        .send("d", json!({"op": "deque_fill", "count": 10_000}))
        .await;
    assert_eq!(running.next("d", "deque_staged").await, json!(10_000));
    running.send("d", json!({"op": "deque_scan"})).await;
    let scan = running.next("d", "deque_scan").await;
    assert_eq!(scan["scanned"], json!(10_000));
    assert_eq!(scan["ordered"], json!(true));
    assert_eq!(scan["last_three"], json!([9999, 9998, 9997]));
    assert_eq!(scan["popped"], json!(9999));
    assert_eq!(scan["shifted"], json!(0));
    assert_eq!(scan["length"], json!(9_999));
    assert_eq!(scan["at0"], json!("front"));
    assert_eq!(scan["at_last"], json!(9998));

    running.send("c", json!({"op": "capacity"})).await;
    assert_eq!(running.next("c", "capacity").await, json!([3, 4, 5]));
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excise_clears_every_collection_of_the_key() {
    let running = start(1).await;
    running.send("gone", json!({"op": "count"})).await;
    running
        .send("gone", json!({"op": "map_fill", "entries": ["x", "y"]}))
        .await;
    running.send("gone", json!({"op": "capacity"})).await;
    running.send("kept", json!({"op": "count"})).await;
    running.next("gone", "capacity").await;
    running.next("kept", "count").await;
    running.client.excise(&running.topic, "gone").await.unwrap();
    running.next("gone", "excised").await;
    // A later event of the key runs after the excise committed.
    running.send("gone", json!({"op": "mismatch"})).await;
    running.next("gone", "mismatch").await;

    let key = Key::from("gone");
    for collection in ["count", "window", "register", "through"] {
        assert_eq!(
            running.stored_value(collection, "gone").await,
            None,
            "{collection}"
        );
    }
    let scope = |name: &str| StateScope::group(running.group.as_str(), name);
    let everything = ScanRequest::first(ScanDirection::Forward, 100.try_into().unwrap());
    assert!(
        running
            .store
            .scan_map(&scope("entries"), &key, &everything)
            .await
            .unwrap()
            .is_empty()
    );
    for deque in ["items", "recent", "pending"] {
        assert_eq!(
            running
                .store
                .get_deque_bounds(&scope(deque), &key)
                .await
                .unwrap(),
            None
        );
    }
    assert_eq!(running.stored_value("count", "kept").await, Some(json!(1)));
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_key_does_not_block_state_of_another_key_in_its_partition() {
    let running = start(1).await;
    running.send("stuck", json!({"op": "block"})).await;
    running.next("stuck", "blocked").await;
    for expected in 1..=3 {
        running.send("free", json!({"op": "count"})).await;
        assert_eq!(running.next("free", "count").await, json!(expected));
    }
    running.gate.add_permits(1);
    running.send("stuck", json!({"op": "count"})).await;
    assert_eq!(running.next("stuck", "count").await, json!(1001));
    running.client.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_registered_with_another_kind_is_a_permanent_error() {
    let topic = common::unique_name("state_identity");
    let group = common::unique_name("state_identity_group");
    harness::create_topic(&topic, 1).await;
    let first = start_on(&topic, &group, None).await;
    first.client.shutdown().await.unwrap();
    let shared =
        matches!(harness::storage_backend(), StorageBackend::Memory).then(|| first.store.clone());
    // A RocksDB store stays locked while anything holds it.
    drop(first);

    let second = client_on(&topic, &group, shared).await;
    // Same name, another kind: valid on its own, refused against the stored identity.
    second
        .define_collections([state::map("count")])
        .await
        .unwrap();
    let error = second
        .subscribe(Scripted {
            reports: mpsc::unbounded_channel().0,
            attempts: Mutex::new(HashMap::new()),
            leaked: Mutex::new(None),
            gate: Arc::new(Semaphore::new(0)),
        })
        .await
        .expect_err("identity conflict");
    assert!(matches!(error, ClientError::State(_)), "{error}");
    assert!(error.is_permanent(), "{error}");
    assert!(error.to_string().contains("count"), "{error}");
    second.shutdown().await.unwrap();
}

#[tokio::test]
async fn invalid_definitions_fail_at_construction_naming_the_field() {
    let mut options = options("state_config_topic", "state_config_group");
    options.state_collections = Some(json!([
        {"name": "ok", "kind": "value", "payload": "json", "ttlSeconds": 60},
        {"name": "bad", "kind": "deque", "payload": "json", "capacity": 0}
    ]));
    let Err(error) = ProsodyClient::new(Config::from_options(options).unwrap()).await else {
        panic!("capacity 0 accepted")
    };
    assert!(
        error.to_string().contains("stateCollections[bad].capacity"),
        "{error}"
    );

    let client = ProsodyClient::new(Config::from_options(self::options("t", "g")).unwrap())
        .await
        .unwrap();
    let error = client
        .define_collections([state::value("short").ttl_seconds(30)])
        .await
        .expect_err("ttl not above the recovery delay");
    assert!(error.to_string().contains("ttlSeconds"), "{error}");
    let error = client
        .define_collections([state::value("twice"), state::value("twice")])
        .await
        .expect_err("duplicate");
    assert!(error.to_string().contains("unique"), "{error}");
    client.shutdown().await.unwrap();
}
