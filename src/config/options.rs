//! What the caller says: every option unset unless given.
//!
//! [`ClientOptions`] is the raw input. It deserializes from the JSON object the Node.js binding
//! receives (camelCase names, unknown names rejected) and is equally a plain Rust struct to fill
//! with `..Default::default()`. Nothing here is validated beyond its JSON type; ranges, defaults
//! and the environment fallback belong to [`Config::from_options`](super::Config::from_options).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;
use super::kinds::{Mode, SpanRelation, StorageBackend};
use super::value::{self, ProbePort, ReadCache, Secret};

/// Client options as given by the caller. `None` means "not given": the environment variable
/// applies, then the default. Option names and defaults are listed in FEATURES.md section 9.
///
/// Durations are [`Duration`]s. In JSON, `...Ms` options take an integer number of milliseconds
/// or a duration string (`"30s"`, `"5m"`); `...S`/`...Seconds` options take an integer number of
/// seconds or a duration string. List options take an array or a comma-separated string.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientOptions {
    // Kafka and identity.
    /// Kafka bootstrap servers (`host:port`); required unless `mock`.
    #[serde(default, deserialize_with = "value::opt_list")]
    pub bootstrap_servers: Option<Vec<String>>,
    /// Consumer group id; also the default `sourceSystem`.
    pub group_id: Option<String>,
    /// Topics to consume; an item starting with `^` is a regex subscription.
    #[serde(default, deserialize_with = "value::opt_list")]
    pub subscribed_topics: Option<Vec<String>>,
    /// Event-type prefixes to handle; empty means all.
    #[serde(default, deserialize_with = "value::opt_list")]
    pub allowed_events: Option<Vec<String>>,
    /// `source-system` header stamped on produced messages.
    pub source_system: Option<String>,
    /// Public name of this service for requests and published state.
    pub subsystem: Option<String>,
    /// In-memory Kafka (unless bootstrap servers are given) and in-memory storage.
    pub mock: Option<bool>,
    /// Give up a send after this long.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub send_timeout_ms: Option<Duration>,

    // Consumer.
    /// Handlers running at once, across all partitions.
    pub max_concurrency: Option<usize>,
    /// Messages queued or running before partitions pause.
    pub max_uncommitted: Option<usize>,
    /// Cancel a handler after this long.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub timeout_ms: Option<Duration>,
    /// Commit offsets this often.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub commit_interval_ms: Option<Duration>,
    /// Poll Kafka this often; also the longest a broker holds a fetch for new records.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub poll_interval_ms: Option<Duration>,
    /// Budget for in-flight work at shutdown and revocation.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub shutdown_timeout_ms: Option<Duration>,
    /// A partition without progress for this long makes `/livez` fail.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub stall_threshold_ms: Option<Duration>,
    /// Health-probe HTTP port; JSON `null` or `"none"` disables the server.
    #[serde(default, deserialize_with = "value::opt_probe_port")]
    pub probe_port: Option<ProbePort>,

    // Failure handling.
    /// Pipeline (default), low-latency or best-effort.
    pub mode: Option<Mode>,
    /// Dead-letter topic; required in low-latency mode.
    pub failure_topic: Option<String>,
    /// Retries after the first attempt.
    pub max_retries: Option<u32>,
    /// First retry delay.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub retry_base_ms: Option<Duration>,
    /// Longest retry delay.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub max_retry_delay_ms: Option<Duration>,

    // Deduplication.
    /// Process-wide dedup cache entries; must be at least 1. The cache sits in front of a
    /// Cassandra or `RocksDB` store; the memory store is asked directly.
    pub idempotence_cache_size: Option<usize>,
    /// Dedup version: changing it makes every earlier record new again.
    pub idempotence_version: Option<String>,
    /// How long durable dedup records live.
    #[serde(default, deserialize_with = "value::opt_seconds")]
    pub idempotence_ttl_s: Option<Duration>,

    // Timers and tracing.
    /// Timer storage slab width.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub slab_size_ms: Option<Duration>,
    /// How message spans relate to the producer's span.
    pub message_spans: Option<SpanRelation>,
    /// How timer spans relate to the scheduling span.
    pub timer_spans: Option<SpanRelation>,

    // Defer.
    /// Defer transiently failing messages (pipeline mode). Off, new failures block their key;
    /// work deferred earlier is still retried.
    pub defer_enabled: Option<bool>,
    /// First deferred-retry delay.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub defer_base_ms: Option<Duration>,
    /// Longest deferred-retry delay.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub defer_max_delay_ms: Option<Duration>,
    /// Failure rate above which deferral switches off, in (0, 1].
    pub defer_failure_threshold: Option<f64>,
    /// Window the failure rate is measured over.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub defer_failure_window_ms: Option<Duration>,
    /// Deferred keys per partition whose deferred work is cached (keys with nothing deferred
    /// need no cache: the partition's deferred keys are read once per assignment).
    pub defer_store_cache_size: Option<usize>,
    /// Message-loader cache entries (0.5.1 name: `deferCacheSize`).
    #[serde(alias = "deferCacheSize")]
    pub loader_cache_size: Option<usize>,
    /// Message-loader seek timeout (0.5.1 name: `deferSeekTimeoutMs`).
    #[serde(
        default,
        alias = "deferSeekTimeoutMs",
        deserialize_with = "value::opt_millis"
    )]
    pub loader_seek_timeout_ms: Option<Duration>,
    /// Offsets the loader reads through before seeking (0.5.1 name: `deferDiscardThreshold`).
    #[serde(alias = "deferDiscardThreshold")]
    pub loader_discard_threshold: Option<u64>,

    // Monopolization.
    /// Reject keys that hog handler time (pipeline mode).
    pub monopolization_enabled: Option<bool>,
    /// Share of the window one key may use, in (0, 1].
    pub monopolization_threshold: Option<f64>,
    /// Rolling window for handler time.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub monopolization_window_ms: Option<Duration>,
    /// Keys tracked.
    pub monopolization_cache_size: Option<usize>,

    // Fair scheduler.
    /// Share of run time for retries, in (0, 1).
    pub scheduler_failure_weight: Option<f64>,
    /// Wait after which a task gets the maximum boost.
    #[serde(default, deserialize_with = "value::opt_millis")]
    pub scheduler_max_wait_ms: Option<Duration>,
    /// Scale of the waiting boost, >= 0.
    pub scheduler_wait_weight: Option<f64>,
    /// Keys tracked.
    pub scheduler_cache_size: Option<usize>,

    // Telemetry.
    /// Produce lifecycle events to `telemetryTopic` (never in mock mode).
    pub telemetry_enabled: Option<bool>,
    /// Topic for lifecycle events.
    pub telemetry_topic: Option<String>,

    // Cassandra.
    /// Cassandra contact points (`host:port`); configuring them selects the Cassandra backend.
    #[serde(default, deserialize_with = "value::opt_list")]
    pub cassandra_nodes: Option<Vec<String>>,
    /// Keyspace.
    pub cassandra_keyspace: Option<String>,
    /// User name; given together with the password.
    pub cassandra_user: Option<String>,
    /// Password; never printed.
    pub cassandra_password: Option<Secret>,
    /// Preferred datacenter.
    pub cassandra_datacenter: Option<String>,
    /// Preferred rack; needs a datacenter.
    pub cassandra_rack: Option<String>,
    /// Data older than this is deleted.
    #[serde(default, deserialize_with = "value::opt_seconds")]
    pub cassandra_retention_seconds: Option<Duration>,

    // Storage and keyed state.
    /// Storage backend; see [`Config`](super::Config) for the selection rules.
    pub storage_backend: Option<StorageBackend>,
    /// Directory of the `RocksDB` backend or state cache.
    pub state_cache_dir: Option<PathBuf>,
    /// Bytes of the cache of owned keyed state.
    pub state_owned_cache_size: Option<u64>,
    /// 0.5.1 name of `stateOwnedCacheSize`; setting both is an error.
    pub state_cache_size_bytes: Option<u64>,
    /// Bytes of the published-state read cache.
    pub state_read_cache_size: Option<u64>,
    /// Default published-state read cache.
    #[serde(default, deserialize_with = "value::opt_read_cache")]
    pub state_read_cache: Option<ReadCache>,
    /// Delay before provisional state writes are swept.
    #[serde(default, deserialize_with = "value::opt_seconds")]
    pub state_recovery_delay_seconds: Option<Duration>,
    /// Placeholder: collection definitions are carried as raw JSON until typed definitions
    /// land; only their being an array is checked here.
    pub state_collections: Option<serde_json::Value>,
}

impl ClientOptions {
    /// Reads options from a JSON object text.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Options`] naming the offending option when the text is not JSON, an
    /// option is unknown, or an option has the wrong JSON type.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let options = serde_path_to_error::deserialize(&mut deserializer).map_err(options_error)?;
        deserializer.end().map_err(|error| ConfigError::Options {
            path: ".".to_owned(),
            message: error.to_string(),
        })?;
        Ok(options)
    }

    /// Reads options from a JSON value, such as the object the Node.js binding receives.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Options`] naming the offending option when an option is unknown or has
    /// the wrong JSON type.
    pub fn from_json_value(value: serde_json::Value) -> Result<Self, ConfigError> {
        serde_path_to_error::deserialize(value).map_err(options_error)
    }
}

fn options_error(error: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let path = error.path().to_string();
    let inner = error.into_inner();
    // serde_json appends " at line 1 column 23" for text input; the option path is the useful
    // locator, so drop the position.
    let text = inner.to_string();
    let message = if inner.line() == 0 {
        text
    } else {
        match text.rfind(" at line ") {
            Some(cut) => text[..cut].to_owned(),
            None => text,
        }
    };
    ConfigError::Options { path, message }
}
