//! Client configuration: options, environment fallback, defaults and validation.
//!
//! A client is configured in two steps. [`ClientOptions`] holds what the caller said, every field
//! optional; it is a plain struct for Rust callers and deserializes from the JSON object the
//! Node.js binding receives. [`Config::from_options`] then resolves every setting (the option if
//! given, else its `PROSODY_*` environment variable, else the default of FEATURES.md section 9),
//! checks it and groups the result into one small section per concern. Construction fails on the
//! first bad value with a [`ConfigError`] that names the option (and the variable, when the value
//! came from the environment) and says what is accepted:
//!
//! ```text
//! maxConcurrency (PROSODY_MAX_CONCURRENCY): must be an integer >= 1, got "0"
//! ```
//!
//! ```
//! use prosody::config::{ClientOptions, Config, MapEnv, Mode};
//!
//! let options = ClientOptions {
//!     bootstrap_servers: Some(vec!["localhost:9092".to_owned()]),
//!     group_id: Some("orders".to_owned()),
//!     subscribed_topics: Some(vec!["orders".to_owned()]),
//!     cassandra_nodes: Some(vec!["localhost:9042".to_owned()]),
//!     ..ClientOptions::default()
//! };
//! let env = MapEnv::new().with("PROSODY_MAX_CONCURRENCY", "8");
//! let config = Config::from_options_and_env(options, &env)?;
//! assert_eq!(config.consumer.max_concurrency.get(), 8);
//! assert_eq!(config.kafka.source_system, "orders");
//! assert_eq!(config.failure.mode, Mode::Pipeline);
//! # Ok::<(), prosody::config::ConfigError>(())
//! ```
//!
//! # Value formats
//!
//! * Durations: in options, `...Ms` fields take an integer number of milliseconds or a duration
//!   string (`"30s"`, `"5m"`, `"1h 30m"`, parsed by `humantime`); `...S`/`...Seconds` fields
//!   take an integer number of seconds or a duration string. In the environment, durations are
//!   duration strings, or bare integers in the same unit as the option.
//! * Lists (`bootstrapServers`, `subscribedTopics`, `allowedEvents`, `cassandraNodes`): an array
//!   or a comma-separated string; items are trimmed and empty items dropped.
//! * Booleans in the environment: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`.
//! * A variable set to blanks counts as unset.
//! * `probePort`: a port (0 picks a free one), or `null`/`"none"` to disable.
//! * `stateReadCache`: `{ "ttlMs": ... }`, a duration, `true` (5 s), or `false`/`null`/`"none"`.
//!
//! # Rules beyond single values
//!
//! * `bootstrapServers` is required unless `mock` is true; mock means librdkafka's in-process
//!   mock cluster, whatever the servers say.
//! * `groupId` is always required, even for a client that never subscribes: it is the default
//!   `sourceSystem` stamped on every produced message. `sourceSystem` defaults to it.
//! * `subscribedTopics` may be empty (a client that only sends, requests or reads published
//!   state); plain names must be legal Kafka topic names and `^` patterns must compile.
//! * `maxUncommitted` must be at least `maxConcurrency`: running handlers count as uncommitted,
//!   so a smaller value would silently cap concurrency.
//! * `maxRetryDelayMs >= retryBaseMs` and `deferMaxDelayMs >= deferBaseMs`.
//! * `timeoutMs` defaults to 80% of `stallThresholdMs`.
//! * Low-latency mode requires `failureTopic`.
//! * `cassandraUser` and `cassandraPassword` go together; `cassandraRack` needs
//!   `cassandraDatacenter`. Cassandra settings are checked even when no nodes are configured.
//! * Telemetry events are never produced in mock mode.
//! * `stateCacheSizeBytes` (the 0.5.1 name) and `stateOwnedCacheSize` are one setting; setting
//!   both is an error. `deferCacheSize`, `deferSeekTimeoutMs` and `deferDiscardThreshold` are
//!   accepted as the 0.5.1 names of the `loader*` options.
//! * Storage backend selection is described in the `storage` module: an explicit
//!   `storageBackend` must be complete (`cassandra` needs nodes, `rocksdb` needs
//!   `stateCacheDir`); `mock` implies memory; configured Cassandra nodes select Cassandra;
//!   otherwise construction fails naming the options that would fix it.
//! * `stateCollections` is a placeholder: definitions are carried as raw JSON until typed
//!   collection definitions land.

mod build;
mod checks;
mod env;
mod error;
mod fields;
mod kinds;
mod options;
mod resolver;
mod sections;
mod storage;
mod value;

#[cfg(test)]
mod tests;

pub use env::{EnvSource, MapEnv, ProcessEnv};
pub use error::{ConfigError, FieldRef};
pub use kinds::{Mode, SpanRelation, StorageBackend};
pub use options::ClientOptions;
pub use sections::{
    CassandraConfig, Config, ConsumerConfig, DedupConfig, DeferConfig, FailureConfig, KafkaConfig,
    LoaderConfig, MonopolizationConfig, ProbeConfig, RetryConfig, SchedulerConfig, StorageConfig,
    TelemetryConfig, TimerConfig,
};
pub use value::{ProbePort, ReadCache, Secret};
