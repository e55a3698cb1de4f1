//! The catalogue of settings: each one's option name and environment variable.
//!
//! One place spells every name, so error messages, the resolver and the tests cannot disagree
//! about what `maxConcurrency` is called in the environment.

use super::error::FieldRef;

/// A setting's names. Most have both; `mode` and `stateCollections` have no variable,
/// `PROSODY_LOG` and `PROSODY_STATISTICS_INTERVAL` have no option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) option: Option<&'static str>,
    pub(crate) env: Option<&'static str>,
}

impl Field {
    const fn both(option: &'static str, env: &'static str) -> Self {
        Self {
            option: Some(option),
            env: Some(env),
        }
    }

    const fn option_only(option: &'static str) -> Self {
        Self {
            option: Some(option),
            env: None,
        }
    }

    const fn env_only(env: &'static str) -> Self {
        Self {
            option: None,
            env: Some(env),
        }
    }

    /// Names the setting with its variable, for errors about values given nowhere.
    pub(crate) fn full(self) -> FieldRef {
        FieldRef {
            option: self.option,
            env: self.env,
        }
    }

    /// Names the setting by its option alone (or its variable, when it has no option), for
    /// errors about a value that did not come from the environment.
    pub(crate) fn option_ref(self) -> FieldRef {
        FieldRef {
            option: self.option,
            env: if self.option.is_some() {
                None
            } else {
                self.env
            },
        }
    }
}

macro_rules! fields {
    ($($(#[$doc:meta])* $name:ident = $kind:ident($($arg:literal),+);)+) => {
        $($(#[$doc])* pub(crate) const $name: Field = Field::$kind($($arg),+);)+

        /// Every setting, for tests that must cover them all.
        #[cfg(test)]
        pub(crate) const ALL: &[Field] = &[$($name),+];
    };
}

fields! {
    BOOTSTRAP_SERVERS = both("bootstrapServers", "PROSODY_BOOTSTRAP_SERVERS");
    GROUP_ID = both("groupId", "PROSODY_GROUP_ID");
    SUBSCRIBED_TOPICS = both("subscribedTopics", "PROSODY_SUBSCRIBED_TOPICS");
    ALLOWED_EVENTS = both("allowedEvents", "PROSODY_ALLOWED_EVENTS");
    SOURCE_SYSTEM = both("sourceSystem", "PROSODY_SOURCE_SYSTEM");
    SUBSYSTEM = both("subsystem", "PROSODY_SUBSYSTEM");
    MOCK = both("mock", "PROSODY_MOCK");
    SEND_TIMEOUT = both("sendTimeoutMs", "PROSODY_SEND_TIMEOUT");
    STATISTICS_INTERVAL = env_only("PROSODY_STATISTICS_INTERVAL");

    MAX_CONCURRENCY = both("maxConcurrency", "PROSODY_MAX_CONCURRENCY");
    MAX_UNCOMMITTED = both("maxUncommitted", "PROSODY_MAX_UNCOMMITTED");
    TIMEOUT = both("timeoutMs", "PROSODY_TIMEOUT");
    COMMIT_INTERVAL = both("commitIntervalMs", "PROSODY_COMMIT_INTERVAL");
    POLL_INTERVAL = both("pollIntervalMs", "PROSODY_POLL_INTERVAL");
    SHUTDOWN_TIMEOUT = both("shutdownTimeoutMs", "PROSODY_SHUTDOWN_TIMEOUT");
    STALL_THRESHOLD = both("stallThresholdMs", "PROSODY_STALL_THRESHOLD");
    PROBE_PORT = both("probePort", "PROSODY_PROBE_PORT");

    MODE = option_only("mode");
    FAILURE_TOPIC = both("failureTopic", "PROSODY_FAILURE_TOPIC");
    MAX_RETRIES = both("maxRetries", "PROSODY_MAX_RETRIES");
    RETRY_BASE = both("retryBaseMs", "PROSODY_RETRY_BASE");
    MAX_RETRY_DELAY = both("maxRetryDelayMs", "PROSODY_RETRY_MAX_DELAY");

    IDEMPOTENCE_CACHE_SIZE = both("idempotenceCacheSize", "PROSODY_IDEMPOTENCE_CACHE_SIZE");
    IDEMPOTENCE_VERSION = both("idempotenceVersion", "PROSODY_IDEMPOTENCE_VERSION");
    IDEMPOTENCE_TTL = both("idempotenceTtlS", "PROSODY_IDEMPOTENCE_TTL");

    SLAB_SIZE = both("slabSizeMs", "PROSODY_SLAB_SIZE");
    MESSAGE_SPANS = both("messageSpans", "PROSODY_MESSAGE_SPANS");
    TIMER_SPANS = both("timerSpans", "PROSODY_TIMER_SPANS");
    LOG = env_only("PROSODY_LOG");

    DEFER_ENABLED = both("deferEnabled", "PROSODY_DEFER_ENABLED");
    DEFER_BASE = both("deferBaseMs", "PROSODY_DEFER_BASE");
    DEFER_MAX_DELAY = both("deferMaxDelayMs", "PROSODY_DEFER_MAX_DELAY");
    DEFER_FAILURE_THRESHOLD = both("deferFailureThreshold", "PROSODY_DEFER_FAILURE_THRESHOLD");
    DEFER_FAILURE_WINDOW = both("deferFailureWindowMs", "PROSODY_DEFER_FAILURE_WINDOW");
    DEFER_STORE_CACHE_SIZE = both("deferStoreCacheSize", "PROSODY_DEFER_STORE_CACHE_SIZE");
    LOADER_CACHE_SIZE = both("loaderCacheSize", "PROSODY_LOADER_CACHE_SIZE");
    LOADER_SEEK_TIMEOUT = both("loaderSeekTimeoutMs", "PROSODY_LOADER_SEEK_TIMEOUT");
    LOADER_DISCARD_THRESHOLD = both("loaderDiscardThreshold", "PROSODY_LOADER_DISCARD_THRESHOLD");

    MONOPOLIZATION_ENABLED = both("monopolizationEnabled", "PROSODY_MONOPOLIZATION_ENABLED");
    MONOPOLIZATION_THRESHOLD = both("monopolizationThreshold", "PROSODY_MONOPOLIZATION_THRESHOLD");
    MONOPOLIZATION_WINDOW = both("monopolizationWindowMs", "PROSODY_MONOPOLIZATION_WINDOW");
    MONOPOLIZATION_CACHE_SIZE =
        both("monopolizationCacheSize", "PROSODY_MONOPOLIZATION_CACHE_SIZE");

    SCHEDULER_FAILURE_WEIGHT = both("schedulerFailureWeight", "PROSODY_SCHEDULER_FAILURE_WEIGHT");
    SCHEDULER_MAX_WAIT = both("schedulerMaxWaitMs", "PROSODY_SCHEDULER_MAX_WAIT");
    SCHEDULER_WAIT_WEIGHT = both("schedulerWaitWeight", "PROSODY_SCHEDULER_WAIT_WEIGHT");
    SCHEDULER_CACHE_SIZE = both("schedulerCacheSize", "PROSODY_SCHEDULER_CACHE_SIZE");

    TELEMETRY_ENABLED = both("telemetryEnabled", "PROSODY_TELEMETRY_ENABLED");
    TELEMETRY_TOPIC = both("telemetryTopic", "PROSODY_TELEMETRY_TOPIC");

    CASSANDRA_NODES = both("cassandraNodes", "PROSODY_CASSANDRA_NODES");
    CASSANDRA_KEYSPACE = both("cassandraKeyspace", "PROSODY_CASSANDRA_KEYSPACE");
    CASSANDRA_USER = both("cassandraUser", "PROSODY_CASSANDRA_USER");
    CASSANDRA_PASSWORD = both("cassandraPassword", "PROSODY_CASSANDRA_PASSWORD");
    CASSANDRA_DATACENTER = both("cassandraDatacenter", "PROSODY_CASSANDRA_DATACENTER");
    CASSANDRA_RACK = both("cassandraRack", "PROSODY_CASSANDRA_RACK");
    CASSANDRA_RETENTION = both("cassandraRetentionSeconds", "PROSODY_CASSANDRA_RETENTION");

    STORAGE_BACKEND = both("storageBackend", "PROSODY_STORAGE_BACKEND");
    STATE_CACHE_DIR = both("stateCacheDir", "PROSODY_STATE_CACHE_DIR");
    STATE_OWNED_CACHE_SIZE = both("stateOwnedCacheSize", "PROSODY_STATE_OWNED_CACHE_SIZE");
    STATE_CACHE_SIZE_BYTES = both("stateCacheSizeBytes", "PROSODY_STATE_CACHE_SIZE_BYTES");
    STATE_READ_CACHE_SIZE = both("stateReadCacheSize", "PROSODY_STATE_READ_CACHE_SIZE");
    STATE_READ_CACHE = both("stateReadCache", "PROSODY_STATE_READ_CACHE_TTL");
    STATE_RECOVERY_DELAY = both("stateRecoveryDelaySeconds", "PROSODY_STATE_RECOVERY_DELAY");
    STATE_COLLECTIONS = option_only("stateCollections");
}
