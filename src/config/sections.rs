//! The resolved configuration, one small struct per concern.
//!
//! Every value here has been through precedence and validation: a component takes the section
//! it needs and trusts it. The sections are `#[non_exhaustive]` so that the only way to make one
//! is [`Config::from_options`](super::Config::from_options); that is what keeps the invariants
//! documented on each field true.

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use super::kinds::{Mode, SpanRelation, StorageBackend};
use super::value::Secret;

/// A fully resolved and validated client configuration.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Kafka connection and client identity.
    pub kafka: KafkaConfig,
    /// Subscription, concurrency limits and consumer timing.
    pub consumer: ConsumerConfig,
    /// Processing mode, failure topic and retry policy.
    pub failure: FailureConfig,
    /// Message deduplication.
    pub dedup: DedupConfig,
    /// Deferral of transiently failing work (pipeline mode).
    pub defer: DeferConfig,
    /// Hot-key protection (pipeline mode).
    pub monopolization: MonopolizationConfig,
    /// Fair scheduling between keys.
    pub scheduler: SchedulerConfig,
    /// Durable timers.
    pub timers: TimerConfig,
    /// Tracing, logging and lifecycle events.
    pub telemetry: TelemetryConfig,
    /// Health-probe server.
    pub probes: ProbeConfig,
    /// The Cassandra cluster: `Some` exactly when `cassandraNodes` is configured, and always
    /// `Some` when [`StorageConfig::backend`] is [`StorageBackend::Cassandra`].
    pub cassandra: Option<CassandraConfig>,
    /// Storage backend selection and keyed-state caches.
    pub storage: StorageConfig,
}

/// Kafka connection and client identity.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KafkaConfig {
    /// Broker addresses. Empty only in mock mode, where it means "start librdkafka's in-process
    /// mock cluster".
    pub bootstrap_servers: Vec<String>,
    /// In-memory Kafka (when no servers are given) and in-memory storage.
    pub mock: bool,
    /// Consumer group id. Always present: it is also the default source system, which producers
    /// stamp on every message for loop prevention, so a client without one could not send safely.
    pub group_id: String,
    /// Value of the `source-system` header on produced messages; defaults to `group_id`.
    pub source_system: String,
    /// Public name for requests and published state.
    pub subsystem: Option<String>,
    /// Give up a send after this long (> 0).
    pub send_timeout: Duration,
    /// librdkafka statistics interval (`PROSODY_STATISTICS_INTERVAL`); zero disables.
    pub statistics_interval: Duration,
}

/// Subscription, concurrency limits and consumer timing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Topics to subscribe to; an item starting with `^` is a regex (checked to compile). Empty
    /// means the client only sends, requests and reads published state; `subscribe` then fails.
    pub subscribed_topics: Vec<String>,
    /// Event-type prefixes to handle; empty means every event.
    pub allowed_events: Vec<String>,
    /// Handlers running at once across all partitions.
    pub max_concurrency: NonZeroUsize,
    /// Messages queued or running before partitions pause; at least `max_concurrency`.
    pub max_uncommitted: NonZeroUsize,
    /// A handler running longer is cancelled (> 0); defaults to 80% of `stall_threshold`.
    pub timeout: Duration,
    /// Offsets are committed this often (> 0).
    pub commit_interval: Duration,
    /// Kafka is polled this often (> 0); also the longest a broker holds a fetch for new
    /// records (`fetch.wait.max.ms`, at most 500 ms).
    pub poll_interval: Duration,
    /// Budget for in-flight work at shutdown and revocation; zero cancels at once.
    pub shutdown_timeout: Duration,
    /// A partition with work and no progress for this long makes `/livez` fail (> 0).
    pub stall_threshold: Duration,
}

/// Processing mode, failure topic and retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailureConfig {
    /// How failed handlers are treated.
    pub mode: Mode,
    /// Dead-letter topic; always `Some` in [`Mode::LowLatency`].
    pub failure_topic: Option<String>,
    /// In-process retry with exponential backoff.
    pub retry: RetryConfig,
}

/// In-process retry with exponential backoff and jitter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Retries after the first attempt (0 = no retry).
    pub max_retries: u32,
    /// First delay (> 0).
    pub base: Duration,
    /// Cap on the delay (>= `base`).
    pub max_delay: Duration,
}

/// Message deduplication.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupConfig {
    /// Entries of the process-wide cache.
    pub cache_size: NonZeroUsize,
    /// Part of the dedup identity; changing it forgets every earlier record.
    pub version: String,
    /// Lifetime of durable dedup records: whole seconds, from 1 s to 20 years (Cassandra's TTL
    /// limit).
    pub ttl: Duration,
}

/// Deferral of transiently failing work (pipeline mode).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeferConfig {
    /// Whether new failures are deferred (work deferred earlier is retried either way).
    pub enabled: bool,
    /// First deferred-retry delay (> 0).
    pub base: Duration,
    /// Cap on the deferred-retry delay (>= `base`).
    pub max_delay: Duration,
    /// Failure rate in (0, 1] above which deferral switches off.
    pub failure_threshold: f64,
    /// Window of the failure rate (> 0).
    pub failure_window: Duration,
    /// Entries of the deferred-store cache.
    pub store_cache_size: NonZeroUsize,
    /// Reloading deferred messages from Kafka.
    pub loader: LoaderConfig,
}

/// Reloading deferred messages from Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoaderConfig {
    /// Messages kept in the loader's cache.
    pub cache_size: NonZeroUsize,
    /// Give up a seek after this long (> 0).
    pub seek_timeout: Duration,
    /// Read through at most this many offsets before seeking instead; 0 always seeks.
    pub discard_threshold: u64,
}

/// Hot-key protection (pipeline mode).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MonopolizationConfig {
    /// Whether hot keys are rejected.
    pub enabled: bool,
    /// Share of the window in (0, 1] one key may use.
    pub threshold: f64,
    /// Rolling window (> 0).
    pub window: Duration,
    /// Keys tracked.
    pub cache_size: NonZeroUsize,
}

/// Fair scheduling between keys.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SchedulerConfig {
    /// Share of run time for retries, in (0, 1).
    pub failure_weight: f64,
    /// Wait at which a task's boost peaks (> 0).
    pub max_wait: Duration,
    /// Scale of the waiting boost (finite, >= 0).
    pub wait_weight: f64,
    /// Keys tracked.
    pub cache_size: NonZeroUsize,
}

/// Durable timers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimerConfig {
    /// Width of a storage slab (>= 1 s, the timer precision).
    pub slab_size: Duration,
}

/// Tracing, logging and lifecycle events.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TelemetryConfig {
    /// Whether lifecycle events are produced: `telemetryEnabled` and not mock mode.
    pub enabled: bool,
    /// Topic of lifecycle events.
    pub topic: String,
    /// Relation of message spans to the producer's span.
    pub message_spans: SpanRelation,
    /// Relation of timer spans to the scheduling span.
    pub timer_spans: SpanRelation,
    /// `tracing` filter directives (`PROSODY_LOG`), checked to parse.
    pub log_filter: String,
}

/// Health-probe server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeConfig {
    /// Port of `/readyz` and `/livez`; `None` disables the server, 0 picks a free port.
    pub port: Option<u16>,
}

/// The Cassandra cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CassandraConfig {
    /// Contact points (`host:port`), at least one.
    pub nodes: Vec<String>,
    /// Keyspace: 1 to 48 letters, digits or underscores.
    pub keyspace: String,
    /// User name; `Some` exactly when `password` is.
    pub user: Option<String>,
    /// Password; `Some` exactly when `user` is.
    pub password: Option<Secret>,
    /// Preferred datacenter.
    pub datacenter: Option<String>,
    /// Preferred rack; only with a datacenter.
    pub rack: Option<String>,
    /// Data older than this is deleted: whole seconds, from 1 s to 20 years.
    pub retention: Duration,
}

/// Storage backend selection and keyed-state caches.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StorageConfig {
    /// The selected backend.
    pub backend: StorageBackend,
    /// Directory of the `RocksDB` store or state cache; `None` means a per-client temporary
    /// directory removed on shutdown. Always `Some` for [`StorageBackend::RocksDb`].
    pub cache_dir: Option<PathBuf>,
    /// Bytes of the owned keyed-state cache; `None` leaves the engine's default.
    pub owned_cache_size_bytes: Option<NonZeroU64>,
    /// Bytes of the published-state read cache.
    pub read_cache_size_bytes: NonZeroU64,
    /// Default TTL of published-state reads; `None` disables the cache.
    pub read_cache_ttl: Option<Duration>,
    /// Delay before provisional writes are swept: whole seconds, at least 1 s.
    pub recovery_delay: Duration,
    /// Placeholder for keyed-state collection definitions, carried as raw JSON objects until
    /// typed definitions land; they are not validated here beyond being an array.
    pub collections: Vec<serde_json::Value>,
}
