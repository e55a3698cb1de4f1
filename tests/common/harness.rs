//! A recording handler and client helpers for the consumer suites.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody::api::{EventContext, EventHandler, ExciseMessage, HandlerError, Message, Timer};
use prosody::config::{ClientOptions, ProbePort, StorageBackend};
use prosody::{AdminClient, ProsodyClient};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};

/// One handled event, as the recording handler saw it.
#[derive(Clone, Debug)]
pub struct Handled {
    /// Which client handled it.
    pub client: String,
    /// Record key.
    pub key: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// The payload's `seq` (produce order within the key), if any.
    pub seq: Option<u64>,
    /// True for an excise record.
    pub excise: bool,
    /// When the handler started and finished.
    pub started: Instant,
    /// See `started`.
    pub finished: Instant,
}

/// How the recording handler behaves.
#[derive(Clone, Default)]
pub struct Behaviour {
    /// Sleep a pseudo-random 0..=max ms per event.
    pub max_sleep_ms: u64,
    /// Wait for a permit of this semaphore before finishing.
    pub gate: Option<Arc<Semaphore>>,
}

/// Shared record of everything handled, with a counter tests can await.
pub struct Recorder {
    handled: Mutex<Vec<Handled>>,
    running: AtomicUsize,
    peak: AtomicUsize,
    count: watch::Sender<usize>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            handled: Mutex::new(Vec::new()),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            count: watch::channel(0).0,
        })
    }

    /// A handler for `client` recording here.
    pub fn handler(self: &Arc<Self>, client: &str, behaviour: Behaviour) -> RecordingHandler {
        RecordingHandler {
            client: client.to_owned(),
            recorder: self.clone(),
            behaviour,
        }
    }

    /// Waits until at least `count` events were handled (at most `within`).
    pub async fn wait_for(&self, count: usize, within: Duration) {
        let mut updates = self.count.subscribe();
        let reached =
            tokio::time::timeout(within, updates.wait_for(|handled| *handled >= count)).await;
        assert!(
            reached.is_ok(),
            "only {} of {count} events handled within {within:?}",
            self.len()
        );
    }

    /// Events handled so far.
    pub fn len(&self) -> usize {
        self.handled.lock().len()
    }

    /// Everything handled so far.
    pub fn handled(&self) -> Vec<Handled> {
        self.handled.lock().clone()
    }

    /// Handlers running right now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// The most handlers ever running at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Handled events grouped by key, in handling order.
    pub fn by_key(&self) -> HashMap<String, Vec<Handled>> {
        let mut keys: HashMap<String, Vec<Handled>> = HashMap::new();
        for handled in self.handled.lock().iter() {
            keys.entry(handled.key.clone())
                .or_default()
                .push(handled.clone());
        }
        keys
    }

    async fn record(&self, client: &str, behaviour: &Behaviour, mut handled: Handled) {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        if behaviour.max_sleep_ms > 0 {
            // Deterministic spread from the offset: no RNG needed to vary handler time.
            let millis = u64::try_from(handled.offset)
                .unwrap_or(0)
                .wrapping_mul(2_654_435_761)
                % (behaviour.max_sleep_ms + 1);
            tokio::time::sleep(Duration::from_millis(millis)).await;
        }
        if let Some(gate) = &behaviour.gate {
            gate.acquire().await.expect("gate open").forget();
        }
        handled.client = client.to_owned();
        handled.finished = Instant::now();
        self.running.fetch_sub(1, Ordering::SeqCst);
        let count = {
            let mut all = self.handled.lock();
            all.push(handled);
            all.len()
        };
        self.count.send_replace(count);
    }
}

/// The handler of a [`Recorder`].
pub struct RecordingHandler {
    client: String,
    recorder: Arc<Recorder>,
    behaviour: Behaviour,
}

#[async_trait]
impl EventHandler for RecordingHandler {
    type Error = HandlerError;

    async fn on_message(
        &self,
        _: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let handled = Handled {
            client: String::new(),
            key: message.key.to_string(),
            partition: message.partition.0,
            offset: message.offset.0,
            seq: message.payload.get("seq").and_then(Value::as_u64),
            excise: false,
            started: Instant::now(),
            finished: Instant::now(),
        };
        self.recorder
            .record(&self.client, &self.behaviour, handled)
            .await;
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        message: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        let handled = Handled {
            client: String::new(),
            key: message.key.to_string(),
            partition: message.partition.0,
            offset: message.offset.0,
            seq: None,
            excise: true,
            started: Instant::now(),
            finished: Instant::now(),
        };
        self.recorder
            .record(&self.client, &self.behaviour, handled)
            .await;
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Logs of the code under test, filtered by `PROSODY_TEST_LOG` (off when unset).
fn init_logging() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if let Ok(filter) = std::env::var("PROSODY_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
    });
}

/// Options of a client on the real broker with fast commits and no probes, on the storage
/// backend the run asks for (see [`storage_backend`]).
pub fn options(topic: &str, group: &str) -> ClientOptions {
    init_logging();
    with_storage(
        ClientOptions {
            bootstrap_servers: Some(vec![super::bootstrap_servers()]),
            group_id: Some(group.to_owned()),
            // Suites send with the client that consumes; stamped with its own group id (the
            // default) those records would be skipped by loop prevention.
            source_system: Some(format!("{group}-test-sender")),
            subscribed_topics: Some(vec![topic.to_owned()]),
            // The real broker, memory storage unless the run asks for another backend, no
            // telemetry topic (suites that test telemetry turn it on).
            mock: Some(false),
            storage_backend: Some(StorageBackend::Memory),
            telemetry_enabled: Some(false),
            probe_port: Some(ProbePort::Disabled),
            commit_interval_ms: Some(Duration::from_millis(100)),
            // The product default (1 s) is tight for the first sends of a fresh producer on a
            // loaded two-core CI machine; tests are about consuming, not send latency.
            send_timeout_ms: Some(Duration::from_secs(30)),
            shutdown_timeout_ms: Some(Duration::from_secs(10)),
            ..ClientOptions::default()
        },
        group,
    )
}

/// Keyspace of the facade suites on Cassandra; groups are unique per test, which isolates
/// their data.
pub const TEST_KEYSPACE: &str = "prosody_facade_tests";

/// The storage backend the suites run on: `PROSODY_TEST_STORAGE_BACKEND` = `memory` (the
/// default, mock mode's), `rocksdb` or `cassandra`. `scripts/test` runs the pipeline and
/// timer suites once per backend.
pub fn storage_backend() -> StorageBackend {
    match std::env::var("PROSODY_TEST_STORAGE_BACKEND").as_deref() {
        Err(_) | Ok("" | "memory") => StorageBackend::Memory,
        Ok("rocksdb") => StorageBackend::RocksDb,
        Ok("cassandra") => StorageBackend::Cassandra,
        Ok(other) => {
            panic!("PROSODY_TEST_STORAGE_BACKEND={other}: expected memory, rocksdb or cassandra")
        }
    }
}

/// `options` on the run's backend. Mock mode implies memory, so a durable backend turns it
/// off (with telemetry off, as mock mode has it). `RocksDB` clients of `group` get the first
/// directory of the group no live client holds: consecutive clients of a group (a restart)
/// share their store, concurrent ones (a rebalance) each get their own.
pub fn with_storage(options: ClientOptions, group: &str) -> ClientOptions {
    match storage_backend() {
        StorageBackend::Memory => options,
        StorageBackend::RocksDb => ClientOptions {
            mock: Some(false),
            telemetry_enabled: Some(false),
            storage_backend: Some(StorageBackend::RocksDb),
            state_cache_dir: Some(free_rocksdb_dir(group)),
            ..options
        },
        StorageBackend::Cassandra => ClientOptions {
            mock: Some(false),
            telemetry_enabled: Some(false),
            storage_backend: Some(StorageBackend::Cassandra),
            cassandra_nodes: Some(super::cassandra_nodes()),
            cassandra_keyspace: Some(TEST_KEYSPACE.to_owned()),
            ..options
        },
    }
}

/// The first `<tmp>/prosody-tests/<group>-<n>` whose lock no live store holds.
fn free_rocksdb_dir(group: &str) -> PathBuf {
    let root = std::env::temp_dir().join("prosody-tests");
    // More slots than clients any test runs at once.
    (0..64)
        .map(|slot| root.join(format!("{group}-{slot}")))
        .find(|dir| {
            std::fs::create_dir_all(dir).expect("test directory");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(dir.join(storage_rocksdb::LOCK_FILE))
                .expect("lock file");
            // Released when `file` drops, right here.
            fs4::FileExt::try_lock(&file).is_ok()
        })
        .expect("a free directory")
}

/// Creates a topic on the real broker.
pub async fn create_topic(topic: &str, partitions: i32) {
    AdminClient::new(&super::bootstrap_servers())
        .expect("admin client")
        .create_topic(topic, partitions, 1)
        .await
        .expect("create topic");
}

/// Sends `count` records over `keys` keys, each payload carrying its per-key `seq`, keeping
/// many sends in flight while preserving per-key produce order.
pub async fn produce(client: &ProsodyClient, topic: &str, count: usize, keys: usize) {
    use futures::StreamExt;
    let sends = futures::stream::iter(0..count)
        .map(|index| {
            let key = format!("key-{}", index % keys);
            let payload = json!({ "seq": index / keys, "type": "test.event" });
            async move { client.send(topic, &key, &payload).await }
        })
        .buffered(512);
    let results: Vec<_> = sends.collect().await;
    let failures: Vec<_> = results
        .iter()
        .filter_map(|result| result.as_ref().err())
        .collect();
    assert!(
        failures.is_empty(),
        "every send succeeds: {} failed, first: {:?}",
        failures.len(),
        failures.first()
    );
}

/// Polls `condition` until it holds (at most `within`): for state with no event to await.
pub async fn until(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
