//! Fault: Cassandra stops in the middle of a run of handlers that write keyed state and
//! schedule timers, and starts again on its kept data (issue 7).
//!
//! The node is a PRIVATE one (`scripts/services` service `cassandra-fault`, its own ports and
//! data directory): the shared node other suites use is never stopped. The test brings it up
//! itself, and brings it down again (data deleted) when it ends, on a panic too.
//!
//! A producer sends one record per key per second. Each handler attempt reads the key's timers
//! and its `last` value from the store, checks that the previous record's commit is there,
//! writes `last = seq` and schedules a timer for the record; each timer event writes state too.
//! Mid-run the node is stopped, the test waits until the pipeline has retried attempts that
//! failed transiently, then starts the node again and checks, on the same client: every record
//! handled in order with no committed write missing, every timer fired, and the stored values
//! (read by a fresh store on the node, not through the client's cache) those of the last
//! records.
//!
//! Where the attempts fail depends on the moment the node stops: in the handler's reads, or
//! before the handler runs. An event whose handler succeeded but whose commit was cut off is
//! retried by first finishing that commit, which needs the node too, so while it is down the
//! handler is not called again. The outage is therefore observed through the pipeline's count
//! of transient failures (`defer_status`), with the handler's own observations printed.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use common::harness;
use parking_lot::Mutex;
use prosody::api::storage::{StateScope, StateStore};
use prosody::api::{
    ClassifyError, ContextError, EventContext, EventHandler, ExciseMessage, HandlerError, Key,
    Message, Timer, TimerTime,
};
use prosody::config::{ClientOptions, Config, StorageBackend};
use prosody::pipeline::state::{self, Definition, StateContextExt, kinds};
use prosody::{ConsumerState, ProsodyClient};
use serde_json::{Value, json};
use tokio::sync::watch;

/// The private node of `scripts/services`.
const SERVICE: &str = "cassandra-fault";
const KEYS: usize = 4;
/// A record's timer is due this long after the record's round started.
const TIMER_DELAY_SECS: u64 = 3;
/// Bound of every wait on the pipeline (generous: two cores shared with the rest of CI).
const WAIT: Duration = Duration::from_secs(240);

/// The last record (`seq`) whose writes are committed, per key.
static LAST: LazyLock<Definition<kinds::Value>> = LazyLock::new(|| state::value("last"));
/// The time of the last timer handled, per key: timer events write state too.
static FIRED: LazyLock<Definition<kinds::Value>> = LazyLock::new(|| state::value("fired"));

/// An event: its key, and the record's seq or the timer's time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Event {
    Record(String, u64),
    Timer(String, u64),
}

/// Where the run is, as the handlers see it.
const BEFORE: u8 = 0;
const OUTAGE: u8 = 1;
const AFTER: u8 = 2;

/// Everything the handlers observed.
#[derive(Default)]
struct Observed {
    phase: AtomicU8,
    /// Attempts per event.
    attempts: Mutex<HashMap<Event, u32>>,
    /// Events whose handler returned success (their commit may still fail).
    handler_ok: Mutex<HashSet<Event>>,
    /// The highest seq per key whose handler succeeded.
    handled: Mutex<HashMap<String, u64>>,
    /// Timers handled successfully, (key, time).
    fired: Mutex<HashSet<(String, u64)>>,
    /// Store errors the handlers saw, transient, per phase.
    transient: [AtomicUsize; 3],
    /// Store errors classified permanent (must stay empty: the node was only unavailable).
    permanent: Mutex<Vec<String>>,
    /// Attempts after the first of an event, per phase.
    retries: [AtomicUsize; 3],
    /// Retries of an event whose handler had succeeded: its commit failed.
    commit_retries: [AtomicUsize; 3],
    /// Committed writes found missing (must stay empty).
    lost: Mutex<Vec<String>>,
    /// When the first handler attempt succeeded after the restart.
    first_success_after: Mutex<Option<Instant>>,
    /// Bumped on every observation, so waits are woken by events.
    changes: watch::Sender<u64>,
}

impl Observed {
    fn phase(&self) -> usize {
        usize::from(self.phase.load(Ordering::SeqCst))
    }

    fn changed(&self) {
        self.changes.send_modify(|version| *version += 1);
    }

    /// Counts an attempt of `event`; a retry when it is not the first.
    fn attempt(&self, event: &Event) {
        let attempt = {
            let mut attempts = self.attempts.lock();
            let attempt = attempts.entry(event.clone()).or_default();
            *attempt += 1;
            *attempt
        };
        if attempt > 1 {
            self.retries[self.phase()].fetch_add(1, Ordering::SeqCst);
            if self.handler_ok.lock().contains(event) {
                self.commit_retries[self.phase()].fetch_add(1, Ordering::SeqCst);
            }
            self.changed();
        }
    }

    /// A store error as the handler returns it, with its class kept, and counted.
    fn failure(&self, error: ContextError) -> HandlerError {
        let failure = if error.is_permanent() {
            self.permanent.lock().push(error.to_string());
            HandlerError::permanent(error)
        } else {
            self.transient[self.phase()].fetch_add(1, Ordering::SeqCst);
            HandlerError::transient(error)
        };
        self.changed();
        failure
    }

    fn succeeded(&self, event: Event) {
        match &event {
            Event::Record(key, seq) => {
                let mut handled = self.handled.lock();
                let highest = handled.entry(key.clone()).or_default();
                *highest = (*highest).max(*seq);
            }
            Event::Timer(key, time) => {
                self.fired.lock().insert((key.clone(), *time));
            }
        }
        self.handler_ok.lock().insert(event);
        if self.phase() == usize::from(AFTER) {
            self.first_success_after
                .lock()
                .get_or_insert_with(Instant::now);
        }
        self.changed();
    }

    /// True when every key's handler succeeded for `seq` or later.
    fn all_handled(&self, seq: u64) -> bool {
        let handled = self.handled.lock();
        (0..KEYS).all(|key| handled.get(&key_name(key)).is_some_and(|&at| at >= seq))
    }

    /// Waits (bounded) until `condition` holds, woken by every observation.
    async fn until(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        let mut changes = self.changes.subscribe();
        let reached = tokio::time::timeout(WAIT, async {
            while !condition(self) {
                changes.changed().await.expect("observer alive");
            }
        })
        .await;
        assert!(
            reached.is_ok(),
            "{what}: not reached within {WAIT:?}; observed: {}",
            self.summary()
        );
    }

    /// The counts so far, for a failure message.
    fn summary(&self) -> String {
        let count = |counters: &[AtomicUsize; 3]| {
            counters
                .iter()
                .map(|counter| counter.load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        };
        format!(
            "phase {}, handled {:?}, {} timers fired, transient store errors per phase {:?}, \
             retries per phase {:?}, commit retries per phase {:?}, permanent {:?}",
            self.phase(),
            self.handled.lock(),
            self.fired.lock().len(),
            count(&self.transient),
            count(&self.retries),
            count(&self.commit_retries),
            self.permanent.lock(),
        )
    }
}

/// The pipeline's transient failures so far (every retry counted, in the handler or before it).
fn pipeline_failures(client: &ProsodyClient) -> u64 {
    client
        .defer_status()
        .expect("pipeline mode has the defer layer")
        .transient_failures
}

/// Waits (bounded) until the pipeline has counted `more` transient failures than `before`. No
/// event announces them, so the count is read every 50 ms.
async fn until_pipeline_failures(
    client: &ProsodyClient,
    observed: &Observed,
    before: u64,
    more: u64,
) {
    let deadline = Instant::now() + WAIT;
    while pipeline_failures(client) < before + more {
        assert!(
            Instant::now() < deadline,
            "{more} transient failures retried by the pipeline during the outage: not reached \
             within {WAIT:?} ({} counted); defer status {:?}, load {:?}; observed: {}",
            pipeline_failures(client) - before,
            client.defer_status(),
            client.load(),
            observed.summary()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn key_name(index: usize) -> String {
    format!("key-{index}")
}

/// The timer of record `seq`: due `TIMER_DELAY_SECS` after its round, whole seconds.
fn timer_time(base: u64, seq: u64) -> TimerTime {
    TimerTime::from_secs(base + seq + TIMER_DELAY_SECS)
}

struct Handler {
    observed: Arc<Observed>,
    /// Epoch second when round 0 was sent.
    base: u64,
}

impl Handler {
    async fn handle(
        &self,
        context: &dyn EventContext,
        key: &str,
        seq: u64,
    ) -> Result<(), HandlerError> {
        let fail = |error| self.observed.failure(error);
        // Timers are not cached on the client: this read reaches the node on every attempt.
        context.scheduled().await.map_err(fail)?;
        let last = context.state(&LAST).map_err(fail)?;
        let seen = last
            .get()
            .await
            .map_err(fail)?
            .and_then(|value| value.as_u64());
        // Records of a key run in order, each after the previous one's commit. `seen == seq`
        // is this record's own commit that landed although its outcome was reported failed
        // (or a redelivery): idempotent.
        let consistent = match seen {
            None => seq == 0,
            Some(seen) => seen + 1 == seq || seen == seq,
        };
        if !consistent {
            self.observed.lost.lock().push(format!(
                "{key}: record {seq} read last = {seen:?}, the commit of record {} is missing",
                seq.saturating_sub(1)
            ));
        }
        if seen != Some(seq) {
            last.set(json!(seq)).await.map_err(fail)?;
        }
        context
            .schedule(timer_time(self.base, seq))
            .await
            .map_err(fail)?;
        Ok(())
    }
}

#[async_trait]
impl EventHandler for Handler {
    type Error = HandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let key = message.key.to_string();
        let seq = message.payload["seq"].as_u64().expect("seq");
        let event = Event::Record(key.clone(), seq);
        self.observed.attempt(&event);
        self.handle(context, &key, seq).await?;
        self.observed.succeeded(event);
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        _: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        Ok(Value::Null)
    }

    async fn on_timer(
        &self,
        context: &dyn EventContext,
        timer: &Timer,
    ) -> Result<(), HandlerError> {
        let event = Event::Timer(timer.key.to_string(), timer.time.as_secs());
        self.observed.attempt(&event);
        let fail = |error| self.observed.failure(error);
        // As for records: a read that reaches the node on every attempt.
        context.scheduled().await.map_err(fail)?;
        let fired = context.state(&FIRED).map_err(fail)?;
        fired.set(json!(timer.time.as_secs())).await.map_err(fail)?;
        self.observed.succeeded(event);
        Ok(())
    }
}

/// Runs `scripts/services ARGS` and returns its standard output; panics with its error output
/// when it fails (the test must never pass, or skip, without its node).
fn services(args: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/services");
    let output = Command::new(&script)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", script.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    assert!(
        output.status.success(),
        "`scripts/services {}` failed ({}); this test needs the private Cassandra node it \
         starts (Java 17 and Maven, see scripts/services):\n{stderr}",
        args.join(" "),
        output.status
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

async fn services_async(args: &'static [&'static str]) -> String {
    tokio::task::spawn_blocking(move || services(args))
        .await
        .expect("scripts/services thread")
}

/// The private node, brought down (data deleted) when dropped, also on a panic. Holds a lock
/// so two runs of this test on one machine never share (and stop) one node.
struct PrivateNode {
    nodes: String,
    _lock: std::fs::File,
}

impl PrivateNode {
    async fn up() -> Self {
        let lock = tokio::task::spawn_blocking(|| {
            let path = std::env::temp_dir().join("prosody-cassandra-fault.lock");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .expect("lock file");
            fs4::FileExt::lock(&file).expect("lock the private node");
            file
        })
        .await
        .expect("lock thread");
        let exports = services_async(&["up", SERVICE]).await;
        let nodes = exports
            .lines()
            .find_map(|line| line.strip_prefix("export PROSODY_CASSANDRA_FAULT_NODES="))
            .unwrap_or_else(|| panic!("no PROSODY_CASSANDRA_FAULT_NODES in:\n{exports}"))
            .to_owned();
        Self { nodes, _lock: lock }
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/services");
        match Command::new(&script).args(["down", SERVICE]).status() {
            Ok(status) if status.success() => {}
            other => eprintln!("bringing {SERVICE} down failed: {other:?}"),
        }
    }
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines, reason = "one scenario, step by step")]
async fn cassandra_stopped_mid_run_and_started_again_loses_nothing_and_the_client_recovers() {
    let node = PrivateNode::up().await;
    let topic = common::unique_name("fault");
    let group = common::unique_name("fault_group");
    let keyspace = common::unique_name("fault");
    harness::create_topic(&topic, 2).await;

    let options = ClientOptions {
        mock: Some(false),
        telemetry_enabled: Some(false),
        storage_backend: Some(StorageBackend::Cassandra),
        cassandra_nodes: Some(vec![node.nodes.clone()]),
        cassandra_keyspace: Some(keyspace.clone()),
        state_cache_dir: None,
        // Retries back off to at most this: the default (5 min) would make the catch-up after
        // the restart wait out one long backoff; the behaviour under test is the same.
        max_retry_delay_ms: Some(Duration::from_secs(1)),
        ..harness::options(&topic, &group)
    };
    let client = ProsodyClient::new(Config::from_options(options).expect("config"))
        .await
        .expect("client on the private node");
    client
        .define_collections(vec![LAST.config().clone(), FIRED.config().clone()])
        .await
        .expect("collections");
    let observed = Arc::new(Observed::default());
    observed.phase.store(BEFORE, Ordering::SeqCst);
    let base = epoch_secs();
    client
        .subscribe(Handler {
            observed: observed.clone(),
            base,
        })
        .await
        .expect("subscribe");

    // One record per key per second (the load of the run, not a synchronisation).
    let rounds_sent = Arc::new(AtomicU64::new(0));
    let (stop_producing, mut stopped) = watch::channel(false);
    let producer = {
        let client = client.clone();
        let topic = topic.clone();
        let rounds_sent = rounds_sent.clone();
        tokio::spawn(async move {
            let mut rounds = tokio::time::interval(Duration::from_secs(1));
            for seq in 0_u64.. {
                tokio::select! {
                    _ = rounds.tick() => {}
                    _ = stopped.wait_for(|stop| *stop) => return seq,
                }
                for key in 0..KEYS {
                    client
                        .send(&topic, &key_name(key), &json!({ "seq": seq }))
                        .await
                        .expect("send (Kafka stays up)");
                }
                rounds_sent.store(seq + 1, Ordering::SeqCst);
            }
            unreachable!("the producer is stopped")
        })
    };

    // The run works on the node before the fault.
    observed
        .until("every key handled records 0..=3 before the fault", |o| {
            o.all_handled(3)
        })
        .await;

    // The fault: the node stops (its data kept) while records keep arriving.
    observed.phase.store(OUTAGE, Ordering::SeqCst);
    let failures_before = pipeline_failures(&client);
    let stopping = Instant::now();
    services_async(&["stop", SERVICE]).await;
    let stopped_after = stopping.elapsed();
    // Every key's work fails and is retried: at least two failures per key.
    until_pipeline_failures(&client, &observed, failures_before, 2 * KEYS as u64).await;
    let outage_failures = pipeline_failures(&client) - failures_before;
    let starting = Instant::now();
    services_async(&["start", SERVICE]).await;
    let ready = Instant::now();
    observed.phase.store(AFTER, Ordering::SeqCst);
    let outage = ready - stopping;
    let round_at_ready = rounds_sent.load(Ordering::SeqCst);

    // Recovery on the same client: records sent during the outage and after it are handled.
    observed
        .until("a handler attempt succeeding after the restart", |o| {
            o.first_success_after.lock().is_some()
        })
        .await;
    let first_success = observed.first_success_after.lock().expect("set") - ready;
    observed
        .until("every record sent before the restart handled", |o| {
            o.all_handled(round_at_ready.saturating_sub(1))
        })
        .await;
    let caught_up = ready.elapsed();
    // A few more rounds on the recovered node, then the last record of each key.
    observed
        .until("three rounds after the restart handled", |o| {
            o.all_handled(round_at_ready + 2)
        })
        .await;
    stop_producing.send_replace(true);
    let rounds = producer.await.expect("producer");
    let last_seq = rounds - 1;
    observed
        .until("every record handled", |o| o.all_handled(last_seq))
        .await;
    let expected_timers: HashSet<(String, u64)> = (0..KEYS)
        .flat_map(|key| {
            (0..rounds).map(move |seq| (key_name(key), timer_time(base, seq).as_secs()))
        })
        .collect();
    observed
        .until("every timer fired", |o| {
            o.fired.lock().is_superset(&expected_timers)
        })
        .await;
    assert_eq!(
        client.consumer_state(),
        ConsumerState::Running,
        "the same client runs on"
    );

    // Nothing committed is lost: read back from the node by a fresh store (not the client's
    // cache). The last record's commit follows its handler, so poll it briefly.
    let store = storage_cassandra::CassandraStore::connect(
        &storage_cassandra::CassandraConfig::new([node.nodes.as_str()]).with_keyspace(&keyspace),
    )
    .await
    .expect("fresh store on the private node");
    let scope = StateScope::group(group.as_str(), "last");
    let deadline = Instant::now() + WAIT;
    let stored = loop {
        let mut stored = BTreeMap::new();
        for key in 0..KEYS {
            let value = store
                .get_value(&scope, &Key::from(key_name(key).as_str()))
                .await
                .expect("read from the restarted node");
            stored.insert(key_name(key), value);
        }
        if stored.values().all(|value| *value == Some(json!(last_seq))) || Instant::now() > deadline
        {
            break stored;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let lost = observed.lost.lock().clone();
    let permanent = observed.permanent.lock().clone();
    let transient = observed.transient[usize::from(OUTAGE)].load(Ordering::SeqCst);
    let retries = observed.retries[usize::from(OUTAGE)].load(Ordering::SeqCst);
    let commit_retries: usize = observed
        .commit_retries
        .iter()
        .map(|count| count.load(Ordering::SeqCst))
        .sum();
    println!(
        "cassandra fault: {rounds} rounds x {KEYS} keys; stop took {stopped_after:?}, start \
         {:?}, outage (stop begun .. node ready) {outage:?}; until the pipeline had counted \
         {outage_failures} transient failures, the handlers saw {transient} store errors and \
         {retries} retried attempts; {commit_retries} retries of a failed commit \
         in all, {} transient errors after the restart; first success {first_success:?} after \
         the node was ready, backlog of {round_at_ready} rounds caught up {caught_up:?} after; \
         {} timers fired",
        ready - starting,
        observed.transient[usize::from(AFTER)].load(Ordering::SeqCst),
        observed.fired.lock().len(),
    );
    assert!(lost.is_empty(), "committed writes missing: {lost:#?}");
    assert!(
        permanent.is_empty(),
        "store errors classified permanent: {permanent:#?}"
    );
    for (key, value) in &stored {
        assert_eq!(
            *value,
            Some(json!(last_seq)),
            "stored `last` of {key} is the last record's"
        );
    }
    client.shutdown().await.expect("shutdown");
    drop(node);
}
