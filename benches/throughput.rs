//! Throughput benchmark against real Kafka: how many records per second a consumer gets through.
//!
//! One run pre-produces N records (100-byte JSON payloads over 10,000 keys) into a fresh
//! 8-partition topic, then lets each *subject* consume the whole topic with its own fresh group:
//!
//! - `baseline`: a bare librdkafka consumer that only reads and commits, the ceiling any
//!   framework on top of librdkafka is measured against;
//! - `core`: the pipeline's engine and poll loop calling the same no-op handler with no
//!   middleware at all ([`CoreSubject`]): key queues, offsets, commits, decoding;
//! - `client`: the Prosody client in pipeline mode with a no-op handler ([`ClientSubject`]),
//!   every middleware layer of the mode on (filters, dedup, retry, defer, monopolization,
//!   scheduler, timeout, telemetry), its lifecycle events going nowhere
//!   (`telemetryEnabled: false`);
//! - `client-telemetry`: the same client producing its lifecycle events to a topic of their
//!   own, as the default configuration does: two records produced per record consumed, a cost
//!   of its own, measured beside `client` in the same run;
//! - `client-rocksdb`: the client on the embedded durable backend (`storageBackend: rocksdb`,
//!   a fresh directory per pass, synced writes as by default), where the dedup records of the
//!   handled messages go to disk: what durable deduplication costs over the memory store.
//!
//! The summary prints each median, client/baseline (the core issue's target) and the cost of
//! the middleware, 1 - client/core and 1 - client-telemetry/core (the failure-handling issue's
//! bound), and 1 - client-rocksdb/core.
//!
//! Every subject is timed the same way: from the moment its consumer got its partitions (the
//! end of the group join) to its last record. Joining is left out (it is the broker's
//! rebalance delay, not consumption); fetching is in, for every subject alike. Timing from each
//! subject's *first record* instead, as this bench once did, favoured the baseline: librdkafka
//! starts fetching at assignment and keeps fetching while the subject works, so a subject that
//! reaches its first record sooner and drains faster mostly measures a copy out of
//! librdkafka's prefetch queue, while a slower one has its fetches hidden behind its own work.
//! The first-record rates are still printed (`from first record`) so old figures can be
//! compared. Results are plain `name: value` lines meant to be pasted into notes.
//!
//! Run it with `scripts/bench [-- OPTIONS]`; `--help` lists the options. Needs
//! `PROSODY_BOOTSTRAP_SERVERS`.

use std::collections::HashMap;
use std::env;
use std::error::Error;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use prosody::api::{
    EventContext, EventHandler, ExciseMessage, HandlerError, Message as ProsodyMessage, Timer,
};
use prosody::config::{ProbePort, StorageBackend};
use prosody::pipeline::consumer::poll_loop::{PollLoop, PollSettings, QueueFlowControl};
use prosody::pipeline::consumer::{Engine, EngineLimits};
use prosody::pipeline::dispatch::HandlerService;
use prosody::pipeline::kafka::DecodeLimits;
use prosody::pipeline::middleware::StackDispatch;
use prosody::pipeline::probes::HealthRegistry;
use prosody::{ClientOptions, Config, ProsodyClient};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde_json::Value;
use tokio::sync::Notify;

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const USAGE: &str = "\
usage: throughput [--records N] [--keys N] [--partitions N] [--rounds N] [--only NAMES]
                  [--keep-topic]

  --records N     records to produce and consume (default 200000, env PROSODY_BENCH_RECORDS)
  --keys N        distinct message keys (default 10000)
  --partitions N  partitions of the fresh topic (default 8)
  --rounds N      consume the topic N times per subject, alternating subjects; the summary
                  uses the median rate (default 3: one 200k-record pass lasts well under a
                  second, so single passes are noisy)
  --only NAMES    run only these subjects (comma-separated: baseline, core, client,
                  client-telemetry, client-rocksdb), alternating them round by round; alone,
                  a subject's peak RSS is not mixed with memory the allocator kept from
                  another. client has the telemetry layer without a topic
                  (telemetryEnabled: false) and memory storage; client-telemetry produces its
                  lifecycle events to a fresh topic of their own, as the default
                  configuration does; client-rocksdb keeps its storage in RocksDB
  --keep-topic    leave the bench's topics in Kafka instead of deleting them

Needs PROSODY_BOOTSTRAP_SERVERS (scripts/bench sets it).";

const PAYLOAD_BYTES: usize = 100;
// How often consumers commit: the librdkafka default auto-commit interval, which is what a
// real application that commits periodically would see.
const COMMIT_INTERVAL: Duration = Duration::from_secs(5);
// A subject that receives nothing for this long is stuck; fail instead of hanging.
const NO_PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Options {
    records: usize,
    keys: usize,
    partitions: i32,
    rounds: usize,
    /// Which of [`SUBJECTS`] run.
    selected: [bool; SUBJECTS.len()],
    keep_topic: bool,
}

/// Every subject, in the order of a round's turns (rotated from round to round).
const SUBJECTS: [&str; 5] = [
    "baseline",
    "core",
    "client",
    "client-telemetry",
    "client-rocksdb",
];

/// Positions in [`SUBJECTS`].
const BASELINE: usize = 0;
const CORE: usize = 1;
const CLIENT: usize = 2;
const CLIENT_TELEMETRY: usize = 3;
const CLIENT_ROCKSDB: usize = 4;

/// Which subjects `--only` names: every one when it is absent.
fn select(only: Option<&str>) -> BenchResult<[bool; SUBJECTS.len()]> {
    let Some(only) = only else {
        return Ok([true; SUBJECTS.len()]);
    };
    let mut selected = [false; SUBJECTS.len()];
    for name in only.split(',').map(str::trim) {
        let index = SUBJECTS
            .iter()
            .position(|subject| *subject == name)
            .ok_or_else(|| format!("--only: unknown subject {name:?}, expected {SUBJECTS:?}"))?;
        selected[index] = true;
    }
    Ok(selected)
}

impl Options {
    fn parse() -> BenchResult<Option<Self>> {
        let mut options = Self {
            records: match env::var("PROSODY_BENCH_RECORDS") {
                Ok(value) => parse_number("PROSODY_BENCH_RECORDS", &value)?,
                Err(_) => 200_000,
            },
            keys: 10_000,
            partitions: 8,
            rounds: 3,
            selected: select(None)?,
            keep_topic: false,
        };
        let mut args = env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .ok_or_else(|| format!("{name} needs a value\n\n{USAGE}"))
            };
            match arg.as_str() {
                // `cargo bench` passes `--bench` to every bench binary.
                "--bench" => {}
                "--records" => options.records = parse_number("--records", &value("--records")?)?,
                "--keys" => options.keys = parse_number("--keys", &value("--keys")?)?,
                "--partitions" => {
                    options.partitions = parse_number("--partitions", &value("--partitions")?)?;
                }
                "--rounds" => options.rounds = parse_number("--rounds", &value("--rounds")?)?,
                "--only" => options.selected = select(Some(&value("--only")?))?,
                "--keep-topic" => options.keep_topic = true,
                "-h" | "--help" => {
                    println!("{USAGE}");
                    return Ok(None);
                }
                other => return Err(format!("unknown argument {other:?}\n\n{USAGE}").into()),
            }
        }
        if options.records == 0 || options.keys == 0 || options.partitions <= 0 {
            return Err("--records, --keys and --partitions must be at least 1".into());
        }
        options.rounds = options.rounds.max(1);
        Ok(Some(options))
    }
}

fn parse_number<T: std::str::FromStr>(name: &str, value: &str) -> BenchResult<T> {
    value
        .replace('_', "")
        .parse()
        .map_err(|_| format!("{name}: expected a positive integer, got {value:?}").into())
}

/// When a subject's consumer got its partitions, and its first and last record; and what the
/// whole process had used at the assignment and at the last record.
#[derive(Clone, Copy, Debug)]
struct Timing {
    assigned: Instant,
    first: Instant,
    last: Instant,
    used_assigned: Usage,
    used_last: Usage,
}

/// What this process used so far (all threads), from `/proc/self/stat`. The bench runs on a
/// shared machine: CPU per record is what other load disturbs least, where records per second
/// depend on how much of the machine the subject got. Page faults are shown beside it: on a
/// virtual machine a first touch of memory can cost tens of microseconds of system time, so a
/// subject that grows its memory pays for it in CPU. Zero where `/proc` is missing.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    /// User and system CPU time, in clock ticks of 10 ms (`USER_HZ` is 100 on Linux).
    cpu: Duration,
    /// The system part of `cpu`.
    system: Duration,
    /// Minor page faults: memory touched for the first time (or again after it was returned).
    page_faults: u64,
}

impl Usage {
    fn now() -> Self {
        let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
            return Self::default();
        };
        // The command name in parentheses may hold spaces; the fields after it are fixed.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let number = |index: usize| {
            fields
                .get(index)
                .and_then(|value| value.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // minflt, utime and stime are fields 10, 14 and 15 of the line: 8th, 12th and 13th
        // after the name.
        let (user, system) = (number(11), number(12));
        Self {
            cpu: Duration::from_millis((user + system) * 10),
            system: Duration::from_millis(system * 10),
            page_faults: number(7),
        }
    }

    /// What was used between `earlier` and this reading.
    fn since(self, earlier: Self) -> Self {
        Self {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            system: self.system.saturating_sub(earlier.system),
            page_faults: self.page_faults.saturating_sub(earlier.page_faults),
        }
    }
}

impl Timing {
    /// From the assignment to the last record: what the rates and ratios use.
    fn elapsed(&self) -> Duration {
        self.last.saturating_duration_since(self.assigned)
    }

    /// From the first record to the last (how this bench used to time).
    fn since_first(&self) -> Duration {
        self.last.saturating_duration_since(self.first)
    }

    /// What the process used from the assignment to the last record.
    fn used(&self) -> Usage {
        self.used_last.since(self.used_assigned)
    }
}

/// Notes when a consumer the bench cannot hook got its partitions, by asking `assigned` every
/// millisecond on a thread of its own (a sleeping thread, so it takes no CPU from the subject).
/// The instant noted is at most about a millisecond late, which favours the subject by that
/// much, against runs of hundreds of milliseconds.
struct AssignmentWatch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Option<(Instant, Usage)>>,
}

impl AssignmentWatch {
    fn start(assigned: impl Fn() -> bool + Send + 'static) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::Acquire) {
                    if assigned() {
                        return Some((Instant::now(), Usage::now()));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                None
            }
        });
        Self { stop, thread }
    }

    fn finish(self) -> BenchResult<(Instant, Usage)> {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .map_err(|_| "assignment watch panicked")?
            .ok_or_else(|| "no assignment seen".into())
    }
}

/// Something whose consumption rate is measured: it consumes all `expected` records of `topic`
/// with consumer group `group` and returns its [`Timing`].
trait ThroughputSubject {
    /// The label of the subject's result lines.
    fn name(&self) -> &str;

    /// Consumes and commits the whole topic.
    async fn consume_all(
        &self,
        bootstrap: &str,
        topic: &str,
        group: &str,
        expected: usize,
    ) -> BenchResult<Timing>;
}

/// The ceiling: librdkafka's `BaseConsumer`, no decoding, periodic asynchronous commits of the
/// highest offset seen per partition and a final synchronous commit.
struct BareConsumer;

impl ThroughputSubject for BareConsumer {
    fn name(&self) -> &'static str {
        "baseline"
    }

    async fn consume_all(
        &self,
        bootstrap: &str,
        topic: &str,
        group: &str,
        expected: usize,
    ) -> BenchResult<Timing> {
        let consumer: BaseConsumer<AssignmentClock> =
            consumer_config(bootstrap, group).create_with_context(AssignmentClock::default())?;
        consumer.subscribe(&[topic])?;
        let topic = topic.to_owned();
        // `BaseConsumer::poll` blocks, so the loop gets a thread of its own.
        tokio::task::spawn_blocking(move || {
            let mut progress = Progress::new(expected);
            let mut offsets = Offsets::default();
            while !progress.done() {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(message)) => {
                        offsets.seen(message.partition(), message.offset());
                        progress.record();
                    }
                    Some(Err(error)) => return Err(error.into()),
                    None => progress.check_stuck()?,
                }
                if offsets.commit_due() {
                    consumer.commit(&offsets.list(&topic)?, CommitMode::Async)?;
                }
            }
            consumer.commit(&offsets.list(&topic)?, CommitMode::Sync)?;
            let assigned = (*consumer.context().assigned.lock()).ok_or("no assignment seen")?;
            progress.timing(assigned)
        })
        .await?
    }
}

/// Notes when the baseline's consumer got its partitions: librdkafka calls it from `poll`.
#[derive(Default)]
struct AssignmentClock {
    assigned: parking_lot::Mutex<Option<(Instant, Usage)>>,
}

impl ClientContext for AssignmentClock {}

impl ConsumerContext for AssignmentClock {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Assign(_)) {
            self.assigned
                .lock()
                .get_or_insert_with(|| (Instant::now(), Usage::now()));
        }
    }
}

/// The Prosody client in pipeline mode with a no-op handler: everything a record goes through
/// in production (decode, key queues, offsets, commits) except the application's own work.
struct ClientSubject {
    /// `client`, `client-telemetry` or `client-rocksdb`.
    name: &'static str,
    /// Where its lifecycle events go; none: telemetry is disabled.
    telemetry: Option<TelemetryTopic>,
    /// Where its dedup records, timers and deferred work are kept.
    storage: Storage,
}

/// A client subject's storage backend.
#[derive(Clone, Copy)]
enum Storage {
    /// In memory, as mock mode keeps them.
    Memory,
    /// The embedded durable backend, in a fresh directory per pass, with its defaults (synced
    /// writes).
    RocksDb,
}

/// The topic of the client's lifecycle events.
struct TelemetryTopic {
    name: String,
    partitions: i32,
    /// Events on it after the last pass.
    events: AtomicI64,
}

impl TelemetryTopic {
    /// Events that reached the topic since the last call.
    async fn new_events(&self, bootstrap: &str) -> BenchResult<i64> {
        let (bootstrap, name, partitions) =
            (bootstrap.to_owned(), self.name.clone(), self.partitions);
        let total = tokio::task::spawn_blocking(move || records_on(&bootstrap, &name, partitions))
            .await??;
        Ok(total - self.events.swap(total, Ordering::Relaxed))
    }
}

/// Handled records and the first and last instant.
struct Counts {
    expected: usize,
    count: AtomicUsize,
    first: parking_lot::Mutex<Option<Instant>>,
    last: parking_lot::Mutex<Option<(Instant, Usage)>>,
    done: Notify,
}

/// A no-op handler that only counts into [`Counts`].
struct CountingHandler(Arc<Counts>);

#[async_trait]
impl EventHandler for CountingHandler {
    type Error = HandlerError;

    async fn on_message(
        &self,
        _: &dyn EventContext,
        _: &ProsodyMessage,
    ) -> Result<Value, HandlerError> {
        // One shared counter and nothing else per record: the first and last records read
        // the clock and take a lock, the others only count. Runners on every worker run this,
        // so a lock or a clock read per record would be the bench's own cost in the figures.
        let counts = &self.0;
        let handled = counts.count.fetch_add(1, Ordering::AcqRel) + 1;
        if handled == 1 {
            *counts.first.lock() = Some(Instant::now());
        }
        if handled == counts.expected {
            *counts.last.lock() = Some((Instant::now(), Usage::now()));
            counts.done.notify_one();
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

impl Counts {
    fn new(expected: usize) -> Arc<Self> {
        Arc::new(Self {
            expected,
            count: AtomicUsize::new(0),
            first: parking_lot::Mutex::new(None),
            last: parking_lot::Mutex::new(None),
            done: Notify::new(),
        })
    }

    /// Waits until every expected record was handled; fails when none arrives for
    /// [`NO_PROGRESS_TIMEOUT`].
    async fn all_handled(&self, who: &str) -> BenchResult<()> {
        loop {
            let before = self.count.load(Ordering::Acquire);
            if before >= self.expected {
                return Ok(());
            }
            if tokio::time::timeout(NO_PROGRESS_TIMEOUT, self.done.notified())
                .await
                .is_err()
                && self.count.load(Ordering::Acquire) == before
            {
                return Err(format!("{who} stuck at {before} of {} records", self.expected).into());
            }
        }
    }

    fn timing(&self, (assigned, used_assigned): (Instant, Usage)) -> BenchResult<Timing> {
        let first = self.first.lock().ok_or("no first record")?;
        let (last, used_last) = self.last.lock().ok_or("no last record")?;
        Ok(Timing {
            assigned,
            first,
            last,
            used_assigned,
            used_last,
        })
    }
}

fn client_options(
    bootstrap: &str,
    topic: &str,
    group: &str,
    telemetry_topic: Option<&str>,
) -> ClientOptions {
    ClientOptions {
        bootstrap_servers: Some(vec![bootstrap.to_owned()]),
        group_id: Some(group.to_owned()),
        subscribed_topics: Some(vec![topic.to_owned()]),
        // The real broker, memory storage unless a subject chooses otherwise, lifecycle events
        // only for `client-telemetry`.
        storage_backend: Some(StorageBackend::Memory),
        telemetry_enabled: Some(telemetry_topic.is_some()),
        telemetry_topic: telemetry_topic.map(str::to_owned),
        probe_port: Some(ProbePort::Disabled),
        ..ClientOptions::default()
    }
}

impl ThroughputSubject for ClientSubject {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn consume_all(
        &self,
        bootstrap: &str,
        topic: &str,
        group: &str,
        expected: usize,
    ) -> BenchResult<Timing> {
        let telemetry_topic = self.telemetry.as_ref().map(|topic| topic.name.as_str());
        let mut options = client_options(bootstrap, topic, group, telemetry_topic);
        // Removed when the pass ends, after the client shut down.
        let directory = match self.storage {
            Storage::Memory => None,
            Storage::RocksDb => {
                let directory = tempfile::Builder::new()
                    .prefix("prosody-bench-")
                    .tempdir()?;
                options.storage_backend = Some(StorageBackend::RocksDb);
                options.state_cache_dir = Some(directory.path().to_path_buf());
                Some(directory)
            }
        };
        let client = ProsodyClient::from_options(options).await?;
        let counts = Counts::new(expected);
        let watch = AssignmentWatch::start({
            let client = client.clone();
            move || client.assigned_partition_count() > 0
        });
        client.subscribe(CountingHandler(counts.clone())).await?;
        let outcome = counts.all_handled(self.name()).await;
        let assigned = watch.finish();
        client.shutdown().await?;
        drop(directory);
        outcome?;
        let timing = counts.timing(assigned?)?;
        if let Some(telemetry) = &self.telemetry {
            let this_pass = telemetry.new_events(bootstrap).await?;
            // Precision loss only past 2^52 records.
            #[allow(clippy::cast_precision_loss)]
            let per_record = this_pass as f64 / expected as f64;
            println!(
                "{}: {this_pass} lifecycle events reached the telemetry topic \
                 ({per_record:.2} per record; the rest were dropped)",
                self.name
            );
        }
        Ok(timing)
    }
}

/// Records on `topic`: the sum of its partitions' high watermarks.
fn records_on(bootstrap: &str, topic: &str, partitions: i32) -> BenchResult<i64> {
    let consumer: BaseConsumer = consumer_config(bootstrap, "prosody-bench-watermarks").create()?;
    let mut total = 0;
    for partition in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(topic, partition, ADMIN_TIMEOUT)?;
        total += high;
    }
    Ok(total)
}

/// The pipeline without middleware: the poll loop, the engine (key queues, offsets, commits,
/// backpressure, a plain semaphore for `maxConcurrency`) and the handler service, configured
/// with the client's defaults. What the client costs on top of this is the middleware.
struct CoreSubject;

impl ThroughputSubject for CoreSubject {
    fn name(&self) -> &'static str {
        "core"
    }

    async fn consume_all(
        &self,
        bootstrap: &str,
        topic: &str,
        group: &str,
        expected: usize,
    ) -> BenchResult<Timing> {
        let config = Config::from_options(client_options(bootstrap, topic, group, None))?;
        let counts = Counts::new(expected);
        let handler = HandlerService::new(Arc::new(CountingHandler(counts.clone())));
        let dispatch = Arc::new(StackDispatch::from_service(Arc::new(handler)));
        let flow = Arc::new(QueueFlowControl::default());
        let runtime = tokio::runtime::Handle::current();
        let health = HealthRegistry::new();
        let watch = AssignmentWatch::start({
            let health = health.clone();
            move || health.assigned_partition_count() > 0
        });
        let engine = Engine::new(
            EngineLimits {
                max_concurrency: config.consumer.max_concurrency.get(),
                max_uncommitted: config.consumer.max_uncommitted.get(),
                shutdown_timeout: config.consumer.shutdown_timeout,
            },
            dispatch,
            flow.clone(),
            health.clone(),
            runtime.clone(),
        );
        let settings = PollSettings {
            bootstrap_servers: bootstrap.to_owned(),
            group_id: group.to_owned(),
            topics: vec![topic.to_owned()],
            commit_interval: config.consumer.commit_interval,
            poll_interval: config.consumer.poll_interval,
            decode: DecodeLimits::default(),
            overrides: Vec::new(),
        };
        let poll = PollLoop::start(&settings, engine, &flow, runtime)?;
        let outcome = counts.all_handled(self.name()).await;
        let assigned = watch.finish();
        poll.stop().await;
        outcome?;
        counts.timing(assigned?)
    }
}

fn consumer_config(bootstrap: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    config
}

/// Counts records and notes the first and last arrival.
struct Progress {
    expected: usize,
    received: usize,
    first: Option<Instant>,
    last: Instant,
}

impl Progress {
    fn new(expected: usize) -> Self {
        Self {
            expected,
            received: 0,
            first: None,
            last: Instant::now(),
        }
    }

    fn record(&mut self) {
        self.last = Instant::now();
        self.first.get_or_insert(self.last);
        self.received += 1;
    }

    fn done(&self) -> bool {
        self.received >= self.expected
    }

    fn check_stuck(&self) -> BenchResult<()> {
        if self.last.elapsed() > NO_PROGRESS_TIMEOUT {
            Err(self.stuck_error())
        } else {
            Ok(())
        }
    }

    fn stuck_error(&self) -> Box<dyn Error + Send + Sync> {
        format!(
            "no record for {NO_PROGRESS_TIMEOUT:?} after {} of {} records",
            self.received, self.expected
        )
        .into()
    }

    fn timing(&self, (assigned, used_assigned): (Instant, Usage)) -> BenchResult<Timing> {
        Ok(Timing {
            assigned,
            first: self.first.ok_or("no first record")?,
            last: self.last,
            used_assigned,
            used_last: Usage::now(),
        })
    }
}

/// The next offset to commit per partition, and when to commit it.
struct Offsets {
    next: HashMap<i32, i64>,
    last_commit: Instant,
}

impl Default for Offsets {
    fn default() -> Self {
        Self {
            next: HashMap::new(),
            last_commit: Instant::now(),
        }
    }
}

impl Offsets {
    fn seen(&mut self, partition: i32, offset: i64) {
        self.next.insert(partition, offset + 1);
    }

    fn commit_due(&mut self) -> bool {
        let due = self.last_commit.elapsed() >= COMMIT_INTERVAL;
        if due {
            self.last_commit = Instant::now();
        }
        due
    }

    fn list(&self, topic: &str) -> BenchResult<TopicPartitionList> {
        let mut list = TopicPartitionList::with_capacity(self.next.len());
        for (&partition, &next) in &self.next {
            list.add_partition_offset(topic, partition, Offset::Offset(next))?;
        }
        Ok(list)
    }
}

/// Counts failed deliveries so a broken produce phase is reported, not measured.
#[derive(Default)]
struct DeliveryTally {
    failed: AtomicUsize,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryTally {}

impl ProducerContext for DeliveryTally {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        if let Err((error, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut first) = self.first_error.lock() {
                first.get_or_insert_with(|| error.to_string());
            }
        }
    }
}

/// A JSON document of exactly `PAYLOAD_BYTES` bytes, shaped like an application event.
fn payload(sequence: usize, key: &str) -> String {
    let mut json = format!(r#"{{"type":"bench.event","id":"{sequence}","key":"{key}","pad":""#);
    let pad = PAYLOAD_BYTES.saturating_sub(json.len() + 2);
    json.extend(std::iter::repeat_n('x', pad));
    json.push_str("\"}");
    json
}

fn produce(bootstrap: &str, topic: &str, records: usize, keys: usize) -> BenchResult<Duration> {
    let producer: BaseProducer<DeliveryTally> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .create_with_context(DeliveryTally::default())?;
    let started = Instant::now();
    let mut key = String::new();
    for sequence in 0..records {
        key.clear();
        write!(key, "key-{:05}", sequence % keys)?;
        let value = payload(sequence, &key);
        if value.len() != PAYLOAD_BYTES {
            return Err(format!(
                "payload of {} bytes, not {PAYLOAD_BYTES}: {value}",
                value.len()
            )
            .into());
        }
        let mut record = BaseRecord::to(topic)
            .key(key.as_str())
            .payload(value.as_str());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // The local queue is full: serve delivery reports to make room.
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(120))?;
    let elapsed = started.elapsed();
    let tally = producer.context();
    let failed = tally.failed.load(Ordering::Relaxed);
    if failed > 0 {
        let first = tally
            .first_error
            .lock()
            .ok()
            .and_then(|first| first.clone())
            .unwrap_or_default();
        return Err(format!("{failed} records were not delivered (first error: {first})").into());
    }
    Ok(elapsed)
}

async fn create_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    partitions: i32,
) -> BenchResult<()> {
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for result in admin.create_topics([&new_topic], &options).await? {
        result.map_err(|(name, code)| format!("cannot create topic {name}: {code}"))?;
    }
    Ok(())
}

async fn delete_topic(admin: &AdminClient<DefaultClientContext>, topic: &str) -> BenchResult<()> {
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    for result in admin.delete_topics(&[topic], &options).await? {
        result.map_err(|(name, code)| format!("cannot delete topic {name}: {code}"))?;
    }
    Ok(())
}

/// Resident set size figures of this process, from `/proc/self/status`.
struct Memory {
    current_kib: u64,
    peak_kib: u64,
}

impl Memory {
    fn read() -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse().ok())
        };
        Some(Self {
            current_kib: field("VmRSS:")?,
            peak_kib: field("VmHWM:")?,
        })
    }

    /// Starts a new peak measurement (Linux resets `VmHWM` when "5" is written to
    /// `clear_refs`), so each phase reports its own peak. Returns whether it worked.
    fn reset_peak() -> bool {
        std::fs::write("/proc/self/clear_refs", "5").is_ok()
    }
}

fn mib(kib: u64) -> String {
    // Precision loss only past 2^52 KiB.
    #[allow(clippy::cast_precision_loss)]
    let mib = kib as f64 / 1024.0;
    format!("{mib:.1} MiB")
}

/// Tracks the process-wide peak across phases even though each phase resets `VmHWM`.
struct MemoryReport {
    peak_kib: u64,
    per_phase: bool,
}

impl MemoryReport {
    fn start() -> Self {
        let per_phase = Memory::reset_peak();
        Self {
            peak_kib: Memory::read().map_or(0, |memory| memory.peak_kib),
            per_phase,
        }
    }

    fn after(&mut self, phase: &str) {
        let Some(memory) = Memory::read() else {
            println!("rss after {phase}: unavailable (no /proc/self/status)");
            return;
        };
        self.peak_kib = self.peak_kib.max(memory.peak_kib);
        if self.per_phase {
            println!(
                "rss after {phase}: {} (phase peak {})",
                mib(memory.current_kib),
                mib(memory.peak_kib)
            );
            self.per_phase = Memory::reset_peak();
        } else {
            println!(
                "rss after {phase}: {} (process peak so far {})",
                mib(memory.current_kib),
                mib(memory.peak_kib)
            );
        }
    }
}

fn rate(records: usize, elapsed: Duration) -> f64 {
    // Record counts stay far below 2^52.
    #[allow(clippy::cast_precision_loss)]
    let records = records as f64;
    records / elapsed.as_secs_f64().max(f64::EPSILON)
}

/// One measurement's rates: from the assignment (the figure) and from the first record.
#[derive(Clone, Copy)]
struct Rates {
    assigned: f64,
    first: f64,
    /// Process CPU microseconds per record.
    cpu_us: f64,
    /// Page faults per 1,000 records.
    faults_per_1k: f64,
}

fn median(rates: &mut [f64]) -> Option<f64> {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied()
}

async fn measure(
    subject: &impl ThroughputSubject,
    bootstrap: &str,
    topic: &str,
    round: usize,
    records: usize,
    memory: &mut MemoryReport,
) -> BenchResult<Rates> {
    let group = format!("{topic}-{}-{round}", subject.name());
    let timing = subject
        .consume_all(bootstrap, topic, &group, records)
        .await
        .map_err(|error| format!("{}: {error}", subject.name()))?;
    let per_second = rate(records, timing.elapsed());
    let from_first = rate(records, timing.since_first());
    // Precision loss only past 2^52 records.
    #[allow(clippy::cast_precision_loss)]
    let (used, records_f64) = (timing.used(), records as f64);
    let cpu_us = used.cpu.as_secs_f64() * 1e6 / records_f64;
    let system_share = used.system.as_secs_f64() / used.cpu.as_secs_f64().max(f64::EPSILON);
    // Precision loss only past 2^52 faults.
    #[allow(clippy::cast_precision_loss)]
    let faults_per_1k = used.page_faults as f64 * 1e3 / records_f64;
    println!(
        "{}: {per_second:.0} records/s ({records} records in {:.3} s from assignment; \
         first record after {:.3} s; from first record {from_first:.0} records/s; \
         process CPU {cpu_us:.2} us/record, {:.0}% of it system; \
         {faults_per_1k:.0} page faults per 1,000 records)",
        subject.name(),
        timing.elapsed().as_secs_f64(),
        timing
            .first
            .saturating_duration_since(timing.assigned)
            .as_secs_f64(),
        system_share * 100.0
    );
    memory.after(subject.name());
    Ok(Rates {
        assigned: per_second,
        first: from_first,
        cpu_us,
        faults_per_1k,
    })
}

async fn run(options: &Options) -> BenchResult<()> {
    let bootstrap = env::var("PROSODY_BOOTSTRAP_SERVERS").map_err(|_| {
        "PROSODY_BOOTSTRAP_SERVERS is not set: this benchmark needs a real Kafka. \
         Run scripts/bench, or `eval \"$(scripts/services up kafka)\"` first."
    })?;
    let mut memory = MemoryReport::start();
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let topic = format!("prosody-bench-{unix_ms}-{}", std::process::id());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let telemetry_topic = options.selected[CLIENT_TELEMETRY].then(|| format!("{topic}-telemetry"));
    let topics: Vec<&str> = std::iter::once(topic.as_str())
        .chain(telemetry_topic.as_deref())
        .collect();
    for (created, name) in topics.iter().enumerate() {
        if let Err(error) = create_topic(&admin, name, options.partitions).await {
            // Those made before it are not left behind.
            for made in &topics[..created] {
                let _ = delete_topic(&admin, made).await;
            }
            return Err(error);
        }
    }
    println!(
        "bench: topic {topic} ({} partitions), {} records, {} keys, {PAYLOAD_BYTES}-byte payloads, {} round(s)",
        options.partitions, options.records, options.keys, options.rounds
    );

    // The client subjects, in their order in [`SUBJECTS`] from `client` on.
    let clients = [
        ClientSubject {
            name: SUBJECTS[CLIENT],
            telemetry: None,
            storage: Storage::Memory,
        },
        ClientSubject {
            name: SUBJECTS[CLIENT_TELEMETRY],
            telemetry: telemetry_topic.clone().map(|name| TelemetryTopic {
                name,
                partitions: options.partitions,
                events: AtomicI64::new(0),
            }),
            storage: Storage::Memory,
        },
        ClientSubject {
            name: SUBJECTS[CLIENT_ROCKSDB],
            telemetry: None,
            storage: Storage::RocksDb,
        },
    ];
    let outcome = measure_all(&bootstrap, &topic, options, &clients, &mut memory).await;
    for name in &topics {
        if options.keep_topic {
            println!("bench: kept topic {name}");
        } else if let Err(error) = delete_topic(&admin, name).await {
            eprintln!("bench: warning: {error}");
        }
    }
    outcome?;
    println!("peak rss: {}", mib(memory.peak_kib));
    Ok(())
}

async fn measure_all(
    bootstrap: &str,
    topic: &str,
    options: &Options,
    clients: &[ClientSubject; SUBJECTS.len() - CLIENT],
    memory: &mut MemoryReport,
) -> BenchResult<()> {
    let produce_elapsed = {
        let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
        let (records, keys) = (options.records, options.keys);
        // librdkafka's producer API is blocking; keep it off the async workers.
        tokio::task::spawn_blocking(move || produce(&bootstrap, &topic, records, keys)).await??
    };
    println!(
        "produce: {:.0} records/s ({} records in {:.3} s)",
        rate(options.records, produce_elapsed),
        options.records,
        produce_elapsed.as_secs_f64()
    );
    memory.after("produce");

    let mut rates: [Vec<Rates>; SUBJECTS.len()] = Default::default();
    for round in 0..options.rounds {
        // Rotating who goes first spreads any warm-up or leftover-memory advantage evenly.
        for turn in 0..SUBJECTS.len() {
            let index = (turn + round) % SUBJECTS.len();
            if !options.selected[index] {
                continue;
            }
            let (bootstrap, topic, records) = (bootstrap, topic, options.records);
            let rate = match index {
                BASELINE => {
                    measure(&BareConsumer, bootstrap, topic, round, records, memory).await?
                }
                CORE => measure(&CoreSubject, bootstrap, topic, round, records, memory).await?,
                client => {
                    let client = &clients[client - CLIENT];
                    measure(client, bootstrap, topic, round, records, memory).await?
                }
            };
            rates[index].push(rate);
        }
    }
    let medians = |pick: fn(&Rates) -> f64| {
        rates
            .each_ref()
            .map(|rates| median(&mut rates.iter().map(pick).collect::<Vec<_>>()))
    };
    let first = medians(|rates| rates.first);
    let assigned = medians(|rates| rates.assigned);
    for (name, (rate, first)) in SUBJECTS.iter().zip(assigned.iter().zip(first)) {
        if let (Some(rate), Some(first)) = (rate, first) {
            println!(
                "{name} median: {rate:.0} records/s (from first record: {first:.0} records/s)"
            );
        }
    }
    print_usage(
        medians(|rates| rates.cpu_us),
        medians(|rates| rates.faults_per_1k),
    );
    if let (Some(baseline), Some(client), Some(core)) =
        (first[BASELINE], first[CLIENT], first[CORE])
    {
        println!(
            "from first record: client/baseline {:.2}, core/baseline {:.2}, 1 - client/core {:.1}%",
            client / baseline,
            core / baseline,
            (1.0 - client / core) * 100.0
        );
    }
    print_ratios(&assigned);
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match Options::parse() {
        Ok(Some(options)) => options,
        Ok(None) => return ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: error: {error}");
            return ExitCode::from(2);
        }
    };
    match run(&options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The costs the summary reports: (numerator, denominator, what `1 - numerator/denominator` is).
const COSTS: [(usize, usize, &str); 5] = [
    (CLIENT, CORE, "middleware cost (1 - client/core)"),
    (
        CLIENT_TELEMETRY,
        CORE,
        "middleware cost with telemetry (1 - client-telemetry/core)",
    ),
    (
        CLIENT_TELEMETRY,
        CLIENT,
        "telemetry cost (1 - client-telemetry/client)",
    ),
    (
        CLIENT_ROCKSDB,
        CORE,
        "middleware cost on RocksDB (1 - client-rocksdb/core)",
    ),
    (
        CLIENT_ROCKSDB,
        CLIENT,
        "durable storage cost (1 - client-rocksdb/client)",
    ),
];

/// The median rates' ratios to the baseline and the [`COSTS`] of the subjects that ran.
fn print_ratios(rates: &[Option<f64>; SUBJECTS.len()]) {
    let ratio = |numerator: usize, denominator: usize| {
        rates[numerator]
            .zip(rates[denominator])
            .map(|(numerator, denominator)| numerator / denominator)
    };
    if let Some(ratio) = ratio(CLIENT, BASELINE) {
        println!("ratio client/baseline: {ratio:.2}");
    }
    if let Some(ratio) = ratio(CORE, BASELINE) {
        println!("ratio core/baseline: {ratio:.2}");
    }
    for (numerator, denominator, cost) in COSTS {
        if let Some(ratio) = ratio(numerator, denominator) {
            println!("{cost}: {:.1}%", (1.0 - ratio) * 100.0);
        }
    }
}

/// The medians of CPU and page faults per record, and the ratios by CPU.
fn print_usage(cpu: [Option<f64>; SUBJECTS.len()], faults: [Option<f64>; SUBJECTS.len()]) {
    for (name, cpu) in SUBJECTS.iter().zip(cpu) {
        if let Some(cpu) = cpu {
            println!("{name} median CPU: {cpu:.2} us/record");
        }
    }
    for (name, faults) in SUBJECTS.iter().zip(faults) {
        if let Some(faults) = faults {
            println!("{name} median page faults: {faults:.0} per 1,000 records");
        }
    }
    if let (Some(baseline), Some(core), Some(client)) = (cpu[BASELINE], cpu[CORE], cpu[CLIENT]) {
        println!(
            "by CPU per record: client/baseline {:.2}, core/baseline {:.2}, \
             middleware cost (1 - core/client) {:.1}%",
            baseline / client,
            baseline / core,
            (1.0 - core / client) * 100.0
        );
    }
}
