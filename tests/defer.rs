//! Deferred retry, its failure-rate gate, monopolization detection and excise against a real
//! broker: a failing key must not hold up its partition, and its own records must still be
//! handled in order. Runs on the backend `PROSODY_TEST_STORAGE_BACKEND` names (see
//! `common::harness`).

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::harness::{self, until};
use common::kafka_read;
use parking_lot::Mutex;
use prosody::ProsodyClient;
use prosody::api::storage::PartitionScope;
use prosody::api::{
    EventContext, EventHandler, ExciseMessage, HandlerError, Key, Message, Partition, Timer,
    TimerKind, TimerTime,
};
use prosody::config::ClientOptions;
use serde_json::{Value, json};
use tokio::sync::watch;

/// One successful handling.
#[derive(Clone, Debug)]
struct Done {
    key: String,
    seq: u64,
    at: Instant,
}

/// What the handler saw. Payload fields: `seq`; `fail_times` (fail the first n attempts of
/// the record transiently); `permanent_from` (fail transiently before attempt n, permanently
/// from it on); `flaky` (fail while [`State::failing`] is set); `sleep_ms`;
/// `schedule_in_s` (schedule an application timer that far ahead).
#[derive(Default)]
struct State {
    attempts: Mutex<HashMap<(String, i64), u32>>,
    done: Mutex<Vec<Done>>,
    count: watch::Sender<usize>,
    failing: AtomicBool,
    excised: Mutex<Vec<String>>,
}

impl State {
    fn attempts(&self, key: &str, offset: i64) -> u32 {
        self.attempts
            .lock()
            .get(&(key.to_owned(), offset))
            .copied()
            .unwrap_or(0)
    }

    fn done(&self) -> Vec<Done> {
        self.done.lock().clone()
    }

    fn done_of(&self, key: &str) -> Vec<Done> {
        self.done().into_iter().filter(|d| d.key == key).collect()
    }

    async fn wait_for(&self, count: usize, within: Duration) {
        let mut updates = self.count.subscribe();
        let reached = tokio::time::timeout(within, updates.wait_for(|n| *n >= count)).await;
        assert!(
            reached.is_ok(),
            "only {} of {count} handled within {within:?}",
            self.done.lock().len()
        );
    }
}

struct Handler(Arc<State>);

#[async_trait]
impl EventHandler for Handler {
    type Error = HandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let state = &self.0;
        let attempt = {
            let mut attempts = state.attempts.lock();
            let attempt = attempts
                .entry((message.key.to_string(), message.offset.0))
                .or_default();
            *attempt += 1;
            *attempt
        };
        let field = |name: &str| message.payload.get(name).and_then(Value::as_u64);
        if let Some(millis) = field("sleep_ms") {
            tokio::time::sleep(Duration::from_millis(millis)).await;
        }
        if let Some(from) = field("permanent_from") {
            return Err(if u64::from(attempt) >= from {
                HandlerError::permanent(format!("scripted permanent failure {attempt}"))
            } else {
                HandlerError::transient(format!("scripted failure {attempt}"))
            });
        }
        if field("fail_times").is_some_and(|times| u64::from(attempt) <= times) {
            return Err(HandlerError::transient(format!(
                "scripted failure {attempt}"
            )));
        }
        if message.payload.get("flaky") == Some(&json!(true))
            && state.failing.load(Ordering::SeqCst)
        {
            return Err(HandlerError::transient("flaky while failing"));
        }
        if let Some(secs) = field("schedule_in_s") {
            let now = TimerTime::from_system_time(std::time::SystemTime::now());
            context
                .schedule(TimerTime::from_secs(now.as_secs() + secs))
                .await
                .map_err(HandlerError::transient)?;
        }
        let count = {
            let mut done = state.done.lock();
            done.push(Done {
                key: message.key.to_string(),
                seq: field("seq").unwrap_or(0),
                at: Instant::now(),
            });
            done.len()
        };
        state.count.send_replace(count);
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        context: &dyn EventContext,
        excise: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        context
            .clear_scheduled()
            .await
            .map_err(HandlerError::transient)?;
        self.0.excised.lock().push(excise.key.to_string());
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A topic with one partition (so "the partition moved on" is one committed offset), a
/// consumer client built from `options` and a separate sender.
async fn setup(
    prefix: &str,
    options: impl FnOnce(ClientOptions) -> ClientOptions,
) -> (String, String, ProsodyClient, ProsodyClient) {
    let topic = common::unique_name(prefix);
    let group = common::unique_name(&format!("{prefix}_group"));
    harness::create_topic(&topic, 1).await;
    let client = ProsodyClient::from_options(harness::with_storage(
        options(ClientOptions {
            retry_base_ms: Some(Duration::from_millis(10)),
            max_retry_delay_ms: Some(Duration::from_millis(100)),
            ..harness::options(&topic, &group)
        }),
        &group,
    ))
    .await
    .expect("client");
    // A separate sender: the consumer skips what its own group produced.
    let sender = ProsodyClient::from_options(ClientOptions {
        subscribed_topics: None,
        ..harness::options(&topic, &common::unique_name("defer_sender"))
    })
    .await
    .expect("sender");
    (topic, group, client, sender)
}

/// Waits (at most `within`) for `condition` on the client's state, checking every 50 ms: the
/// gate's switching is state, not an event a test can subscribe to.
fn in_order(done: &[Done]) -> Vec<u64> {
    done.iter().map(|d| d.seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_key_is_deferred_while_other_keys_flow_and_keeps_its_order() {
    let (topic, group, client, sender) = setup("defer_flow", |options| ClientOptions {
        defer_base_ms: Some(Duration::from_secs(2)),
        defer_max_delay_ms: Some(Duration::from_secs(4)),
        ..options
    })
    .await;
    // The failing key's first record fails five times; its four later records succeed but
    // must wait for it. 100 other keys have five records each, produced interleaved after it.
    sender
        .send(&topic, "failing", &json!({"seq": 0, "fail_times": 5}))
        .await
        .expect("send");
    let mut sends = Vec::new();
    for round in 0..5_u64 {
        if round > 0 {
            sends.push(("failing".to_owned(), json!({ "seq": round })));
        }
        for key in 0..100 {
            sends.push((format!("other-{key}"), json!({ "seq": round })));
        }
    }
    for (key, payload) in &sends {
        sender.send(&topic, key, payload).await.expect("send");
    }
    let total = 1 + sends.len();
    let others = total - 5;
    let state = Arc::new(State::default());
    let started = Instant::now();
    client
        .subscribe(Handler(state.clone()))
        .await
        .expect("subscribe");

    // The partition moves past the failing record: every offset commits while the failing
    // key has not succeeded yet (its five retries take at least 2 + 4 * 4 s).
    kafka_read::until_committed(
        &group,
        &topic,
        &[i64::try_from(total).unwrap()],
        Duration::from_secs(60),
    )
    .await;
    let committed_after = started.elapsed();
    assert!(
        state.done_of("failing").is_empty(),
        "the failing key is still being retried when everything is committed"
    );
    let other_done: Vec<Done> = state
        .done()
        .into_iter()
        .filter(|d| d.key != "failing")
        .collect();
    assert_eq!(other_done.len(), others, "every other record handled");
    let others_finished = other_done
        .iter()
        .map(|d| d.at.duration_since(started))
        .max()
        .unwrap();
    let status = client.defer_status().expect("defer layer present");
    assert!(status.deferring);
    assert_eq!(
        status.deferred, 5,
        "the failure and the 4 records behind it"
    );

    state.wait_for(total, Duration::from_secs(90)).await;
    let failing = state.done_of("failing");
    assert_eq!(
        in_order(&failing),
        [0, 1, 2, 3, 4],
        "the failing key kept its order"
    );
    assert_eq!(state.attempts("failing", 0), 6, "5 failures, then success");
    let failing_finished = failing.last().unwrap().at.duration_since(started);
    assert!(failing_finished > others_finished);
    // The layer counts a completion just after the handler returned: wait for the count
    // rather than racing it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        let status = client.defer_status().expect("defer layer present");
        if status.completed >= 5 || std::time::Instant::now() >= deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(status.completed, 5);
    for key in 0..100 {
        let key = format!("other-{key}");
        assert_eq!(in_order(&state.done_of(&key)), [0, 1, 2, 3, 4], "{key}");
    }
    println!(
        "defer: {others} records of 100 other keys handled {others_finished:?} after subscribe \
         (all {total} offsets committed at {committed_after:?}); the failing key's 5 records \
         finished at {failing_finished:?}"
    );
    client.shutdown().await.expect("shutdown");
    sender.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failure_rate_gate_switches_deferral_off_and_back_on() {
    let (topic, _group, client, sender) = setup("defer_gate", |options| ClientOptions {
        defer_base_ms: Some(Duration::from_secs(1)),
        defer_max_delay_ms: Some(Duration::from_secs(2)),
        defer_failure_threshold: Some(0.5),
        defer_failure_window_ms: Some(Duration::from_secs(3)),
        ..options
    })
    .await;
    let state = Arc::new(State::default());
    state.failing.store(true, Ordering::SeqCst);
    // 95% of records fail while the switch is on.
    let total = 400_u64;
    let send = |index: u64| {
        let key = format!("key-{}", index % 40);
        let payload = json!({ "seq": index / 40, "flaky": !index.is_multiple_of(20) });
        let (sender, topic) = (&sender, &topic);
        async move { sender.send(topic, &key, &payload).await.expect("send") }
    };
    // One failure first, deferred while the gate is still open (fewer outcomes than its
    // minimum); then the flood, whose outcomes arrive concurrently and shut it.
    send(1).await;
    client
        .subscribe(Handler(state.clone()))
        .await
        .expect("subscribe");
    until(
        Duration::from_secs(60),
        "the first failure deferred",
        || {
            client
                .defer_status()
                .is_some_and(|status| status.deferred >= 1)
        },
    )
    .await;
    for index in (0..total).filter(|index| *index != 1) {
        send(index).await;
    }
    until(Duration::from_secs(60), "deferral switched off", || {
        client
            .defer_status()
            .is_some_and(|status| !status.deferring)
    })
    .await;
    let off = client.defer_status().unwrap();
    assert!(off.failure_rate > 0.5, "{off:?}");
    assert!(off.switched_off >= 1);
    assert!(
        off.deferred >= 1,
        "failures were deferred before the gate shut"
    );

    // The failures stop: blocked keys succeed, the failure rate falls, deferral comes back.
    state.failing.store(false, Ordering::SeqCst);
    until(Duration::from_secs(60), "deferral switched back on", || {
        client.defer_status().is_some_and(|status| status.deferring)
    })
    .await;
    state
        .wait_for(usize::try_from(total).unwrap(), Duration::from_secs(90))
        .await;
    for key in 0..40 {
        let key = format!("key-{key}");
        assert_eq!(
            in_order(&state.done_of(&key)),
            (0..10).collect::<Vec<_>>(),
            "{key} in order"
        );
    }
    let on = client.defer_status().unwrap();
    println!("gate: switched off at {off:?}; back on at {on:?}");
    client.shutdown().await.expect("shutdown");
    sender.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monopolizing_key_is_rejected_and_deferred_while_others_keep_flowing() {
    let (topic, group, client, sender) = setup("defer_monopoly", |options| ClientOptions {
        defer_base_ms: Some(Duration::from_secs(1)),
        defer_max_delay_ms: Some(Duration::from_secs(2)),
        monopolization_threshold: Some(0.5),
        monopolization_window_ms: Some(Duration::from_secs(2)),
        ..options
    })
    .await;
    // The hog's handler takes 300 ms per record, 20 records: 6 s of handler time, far over
    // its share of 1 s per 2 s. 100 other keys take 5 ms per record.
    for seq in 0..20_u64 {
        sender
            .send(&topic, "hog", &json!({"seq": seq, "sleep_ms": 300}))
            .await
            .expect("send");
        for key in 0..15 {
            sender
                .send(
                    &topic,
                    &format!("other-{key}"),
                    &json!({"seq": seq, "sleep_ms": 5}),
                )
                .await
                .expect("send");
        }
    }
    let total = 20 * 16;
    let state = Arc::new(State::default());
    let started = Instant::now();
    client
        .subscribe(Handler(state.clone()))
        .await
        .expect("subscribe");
    kafka_read::until_committed(&group, &topic, &[total], Duration::from_secs(60)).await;
    let rejected = client.monopolization_rejections().expect("layer present");
    assert!(rejected >= 1, "the hog was rejected");
    let status = client.defer_status().unwrap();
    assert!(status.deferred >= 1, "and deferred: {status:?}");
    state
        .wait_for(usize::try_from(total).unwrap(), Duration::from_secs(120))
        .await;
    let hog = state.done_of("hog");
    assert_eq!(in_order(&hog), (0..20).collect::<Vec<_>>(), "hog in order");
    let others: Vec<Done> = state
        .done()
        .into_iter()
        .filter(|d| d.key != "hog")
        .collect();
    let others_finished = others
        .iter()
        .map(|d| d.at.duration_since(started))
        .max()
        .unwrap();
    let hog_finished = hog.last().unwrap().at.duration_since(started);
    assert!(
        others_finished < hog_finished,
        "others {others_finished:?}, hog {hog_finished:?}"
    );
    let rejected = client.monopolization_rejections().unwrap();
    let status = client.defer_status().unwrap();
    println!(
        "monopolization: {} other records finished {others_finished:?} after subscribe; the \
         hog's 20 finished at {hog_finished:?}; {rejected} rejections, {status:?}",
        others.len()
    );
    client.shutdown().await.expect("shutdown");
    sender.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excise_drops_the_keys_deferred_work_and_its_timers() {
    let (topic, group, client, sender) = setup("defer_excise", |options| ClientOptions {
        defer_base_ms: Some(Duration::from_secs(1)),
        defer_max_delay_ms: Some(Duration::from_secs(1)),
        ..options
    })
    .await;
    // seq 0 schedules a timer an hour ahead; seq 1 fails for good and is deferred; seq 2 waits
    // behind it; the excise drops both and the timer; seq 3 comes after the excise.
    sender
        .send(&topic, "gone", &json!({"seq": 0, "schedule_in_s": 3600}))
        .await
        .expect("send");
    sender
        .send(&topic, "gone", &json!({"seq": 1, "fail_times": 1_000}))
        .await
        .expect("send");
    sender
        .send(&topic, "gone", &json!({"seq": 2}))
        .await
        .expect("send");
    let state = Arc::new(State::default());
    client
        .subscribe(Handler(state.clone()))
        .await
        .expect("subscribe");
    until(Duration::from_secs(60), "two records deferred", || {
        client
            .defer_status()
            .is_some_and(|status| status.deferred == 2)
    })
    .await;
    let scope = PartitionScope::new(group.as_str(), topic.as_str(), Partition(0));
    let key = Key::from("gone");
    let timers = |kind| {
        let store = client.timer_store().clone();
        let scope = scope.clone();
        let key = key.clone();
        async move { store.scheduled(&scope, &key, kind).await.unwrap() }
    };
    assert_eq!(timers(TimerKind::Application).await.len(), 1);

    sender.excise(&topic, "gone").await.expect("excise");
    sender
        .send(&topic, "gone", &json!({"seq": 3}))
        .await
        .expect("send");
    kafka_read::until_committed(&group, &topic, &[5], Duration::from_secs(60)).await;
    assert_eq!(state.excised.lock().as_slice(), ["gone"]);
    let status = client.defer_status().unwrap();
    assert_eq!(status.dropped, 2, "{status:?}");
    assert!(
        timers(TimerKind::Application).await.is_empty(),
        "clear_scheduled in on_excise"
    );
    assert!(
        timers(TimerKind::DeferRetry).await.is_empty(),
        "no retry left"
    );
    let attempts = state.attempts("gone", 1);
    // Well past when a retry (1 s) would have come: nothing of the dropped work runs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        state.attempts("gone", 1),
        attempts,
        "the deferred record is not retried"
    );
    assert_eq!(
        in_order(&state.done_of("gone")),
        [0, 3],
        "seq 2 was dropped with seq 1"
    );
    client.shutdown().await.expect("shutdown");
    sender.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_work_that_fails_permanently_goes_to_the_failure_topic() {
    let failure_topic = common::unique_name("defer_failures");
    harness::create_topic(&failure_topic, 1).await;
    let (topic, group, client, sender) = setup("defer_permanent", |options| ClientOptions {
        defer_base_ms: Some(Duration::from_millis(500)),
        defer_max_delay_ms: Some(Duration::from_secs(1)),
        failure_topic: Some(failure_topic.clone()),
        ..options
    })
    .await;
    // seq 0 fails transiently (and is deferred), then permanently on its deferred retry;
    // seq 1 of the key waits behind it and runs once seq 0 has left deferral.
    let doomed = json!({"seq": 0, "permanent_from": 2});
    sender.send(&topic, "doomed", &doomed).await.expect("send");
    sender
        .send(&topic, "doomed", &json!({"seq": 1}))
        .await
        .expect("send");
    let state = Arc::new(State::default());
    client
        .subscribe(Handler(state.clone()))
        .await
        .expect("subscribe");
    state.wait_for(1, Duration::from_secs(60)).await;
    kafka_read::until_committed(&group, &topic, &[2], Duration::from_secs(60)).await;

    assert_eq!(in_order(&state.done_of("doomed")), [1]);
    assert_eq!(
        state.attempts("doomed", 0),
        2,
        "first attempt, one deferred retry"
    );
    let records = kafka_read::read_all(&failure_topic, 1);
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record.key.as_deref(), Some(b"doomed".as_slice()));
    assert_eq!(record.json(), doomed);
    assert_eq!(record.header("prosody-original-topic"), topic);
    assert_eq!(record.header("prosody-original-offset"), "0");
    assert_eq!(record.header("prosody-attempts"), "2");
    assert!(
        record
            .header("prosody-error")
            .contains("scripted permanent failure 2"),
        "{record:?}"
    );
    // The layer counts a retried record after its handler returned: wait for the count.
    until(
        Duration::from_secs(10),
        "seq 1 counted as completed",
        || {
            client
                .defer_status()
                .is_some_and(|status| status.completed == 1)
        },
    )
    .await;
    let status = client.defer_status().unwrap();
    assert_eq!((status.deferred, status.dropped), (2, 1), "{status:?}");
    client.shutdown().await.expect("shutdown");
    sender.shutdown().await.expect("shutdown");
}
