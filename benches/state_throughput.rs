//! Keyed-state benchmark against real Kafka: a handler doing one `get` and one `set` of a value
//! collection per event, on the embedded `RocksDB` store, side by side with the same client
//! and a no-op handler (no state) as the baseline.
//!
//! Reports events/second (first to last handled event, so group join is left out) and the
//! latency of the state commit (the one atomic `apply` per successful attempt: p50/p99/max),
//! measured by a store wrapper around `RocksStore`.
//!
//! Run: `PROSODY_BOOTSTRAP_SERVERS=... cargo bench --bench state_throughput [-- RECORDS KEYS]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::Mutex;
use prosody::api::storage::{DequeBounds, ScanRequest, StateScope, StateStore, StateWrite};
use prosody::api::{
    EventContext, EventHandler, ExciseMessage, HandlerError, Key, Message, SlabSize, StorageError,
    Timer,
};
use prosody::config::{ClientOptions, Config, ProbePort, StorageBackend};
use prosody::pipeline::state::{self, StateContextExt};
use prosody::{AdminClient, ProsodyClient};
use serde_json::{Value, json};
use tokio::sync::Notify;

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Records the duration of every `apply` of the wrapped store.
#[derive(Debug)]
struct Timed {
    inner: Arc<dyn StateStore>,
    applies: Mutex<Vec<Duration>>,
}

#[async_trait]
impl StateStore for Timed {
    async fn get_value(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        self.inner.get_value(scope, key).await
    }
    async fn get_map_entries(
        &self,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.inner.get_map_entries(scope, key, entries).await
    }
    async fn scan_map(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        self.inner.scan_map(scope, key, scan).await
    }
    async fn get_deque_bounds(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        self.inner.get_deque_bounds(scope, key).await
    }
    async fn get_deque_items(
        &self,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        self.inner.get_deque_items(scope, key, positions).await
    }
    async fn scan_deque(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        self.inner.scan_deque(scope, key, scan).await
    }
    async fn apply(&self, writes: &[StateWrite]) -> Result<(), StorageError> {
        let started = Instant::now();
        let result = self.inner.apply(writes).await;
        self.applies.lock().push(started.elapsed());
        result
    }
}

struct Counting {
    stateful: bool,
    handled: AtomicUsize,
    target: usize,
    first: Mutex<Option<Instant>>,
    last: Mutex<Option<Instant>>,
    done: Notify,
}

static COUNT: std::sync::LazyLock<state::Definition<state::kinds::Value>> =
    std::sync::LazyLock::new(|| state::value("bench_count").ttl_seconds(86_400));

#[async_trait]
impl EventHandler for Counting {
    type Error = HandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        _: &Message,
    ) -> Result<Value, HandlerError> {
        if self.stateful {
            let count = context.state(&COUNT).map_err(HandlerError::transient)?;
            let next = count
                .get()
                .await
                .map_err(HandlerError::transient)?
                .and_then(|value| value.as_u64())
                .unwrap_or(0)
                + 1;
            count
                .set(json!(next))
                .await
                .map_err(HandlerError::transient)?;
        }
        let now = Instant::now();
        self.first.lock().get_or_insert(now);
        *self.last.lock() = Some(now);
        if self.handled.fetch_add(1, Ordering::SeqCst) + 1 >= self.target {
            self.done.notify_one();
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

fn options(bootstrap: &str, topic: &str, group: &str) -> ClientOptions {
    ClientOptions {
        bootstrap_servers: Some(vec![bootstrap.to_owned()]),
        group_id: Some(group.to_owned()),
        source_system: Some(format!("{group}-sender")),
        subscribed_topics: Some(vec![topic.to_owned()]),
        probe_port: Some(ProbePort::Disabled),
        // The stores are given to the client directly (`with_stores`); this only satisfies
        // backend selection.
        storage_backend: Some(StorageBackend::Memory),
        telemetry_enabled: Some(false),
        send_timeout_ms: Some(Duration::from_secs(30)),
        ..ClientOptions::default()
    }
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into a vector"
    )]
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

async fn run(
    bootstrap: &str,
    topic: &str,
    records: usize,
    stateful: bool,
    round: usize,
) -> BenchResult<()> {
    let name = if stateful {
        "state_rocksdb"
    } else {
        "baseline_noop"
    };
    // A fresh group per run: each consumes the whole topic.
    let group = format!("{topic}-{name}-{round}");
    let rocks = storage_rocksdb::RocksStore::open_temporary(&storage_rocksdb::RocksOptions::new())?;
    let store = Arc::new(Timed {
        inner: Arc::new(rocks),
        applies: Mutex::new(Vec::new()),
    });
    let timers = Arc::new(storage_memory::MemoryTimerStore::new(SlabSize::default()));
    let client = ProsodyClient::with_stores(
        Config::from_options(options(bootstrap, topic, &group))?,
        timers,
        store.clone(),
    )
    .await?;
    if stateful {
        client.define_collections([COUNT.config().clone()]).await?;
    }
    let handler = Arc::new(Counting {
        stateful,
        handled: AtomicUsize::new(0),
        target: records,
        first: Mutex::new(None),
        last: Mutex::new(None),
        done: Notify::new(),
    });
    let shared = handler.clone();
    client.subscribe(SharedHandler(shared)).await?;
    tokio::time::timeout(Duration::from_secs(600), handler.done.notified()).await?;
    client.shutdown().await?;
    let elapsed = match (*handler.first.lock(), *handler.last.lock()) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    };
    #[allow(clippy::cast_precision_loss, reason = "a rate")]
    let rate = records as f64 / elapsed.as_secs_f64().max(f64::EPSILON);
    println!("{name}.events_per_sec: {rate:.0}");
    let mut applies = store.applies.lock().clone();
    applies.sort_unstable();
    if !applies.is_empty() {
        println!("{name}.commits: {}", applies.len());
        println!(
            "{name}.commit_p50_us: {}",
            percentile(&applies, 0.5).as_micros()
        );
        println!(
            "{name}.commit_p99_us: {}",
            percentile(&applies, 0.99).as_micros()
        );
        println!(
            "{name}.commit_max_us: {}",
            applies.last().copied().unwrap_or_default().as_micros()
        );
    }
    Ok(())
}

struct SharedHandler(Arc<Counting>);

#[async_trait]
impl EventHandler for SharedHandler {
    type Error = HandlerError;
    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        self.0.on_message(context, message).await
    }
    async fn on_excise(
        &self,
        context: &dyn EventContext,
        message: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        self.0.on_excise(context, message).await
    }
    async fn on_timer(
        &self,
        context: &dyn EventContext,
        timer: &Timer,
    ) -> Result<(), HandlerError> {
        self.0.on_timer(context, timer).await
    }
}

#[tokio::main]
async fn main() -> BenchResult<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let records: usize = args.first().map_or(Ok(50_000), |arg| arg.parse())?;
    let keys: usize = args.get(1).map_or(Ok(1_000), |arg| arg.parse())?;
    let bootstrap = std::env::var("PROSODY_BOOTSTRAP_SERVERS")?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let topic = format!("state_bench_{stamp}");
    AdminClient::new(&bootstrap)?
        .create_topic(&topic, 8, 1)
        .await?;
    let sender = ProsodyClient::new(Config::from_options(options(
        &bootstrap,
        &topic,
        "state_bench_sender",
    ))?)
    .await?;
    let sends = futures::stream::iter(0..records)
        .map(|index| {
            let key = format!("key-{}", index % keys);
            let sender = &sender;
            let topic = &topic;
            async move { sender.send(topic, &key, &json!({"seq": index})).await }
        })
        .buffer_unordered(1_024);
    let failed = sends
        .filter(|sent| futures::future::ready(sent.is_err()))
        .count()
        .await;
    if failed > 0 {
        return Err(format!("{failed} sends failed").into());
    }
    sender.shutdown().await?;
    println!("records: {records}, keys: {keys}, partitions: 8");
    // Baseline and state alternate so drift on the shared machine hits both.
    for round in 0..2 {
        run(&bootstrap, &topic, records, false, round).await?;
        run(&bootstrap, &topic, records, true, round).await?;
    }
    AdminClient::new(&bootstrap)?
        .delete_topic(&topic)
        .await
        .ok();
    Ok(())
}
