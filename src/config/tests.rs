//! Table-driven tests over every option: a valid value is accepted and resolved to the right
//! typed value, an invalid one is rejected naming the option; the environment variable is the
//! fallback, also valid and invalid; an option beats its variable, a variable beats the default.

use std::num::NonZeroU64;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::fields;
use super::*;

/// The smallest options that construct: everything else comes from defaults.
fn base() -> Value {
    json!({
        "bootstrapServers": "localhost:9092",
        "groupId": "g",
        "storageBackend": "memory",
    })
}

/// `base()` plus `extra` (later keys win).
fn merged(extra: &Value) -> Value {
    let mut options = base();
    if let (Some(target), Some(source)) = (options.as_object_mut(), extra.as_object()) {
        for (key, value) in source {
            target.insert(key.clone(), value.clone());
        }
    }
    options
}

fn build(options: Value, env: &MapEnv) -> Result<Config, ConfigError> {
    Config::from_options_and_env(ClientOptions::from_json_value(options)?, env)
}

fn defaults() -> Config {
    build(base(), &MapEnv::new()).unwrap()
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

/// One option's row.
struct Case {
    option: &'static str,
    env: Option<&'static str>,
    /// Other options this one needs to be meaningful (`mode: low-latency` needs a failure topic).
    needs: Value,
    /// An accepted option value.
    valid: Value,
    /// The same setting as `valid`, written as environment text.
    env_valid: Option<&'static str>,
    /// Whether the resolved config holds the valid value; must be false for the defaults.
    check: fn(&Config) -> bool,
    /// A rejected option value.
    invalid: Value,
    /// Rejected environment text, where text can be wrong at all.
    env_invalid: Option<&'static str>,
}

#[allow(clippy::too_many_lines)] // one row per option; splitting the table would hide gaps
fn cases() -> Vec<Case> {
    let none = || json!({});
    let nodes = || json!({ "cassandraNodes": "c1:9042" });
    vec![
        Case {
            option: "bootstrapServers",
            env: Some("PROSODY_BOOTSTRAP_SERVERS"),
            needs: none(),
            valid: json!(["a:9092", "b:9093"]),
            env_valid: Some("a:9092, b:9093"),
            check: |c| c.kafka.bootstrap_servers == ["a:9092", "b:9093"],
            invalid: json!("host:notaport"),
            env_invalid: Some("host:0"),
        },
        Case {
            option: "groupId",
            env: Some("PROSODY_GROUP_ID"),
            needs: none(),
            valid: json!("orders"),
            env_valid: Some("orders"),
            check: |c| c.kafka.group_id == "orders" && c.kafka.source_system == "orders",
            invalid: json!(""),
            env_invalid: None,
        },
        Case {
            option: "subscribedTopics",
            env: Some("PROSODY_SUBSCRIBED_TOPICS"),
            needs: none(),
            valid: json!("a, ^b\\..*"),
            env_valid: Some("a,^b\\..*"),
            check: |c| c.consumer.subscribed_topics == ["a", "^b\\..*"],
            invalid: json!(["ok", "^bad("]),
            env_invalid: Some("bad topic"),
        },
        Case {
            option: "allowedEvents",
            env: Some("PROSODY_ALLOWED_EVENTS"),
            needs: none(),
            valid: json!(["user.", "account."]),
            env_valid: Some("user.,account."),
            check: |c| c.consumer.allowed_events == ["user.", "account."],
            invalid: json!(42),
            env_invalid: None,
        },
        Case {
            option: "sourceSystem",
            env: Some("PROSODY_SOURCE_SYSTEM"),
            needs: none(),
            valid: json!("src"),
            env_valid: Some("src"),
            check: |c| c.kafka.source_system == "src",
            invalid: json!(""),
            env_invalid: None,
        },
        Case {
            option: "subsystem",
            env: Some("PROSODY_SUBSYSTEM"),
            needs: none(),
            valid: json!("inventory"),
            env_valid: Some("inventory"),
            check: |c| c.kafka.subsystem.as_deref() == Some("inventory"),
            invalid: json!(""),
            env_invalid: None,
        },
        Case {
            option: "mock",
            env: Some("PROSODY_MOCK"),
            needs: none(),
            valid: json!(true),
            env_valid: Some("true"),
            check: |c| c.kafka.mock && !c.telemetry.enabled,
            invalid: json!("yes"),
            env_invalid: Some("maybe"),
        },
        Case {
            option: "sendTimeoutMs",
            env: Some("PROSODY_SEND_TIMEOUT"),
            needs: none(),
            valid: json!(1500),
            env_valid: Some("1500"),
            check: |c| c.kafka.send_timeout == ms(1500),
            invalid: json!(0),
            env_invalid: Some("soon"),
        },
        Case {
            option: "maxConcurrency",
            env: Some("PROSODY_MAX_CONCURRENCY"),
            needs: none(),
            valid: json!(7),
            env_valid: Some("7"),
            check: |c| c.consumer.max_concurrency.get() == 7,
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "maxUncommitted",
            env: Some("PROSODY_MAX_UNCOMMITTED"),
            needs: none(),
            valid: json!(100),
            env_valid: Some("100"),
            check: |c| c.consumer.max_uncommitted.get() == 100,
            invalid: json!(0),
            env_invalid: Some("-1"),
        },
        Case {
            option: "timeoutMs",
            env: Some("PROSODY_TIMEOUT"),
            needs: none(),
            valid: json!("45s"),
            env_valid: Some("45s"),
            check: |c| c.consumer.timeout == secs(45),
            invalid: json!("soon"),
            env_invalid: Some("0"),
        },
        Case {
            option: "commitIntervalMs",
            env: Some("PROSODY_COMMIT_INTERVAL"),
            needs: none(),
            valid: json!(250),
            env_valid: Some("250"),
            check: |c| c.consumer.commit_interval == ms(250),
            invalid: json!(0),
            env_invalid: Some("x"),
        },
        Case {
            option: "pollIntervalMs",
            env: Some("PROSODY_POLL_INTERVAL"),
            needs: none(),
            valid: json!(50),
            env_valid: Some("50ms"),
            check: |c| c.consumer.poll_interval == ms(50),
            invalid: json!(-1),
            env_invalid: Some("fast"),
        },
        Case {
            option: "shutdownTimeoutMs",
            env: Some("PROSODY_SHUTDOWN_TIMEOUT"),
            needs: none(),
            valid: json!("1m"),
            env_valid: Some("60000"),
            check: |c| c.consumer.shutdown_timeout == secs(60),
            invalid: json!("later"),
            env_invalid: Some("1 fortnight"),
        },
        Case {
            option: "stallThresholdMs",
            env: Some("PROSODY_STALL_THRESHOLD"),
            needs: none(),
            valid: json!("10m"),
            env_valid: Some("10m"),
            // The timeout default follows the stall threshold.
            check: |c| c.consumer.stall_threshold == secs(600) && c.consumer.timeout == secs(480),
            invalid: json!(0),
            env_invalid: Some("0s"),
        },
        Case {
            option: "probePort",
            env: Some("PROSODY_PROBE_PORT"),
            needs: none(),
            valid: json!(null),
            env_valid: Some("none"),
            check: |c| c.probes.port.is_none(),
            invalid: json!(70000),
            env_invalid: Some("http"),
        },
        Case {
            option: "mode",
            env: None,
            needs: json!({ "failureTopic": "dlq" }),
            valid: json!("low-latency"),
            env_valid: None,
            check: |c| c.failure.mode == Mode::LowLatency,
            invalid: json!("fast"),
            env_invalid: None,
        },
        Case {
            option: "failureTopic",
            env: Some("PROSODY_FAILURE_TOPIC"),
            needs: none(),
            valid: json!("dead.letters"),
            env_valid: Some("dead.letters"),
            check: |c| c.failure.failure_topic.as_deref() == Some("dead.letters"),
            invalid: json!("bad topic!"),
            env_invalid: Some("a/b"),
        },
        Case {
            option: "maxRetries",
            env: Some("PROSODY_MAX_RETRIES"),
            needs: none(),
            valid: json!(0),
            env_valid: Some("0"),
            check: |c| c.failure.retry.max_retries == 0,
            invalid: json!(-1),
            env_invalid: Some("three"),
        },
        Case {
            option: "retryBaseMs",
            env: Some("PROSODY_RETRY_BASE"),
            needs: none(),
            valid: json!(100),
            env_valid: Some("100ms"),
            check: |c| c.failure.retry.base == ms(100),
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "maxRetryDelayMs",
            env: Some("PROSODY_RETRY_MAX_DELAY"),
            needs: none(),
            valid: json!("1m"),
            env_valid: Some("1m"),
            check: |c| c.failure.retry.max_delay == secs(60),
            // Below the 20 ms retry base.
            invalid: json!(10),
            env_invalid: Some("5"),
        },
        Case {
            option: "idempotenceCacheSize",
            env: Some("PROSODY_IDEMPOTENCE_CACHE_SIZE"),
            needs: none(),
            valid: json!(1),
            env_valid: Some("1"),
            check: |c| c.dedup.cache_size.get() == 1,
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "idempotenceVersion",
            env: Some("PROSODY_IDEMPOTENCE_VERSION"),
            needs: none(),
            valid: json!("2"),
            env_valid: Some("2"),
            check: |c| c.dedup.version == "2",
            invalid: json!(2),
            env_invalid: None,
        },
        Case {
            option: "idempotenceTtlS",
            env: Some("PROSODY_IDEMPOTENCE_TTL"),
            needs: none(),
            valid: json!(3600),
            env_valid: Some("3600"),
            check: |c| c.dedup.ttl == secs(3600),
            invalid: json!(0),
            env_invalid: Some("1500ms"),
        },
        Case {
            option: "slabSizeMs",
            env: Some("PROSODY_SLAB_SIZE"),
            needs: none(),
            valid: json!("30m"),
            env_valid: Some("1800000"),
            check: |c| c.timers.slab_size == secs(1800),
            invalid: json!(500),
            env_invalid: Some("500ms"),
        },
        Case {
            option: "messageSpans",
            env: Some("PROSODY_MESSAGE_SPANS"),
            needs: none(),
            valid: json!("follows_from"),
            env_valid: Some("follows_from"),
            check: |c| c.telemetry.message_spans == SpanRelation::FollowsFrom,
            invalid: json!("parent"),
            env_invalid: Some("parent"),
        },
        Case {
            option: "timerSpans",
            env: Some("PROSODY_TIMER_SPANS"),
            needs: none(),
            valid: json!("child"),
            env_valid: Some("child"),
            check: |c| c.telemetry.timer_spans == SpanRelation::Child,
            invalid: json!("sibling"),
            env_invalid: Some("sibling"),
        },
        Case {
            option: "deferEnabled",
            env: Some("PROSODY_DEFER_ENABLED"),
            needs: none(),
            valid: json!(false),
            env_valid: Some("false"),
            check: |c| !c.defer.enabled,
            invalid: json!("no"),
            env_invalid: Some("nope"),
        },
        Case {
            option: "deferBaseMs",
            env: Some("PROSODY_DEFER_BASE"),
            needs: none(),
            valid: json!(500),
            env_valid: Some("500"),
            check: |c| c.defer.base == ms(500),
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "deferMaxDelayMs",
            env: Some("PROSODY_DEFER_MAX_DELAY"),
            needs: none(),
            valid: json!("1h"),
            env_valid: Some("1h"),
            check: |c| c.defer.max_delay == secs(3600),
            // Below the 1 s defer base.
            invalid: json!(10),
            env_invalid: Some("10ms"),
        },
        Case {
            option: "deferFailureThreshold",
            env: Some("PROSODY_DEFER_FAILURE_THRESHOLD"),
            needs: none(),
            valid: json!(0.5),
            env_valid: Some("0.5"),
            check: |c| (c.defer.failure_threshold - 0.5).abs() < f64::EPSILON,
            invalid: json!(0),
            env_invalid: Some("1.5"),
        },
        Case {
            option: "deferFailureWindowMs",
            env: Some("PROSODY_DEFER_FAILURE_WINDOW"),
            needs: none(),
            valid: json!("1m"),
            env_valid: Some("1m"),
            check: |c| c.defer.failure_window == secs(60),
            invalid: json!(0),
            env_invalid: Some("x"),
        },
        Case {
            option: "deferStoreCacheSize",
            env: Some("PROSODY_DEFER_STORE_CACHE_SIZE"),
            needs: none(),
            valid: json!(16),
            env_valid: Some("16"),
            check: |c| c.defer.store_cache_size.get() == 16,
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "loaderCacheSize",
            env: Some("PROSODY_LOADER_CACHE_SIZE"),
            needs: none(),
            valid: json!(16),
            env_valid: Some("16"),
            check: |c| c.defer.loader.cache_size.get() == 16,
            invalid: json!(0),
            env_invalid: Some("lots"),
        },
        Case {
            option: "loaderSeekTimeoutMs",
            env: Some("PROSODY_LOADER_SEEK_TIMEOUT"),
            needs: none(),
            valid: json!("5s"),
            env_valid: Some("5s"),
            check: |c| c.defer.loader.seek_timeout == secs(5),
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "loaderDiscardThreshold",
            env: Some("PROSODY_LOADER_DISCARD_THRESHOLD"),
            needs: none(),
            valid: json!(0),
            env_valid: Some("0"),
            check: |c| c.defer.loader.discard_threshold == 0,
            invalid: json!(-5),
            env_invalid: Some("-5"),
        },
        Case {
            option: "monopolizationEnabled",
            env: Some("PROSODY_MONOPOLIZATION_ENABLED"),
            needs: none(),
            valid: json!(false),
            env_valid: Some("false"),
            check: |c| !c.monopolization.enabled,
            invalid: json!(1),
            env_invalid: Some("2"),
        },
        Case {
            option: "monopolizationThreshold",
            env: Some("PROSODY_MONOPOLIZATION_THRESHOLD"),
            needs: none(),
            valid: json!(0.25),
            env_valid: Some("0.25"),
            check: |c| (c.monopolization.threshold - 0.25).abs() < f64::EPSILON,
            invalid: json!(1.5),
            env_invalid: Some("0"),
        },
        Case {
            option: "monopolizationWindowMs",
            env: Some("PROSODY_MONOPOLIZATION_WINDOW"),
            needs: none(),
            valid: json!("1m"),
            env_valid: Some("1m"),
            check: |c| c.monopolization.window == secs(60),
            invalid: json!(0),
            env_invalid: Some("soon"),
        },
        Case {
            option: "monopolizationCacheSize",
            env: Some("PROSODY_MONOPOLIZATION_CACHE_SIZE"),
            needs: none(),
            valid: json!(10),
            env_valid: Some("10"),
            check: |c| c.monopolization.cache_size.get() == 10,
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "schedulerFailureWeight",
            env: Some("PROSODY_SCHEDULER_FAILURE_WEIGHT"),
            needs: none(),
            valid: json!(0.5),
            env_valid: Some("0.5"),
            check: |c| (c.scheduler.failure_weight - 0.5).abs() < f64::EPSILON,
            invalid: json!(1.0),
            env_invalid: Some("0"),
        },
        Case {
            option: "schedulerMaxWaitMs",
            env: Some("PROSODY_SCHEDULER_MAX_WAIT"),
            needs: none(),
            valid: json!("30s"),
            env_valid: Some("30s"),
            check: |c| c.scheduler.max_wait == secs(30),
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "schedulerWaitWeight",
            env: Some("PROSODY_SCHEDULER_WAIT_WEIGHT"),
            needs: none(),
            valid: json!(50.5),
            env_valid: Some("50.5"),
            check: |c| (c.scheduler.wait_weight - 50.5).abs() < f64::EPSILON,
            invalid: json!(-1),
            env_invalid: Some("NaN"),
        },
        Case {
            option: "schedulerCacheSize",
            env: Some("PROSODY_SCHEDULER_CACHE_SIZE"),
            needs: none(),
            valid: json!(10),
            env_valid: Some("10"),
            check: |c| c.scheduler.cache_size.get() == 10,
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "telemetryEnabled",
            env: Some("PROSODY_TELEMETRY_ENABLED"),
            needs: none(),
            valid: json!(false),
            env_valid: Some("false"),
            check: |c| !c.telemetry.enabled,
            invalid: json!("off"),
            env_invalid: Some("offf"),
        },
        Case {
            option: "telemetryTopic",
            env: Some("PROSODY_TELEMETRY_TOPIC"),
            needs: none(),
            valid: json!("events.v2"),
            env_valid: Some("events.v2"),
            check: |c| c.telemetry.topic == "events.v2",
            invalid: json!("bad topic"),
            env_invalid: Some("bad topic"),
        },
        Case {
            option: "cassandraNodes",
            env: Some("PROSODY_CASSANDRA_NODES"),
            needs: none(),
            valid: json!(["c1:9042", "c2"]),
            env_valid: Some("c1:9042,c2"),
            check: |c| {
                c.cassandra
                    .as_ref()
                    .is_some_and(|k| k.nodes == ["c1:9042", "c2"])
            },
            invalid: json!("c1:notaport"),
            env_invalid: Some("c1:0"),
        },
        Case {
            option: "cassandraKeyspace",
            env: Some("PROSODY_CASSANDRA_KEYSPACE"),
            needs: nodes(),
            valid: json!("events_ks"),
            env_valid: Some("events_ks"),
            check: |c| {
                c.cassandra
                    .as_ref()
                    .is_some_and(|k| k.keyspace == "events_ks")
            },
            invalid: json!("bad-ks"),
            env_invalid: Some("bad-ks"),
        },
        Case {
            option: "cassandraUser",
            env: Some("PROSODY_CASSANDRA_USER"),
            needs: json!({ "cassandraNodes": "c1", "cassandraPassword": "pw" }),
            valid: json!("alice"),
            env_valid: Some("alice"),
            check: |c| {
                c.cassandra
                    .as_ref()
                    .is_some_and(|k| k.user.as_deref() == Some("alice"))
            },
            invalid: json!(""),
            env_invalid: None,
        },
        Case {
            option: "cassandraPassword",
            env: Some("PROSODY_CASSANDRA_PASSWORD"),
            needs: json!({ "cassandraNodes": "c1", "cassandraUser": "alice" }),
            valid: json!("pw"),
            env_valid: Some("pw"),
            check: |c| {
                c.cassandra
                    .as_ref()
                    .and_then(|k| k.password.as_ref())
                    .is_some_and(|p| p.expose() == "pw")
            },
            invalid: json!(42),
            env_invalid: None,
        },
        Case {
            option: "cassandraDatacenter",
            env: Some("PROSODY_CASSANDRA_DATACENTER"),
            needs: nodes(),
            valid: json!("dc1"),
            env_valid: Some("dc1"),
            check: |c| {
                c.cassandra
                    .as_ref()
                    .is_some_and(|k| k.datacenter.as_deref() == Some("dc1"))
            },
            invalid: json!(""),
            env_invalid: None,
        },
        Case {
            option: "cassandraRack",
            env: Some("PROSODY_CASSANDRA_RACK"),
            needs: json!({ "cassandraNodes": "c1", "cassandraDatacenter": "dc1" }),
            valid: json!("r1"),
            env_valid: Some("r1"),
            check: |c| {
                c.cassandra
                    .as_ref()
                    .is_some_and(|k| k.rack.as_deref() == Some("r1"))
            },
            invalid: json!(""),
            env_invalid: None,
        },
        Case {
            option: "cassandraRetentionSeconds",
            env: Some("PROSODY_CASSANDRA_RETENTION"),
            needs: nodes(),
            valid: json!(86_400),
            env_valid: Some("1d"),
            check: |c| {
                c.cassandra
                    .as_ref()
                    .is_some_and(|k| k.retention == secs(86_400))
            },
            invalid: json!(0),
            env_invalid: Some("21y"),
        },
        Case {
            option: "storageBackend",
            env: Some("PROSODY_STORAGE_BACKEND"),
            needs: json!({ "stateCacheDir": "/var/lib/prosody" }),
            valid: json!("rocksdb"),
            env_valid: Some("rocksdb"),
            check: |c| c.storage.backend == StorageBackend::RocksDb,
            invalid: json!("redis"),
            env_invalid: Some("redis"),
        },
        Case {
            option: "stateCacheDir",
            env: Some("PROSODY_STATE_CACHE_DIR"),
            needs: none(),
            valid: json!("/var/lib/prosody"),
            env_valid: Some("/var/lib/prosody"),
            check: |c| c.storage.cache_dir.as_deref() == Some(Path::new("/var/lib/prosody")),
            invalid: json!(""),
            env_invalid: None,
        },
        Case {
            option: "stateOwnedCacheSize",
            env: Some("PROSODY_STATE_OWNED_CACHE_SIZE"),
            needs: none(),
            valid: json!(67_108_864),
            env_valid: Some("67108864"),
            check: |c| c.storage.owned_cache_size_bytes == NonZeroU64::new(67_108_864),
            invalid: json!(0),
            env_invalid: Some("0"),
        },
        Case {
            option: "stateCacheSizeBytes",
            env: Some("PROSODY_STATE_CACHE_SIZE_BYTES"),
            needs: none(),
            valid: json!(4096),
            env_valid: Some("4096"),
            check: |c| c.storage.owned_cache_size_bytes == NonZeroU64::new(4096),
            invalid: json!(9_007_199_254_740_992_u64),
            env_invalid: Some("9007199254740992"),
        },
        Case {
            option: "stateReadCacheSize",
            env: Some("PROSODY_STATE_READ_CACHE_SIZE"),
            needs: none(),
            valid: json!(2048),
            env_valid: Some("2048"),
            check: |c| c.storage.read_cache_size_bytes.get() == 2048,
            invalid: json!(0),
            env_invalid: Some("x"),
        },
        Case {
            option: "stateReadCache",
            env: Some("PROSODY_STATE_READ_CACHE_TTL"),
            needs: none(),
            valid: json!({ "ttlMs": 250 }),
            env_valid: Some("250ms"),
            check: |c| c.storage.read_cache_ttl == Some(ms(250)),
            invalid: json!({ "ttl": 250 }),
            env_invalid: Some("soon"),
        },
        Case {
            option: "stateRecoveryDelaySeconds",
            env: Some("PROSODY_STATE_RECOVERY_DELAY"),
            needs: none(),
            valid: json!(45),
            env_valid: Some("45s"),
            check: |c| c.storage.recovery_delay == secs(45),
            invalid: json!(0),
            env_invalid: Some("1500ms"),
        },
        Case {
            option: "stateCollections",
            env: None,
            needs: none(),
            valid: json!([{ "name": "carts", "kind": "map", "payload": "json" }]),
            env_valid: None,
            check: |c| c.storage.collections.len() == 1,
            invalid: json!({ "name": "carts" }),
            env_invalid: None,
        },
    ]
}

/// Variables without an option: name, valid text, check, invalid text.
type EnvOnlyCase = (
    &'static str,
    &'static str,
    fn(&Config) -> bool,
    &'static str,
);

fn env_only_cases() -> Vec<EnvOnlyCase> {
    vec![
        (
            "PROSODY_LOG",
            "prosody=debug,warn",
            |c| c.telemetry.log_filter == "prosody=debug,warn",
            "prosody=loud",
        ),
        (
            "PROSODY_STATISTICS_INTERVAL",
            "0",
            |c| c.kafka.statistics_interval.is_zero(),
            "often",
        ),
    ]
}

/// The options of `case` with `option` set to `value` (or removed, for `None`).
fn options_for(case: &Case, value: Option<&Value>) -> Value {
    let mut options = merged(&case.needs);
    if let Some(object) = options.as_object_mut() {
        match value {
            Some(value) => object.insert(case.option.to_owned(), value.clone()),
            None => object.remove(case.option),
        };
    }
    options
}

#[test]
fn every_option_accepts_a_valid_value() {
    let defaults = defaults();
    for case in cases() {
        assert!(
            !(case.check)(&defaults),
            "{}: check must fail on the defaults",
            case.option
        );
        let config = build(options_for(&case, Some(&case.valid)), &MapEnv::new())
            .unwrap_or_else(|e| panic!("{}: {} rejected: {e}", case.option, case.valid));
        assert!(
            (case.check)(&config),
            "{}: {} not resolved",
            case.option,
            case.valid
        );
    }
}

#[test]
fn every_option_rejects_an_invalid_value_naming_it() {
    for case in cases() {
        let error = build(options_for(&case, Some(&case.invalid)), &MapEnv::new())
            .err()
            .unwrap_or_else(|| panic!("{}: {} accepted", case.option, case.invalid));
        let message = error.to_string();
        assert_eq!(error.option(), Some(case.option), "{message}");
        assert!(
            message.starts_with(&format!("{}: ", case.option)),
            "{message}"
        );
        assert!(
            message.contains("must") || message.contains("expected"),
            "{}: message does not say what is accepted: {message}",
            case.option
        );
    }
}

#[test]
fn every_variable_is_a_fallback() {
    for case in cases() {
        let (Some(env), Some(text)) = (case.env, case.env_valid) else {
            continue;
        };
        let config = build(options_for(&case, None), &MapEnv::new().with(env, text))
            .unwrap_or_else(|e| panic!("{env}={text:?} rejected: {e}"));
        assert!((case.check)(&config), "{env}={text:?} not resolved");
    }
}

#[test]
fn every_variable_rejects_invalid_text_naming_option_and_variable() {
    for case in cases() {
        let (Some(env), Some(text)) = (case.env, case.env_invalid) else {
            continue;
        };
        let error = build(options_for(&case, None), &MapEnv::new().with(env, text))
            .err()
            .unwrap_or_else(|| panic!("{env}={text:?} accepted"));
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("{} ({env}): ", case.option)),
            "{message}"
        );
        assert_eq!(error.env_var(), Some(env), "{message}");
        assert!(message.contains("must"), "{message}");
    }
}

#[test]
fn every_option_beats_its_variable() {
    // The variable holds invalid text where possible: an option that wins never even parses it.
    for case in cases() {
        let Some(env) = case.env else { continue };
        let text = case.env_invalid.or(case.env_valid).unwrap_or("ignored");
        let config = build(
            options_for(&case, Some(&case.valid)),
            &MapEnv::new().with(env, text),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.option));
        assert!((case.check)(&config), "{} lost to {env}", case.option);
    }
}

#[test]
fn variables_without_options() {
    for (env, valid, check, invalid) in env_only_cases() {
        assert!(
            !check(&defaults()),
            "{env}: check must fail on the defaults"
        );
        let config = build(base(), &MapEnv::new().with(env, valid)).unwrap();
        assert!(check(&config), "{env}={valid:?} not resolved");
        let error = build(base(), &MapEnv::new().with(env, invalid)).unwrap_err();
        assert!(
            error.to_string().starts_with(&format!("{env}: ")),
            "{error}"
        );
    }
}

#[test]
fn table_covers_every_option_and_variable() {
    // serde lists every accepted name when it rejects an unknown one.
    let error = build(merged(&json!({ "noSuchOption": 1 })), &MapEnv::new()).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("unknown field `noSuchOption`"),
        "{message}"
    );
    let listed: Vec<&str> = message.split('`').skip(3).step_by(2).collect();
    let cases = cases();
    let aliases = [
        "deferCacheSize",
        "deferSeekTimeoutMs",
        "deferDiscardThreshold",
    ];
    for name in &listed {
        assert!(
            aliases.contains(name) || cases.iter().any(|case| case.option == *name),
            "option {name} has no row"
        );
    }
    for case in &cases {
        assert!(
            listed.contains(&case.option),
            "row {} is not an option",
            case.option
        );
    }
    let env_only = env_only_cases();
    for field in fields::ALL {
        let covered = match (field.option, field.env) {
            (Some(option), env) => cases.iter().any(|c| c.option == option && c.env == env),
            (None, Some(env)) => env_only.iter().any(|(name, ..)| *name == env),
            (None, None) => false,
        };
        assert!(covered, "{field:?} has no row");
    }
}

#[test]
fn defaults_match_the_specification() {
    let c = defaults();
    assert_eq!(c.kafka.source_system, "g");
    assert!(!c.kafka.mock);
    assert_eq!(c.kafka.send_timeout, secs(1));
    assert_eq!(c.kafka.statistics_interval, secs(5));
    assert!(c.consumer.subscribed_topics.is_empty());
    assert!(c.consumer.allowed_events.is_empty());
    assert_eq!(c.consumer.max_concurrency.get(), 32);
    assert_eq!(c.consumer.max_uncommitted.get(), 64);
    assert_eq!(c.consumer.stall_threshold, secs(300));
    assert_eq!(c.consumer.timeout, secs(240));
    assert_eq!(c.consumer.commit_interval, secs(1));
    assert_eq!(c.consumer.poll_interval, ms(100));
    assert_eq!(c.consumer.shutdown_timeout, secs(30));
    assert_eq!(c.probes.port, Some(8000));
    assert_eq!(c.failure.mode, Mode::Pipeline);
    assert_eq!(c.failure.failure_topic, None);
    assert_eq!(c.failure.retry.max_retries, 3);
    assert_eq!(c.failure.retry.base, ms(20));
    assert_eq!(c.failure.retry.max_delay, secs(300));
    assert_eq!(c.dedup.cache_size.get(), 8192);
    assert_eq!(c.dedup.version, "1");
    assert_eq!(c.dedup.ttl, secs(604_800));
    assert_eq!(c.timers.slab_size, secs(3600));
    assert_eq!(c.telemetry.message_spans, SpanRelation::Child);
    assert_eq!(c.telemetry.timer_spans, SpanRelation::FollowsFrom);
    assert_eq!(c.telemetry.log_filter, "info");
    assert!(c.telemetry.enabled);
    assert_eq!(c.telemetry.topic, "prosody.telemetry-events");
    assert!(c.defer.enabled);
    assert_eq!(c.defer.base, secs(1));
    assert_eq!(c.defer.max_delay, secs(86_400));
    assert!((c.defer.failure_threshold - 0.9).abs() < f64::EPSILON);
    assert_eq!(c.defer.failure_window, secs(300));
    assert_eq!(c.defer.store_cache_size.get(), 8192);
    assert_eq!(c.defer.loader.cache_size.get(), 1024);
    assert_eq!(c.defer.loader.seek_timeout, secs(30));
    assert_eq!(c.defer.loader.discard_threshold, 100);
    assert!(c.monopolization.enabled);
    assert!((c.monopolization.threshold - 0.9).abs() < f64::EPSILON);
    assert_eq!(c.monopolization.window, secs(300));
    assert_eq!(c.monopolization.cache_size.get(), 8192);
    assert!((c.scheduler.failure_weight - 0.3).abs() < f64::EPSILON);
    assert_eq!(c.scheduler.max_wait, secs(120));
    assert!((c.scheduler.wait_weight - 200.0).abs() < f64::EPSILON);
    assert_eq!(c.scheduler.cache_size.get(), 8192);
    assert_eq!(c.cassandra, None);
    assert_eq!(c.storage.backend, StorageBackend::Memory);
    assert_eq!(c.storage.cache_dir, None);
    assert_eq!(c.storage.owned_cache_size_bytes, None);
    assert_eq!(c.storage.read_cache_size_bytes.get(), 1 << 20);
    assert_eq!(c.storage.read_cache_ttl, Some(secs(5)));
    assert_eq!(c.storage.recovery_delay, secs(30));
    assert!(c.storage.collections.is_empty());

    let with_nodes = build(merged(&json!({ "cassandraNodes": "c1" })), &MapEnv::new()).unwrap();
    let cassandra = with_nodes.cassandra.unwrap();
    assert_eq!(cassandra.keyspace, "prosody");
    assert_eq!(cassandra.retention, secs(31_557_600));
    assert_eq!((cassandra.user, cassandra.password), (None, None));
}

#[test]
fn option_beats_variable_beats_default() {
    let env = MapEnv::new().with("PROSODY_MAX_CONCURRENCY", "16");
    let config = build(merged(&json!({ "maxConcurrency": 8 })), &env).unwrap();
    assert_eq!(config.consumer.max_concurrency.get(), 8);
    let config = build(base(), &env).unwrap();
    assert_eq!(config.consumer.max_concurrency.get(), 16);
    let config = build(base(), &MapEnv::new()).unwrap();
    assert_eq!(config.consumer.max_concurrency.get(), 32);
}

#[test]
fn messages_name_the_field_and_the_accepted_values() {
    let env = MapEnv::new().with("PROSODY_MAX_CONCURRENCY", "0");
    assert_eq!(
        build(base(), &env).unwrap_err().to_string(),
        "maxConcurrency (PROSODY_MAX_CONCURRENCY): must be an integer >= 1, got \"0\""
    );
    assert_eq!(
        build(merged(&json!({ "maxConcurrency": 0 })), &MapEnv::new())
            .unwrap_err()
            .to_string(),
        "maxConcurrency: must be an integer >= 1, got 0"
    );
    assert_eq!(
        build(merged(&json!({ "maxConcurrency": "x" })), &MapEnv::new())
            .unwrap_err()
            .to_string(),
        "maxConcurrency: invalid type: string \"x\", expected usize"
    );
    assert_eq!(
        build(merged(&json!({ "mode": "fast" })), &MapEnv::new())
            .unwrap_err()
            .to_string(),
        "mode: must be one of \"pipeline\", \"low-latency\", \"best-effort\", got \"fast\""
    );
    assert_eq!(
        build(merged(&json!({ "timeoutMs": true })), &MapEnv::new())
            .unwrap_err()
            .to_string(),
        "timeoutMs: invalid type: boolean `true`, expected a non-negative integer number of \
         milliseconds or a duration string such as \"30s\""
    );
}

#[test]
fn json_text_errors_name_the_field() {
    let error = ClientOptions::from_json(r#"{"groupId": "g", "probePort": "http"}"#).unwrap_err();
    assert_eq!(error.option(), Some("probePort"));
    assert!(error.to_string().starts_with("probePort: "), "{error}");
    assert!(!error.to_string().contains("line"), "{error}");
    let error = ClientOptions::from_json(r#"{"groupId": 1}"#).unwrap_err();
    assert!(
        error.to_string().starts_with("groupId: invalid type"),
        "{error}"
    );
    assert!(ClientOptions::from_json(r#"{"groupId": "g"} trailing"#).is_err());
}

#[test]
fn json_null_means_unset_except_where_it_disables() {
    let config = build(
        merged(&json!({ "maxConcurrency": null, "timeoutMs": null, "subscribedTopics": null })),
        &MapEnv::new().with("PROSODY_MAX_CONCURRENCY", "4"),
    )
    .unwrap();
    assert_eq!(config.consumer.max_concurrency.get(), 4);
    assert_eq!(config.consumer.timeout, secs(240));
    let config = build(
        merged(&json!({ "probePort": null, "stateReadCache": null })),
        &MapEnv::new(),
    )
    .unwrap();
    assert_eq!(config.probes.port, None);
    assert_eq!(config.storage.read_cache_ttl, None);
}

#[test]
fn durations_take_milliseconds_or_text() {
    for (value, expected) in [
        (json!(30_000), secs(30)),
        (json!(30_000.0), secs(30)),
        (json!("30s"), secs(30)),
        (json!("30000"), secs(30)),
        (json!("1m 30s"), secs(90)),
    ] {
        let config = build(merged(&json!({ "timeoutMs": value })), &MapEnv::new()).unwrap();
        assert_eq!(config.consumer.timeout, expected, "{value}");
    }
    let error = build(merged(&json!({ "timeoutMs": 1.5 })), &MapEnv::new()).unwrap_err();
    assert_eq!(error.option(), Some("timeoutMs"));
}

#[test]
fn probe_port_forms() {
    let port = |value: Value, env: &MapEnv| build(merged(&json!({ "probePort": value })), env);
    assert_eq!(
        port(json!(9000), &MapEnv::new()).unwrap().probes.port,
        Some(9000)
    );
    assert_eq!(
        port(json!("9000"), &MapEnv::new()).unwrap().probes.port,
        Some(9000)
    );
    assert_eq!(
        port(json!("none"), &MapEnv::new()).unwrap().probes.port,
        None
    );
    assert_eq!(port(json!(0), &MapEnv::new()).unwrap().probes.port, Some(0));
    let env = MapEnv::new().with("PROSODY_PROBE_PORT", "9100");
    assert_eq!(build(base(), &env).unwrap().probes.port, Some(9100));
}

#[test]
fn bootstrap_servers_required_unless_mock() {
    let mut options = base();
    if let Some(object) = options.as_object_mut() {
        object.remove("bootstrapServers");
    }
    let error = build(options.clone(), &MapEnv::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "bootstrapServers (PROSODY_BOOTSTRAP_SERVERS): required unless mock is true"
    );
    if let Some(object) = options.as_object_mut() {
        object.insert("mock".to_owned(), json!(true));
    }
    let config = build(options, &MapEnv::new()).unwrap();
    assert!(config.kafka.bootstrap_servers.is_empty());
}

#[test]
fn group_id_required() {
    let options = json!({ "mock": true });
    let error = build(options, &MapEnv::new()).unwrap_err();
    assert_eq!(error.option(), Some("groupId"));
    assert!(
        error
            .to_string()
            .starts_with("groupId (PROSODY_GROUP_ID): required")
    );
}

#[test]
fn mock_alone_is_enough() {
    let config = build(json!({ "mock": true, "groupId": "g" }), &MapEnv::new()).unwrap();
    assert_eq!(config.storage.backend, StorageBackend::Memory);
    assert!(!config.telemetry.enabled);
}

#[test]
fn max_uncommitted_at_least_max_concurrency() {
    let error = build(merged(&json!({ "maxConcurrency": 100 })), &MapEnv::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "maxUncommitted: must be at least maxConcurrency (100) because running handlers count \
         as uncommitted, got 64"
    );
    let env = MapEnv::new().with("PROSODY_MAX_UNCOMMITTED", "10");
    let error = build(base(), &env).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("maxUncommitted (PROSODY_MAX_UNCOMMITTED): must be at least maxConcurrency (32 by default)"),
        "{error}"
    );
    let config = build(
        merged(&json!({ "maxConcurrency": 100, "maxUncommitted": 100 })),
        &MapEnv::new(),
    )
    .unwrap();
    assert_eq!(config.consumer.max_uncommitted.get(), 100);
}

#[test]
fn low_latency_requires_failure_topic() {
    let error = build(merged(&json!({ "mode": "low-latency" })), &MapEnv::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "failureTopic (PROSODY_FAILURE_TOPIC): required when mode is \"low-latency\""
    );
    let env = MapEnv::new().with("PROSODY_FAILURE_TOPIC", "dlq");
    let config = build(merged(&json!({ "mode": "LowLatency" })), &env).unwrap();
    assert_eq!(config.failure.failure_topic.as_deref(), Some("dlq"));
    let config = build(merged(&json!({ "mode": "best-effort" })), &MapEnv::new()).unwrap();
    assert_eq!(config.failure.mode, Mode::BestEffort);
}

#[test]
fn delay_caps_not_below_bases() {
    let error = build(merged(&json!({ "retryBaseMs": "10m" })), &MapEnv::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "maxRetryDelayMs: must be at least retryBaseMs (10m), got 5m"
    );
    let error = build(merged(&json!({ "deferBaseMs": "2d" })), &MapEnv::new()).unwrap_err();
    assert_eq!(error.option(), Some("deferMaxDelayMs"));
}

#[test]
fn cassandra_credentials_and_placement_go_together() {
    let error = build(
        merged(&json!({ "cassandraNodes": "c1", "cassandraUser": "alice" })),
        &MapEnv::new(),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cassandraUser: needs cassandraPassword"),
        "{error}"
    );
    let env = MapEnv::new().with("PROSODY_CASSANDRA_PASSWORD", "pw");
    let error = build(merged(&json!({ "cassandraNodes": "c1" })), &env).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cassandraPassword (PROSODY_CASSANDRA_PASSWORD): needs cassandraUser"),
        "{error}"
    );
    assert!(
        !error.to_string().contains("pw\""),
        "password leaked: {error}"
    );
    let error = build(
        merged(&json!({ "cassandraNodes": "c1", "cassandraRack": "r1" })),
        &MapEnv::new(),
    )
    .unwrap_err();
    assert_eq!(error.option(), Some("cassandraRack"));
}

#[test]
fn cassandra_settings_checked_without_nodes() {
    let error = build(
        merged(&json!({ "cassandraKeyspace": "bad-ks" })),
        &MapEnv::new(),
    )
    .unwrap_err();
    assert_eq!(error.option(), Some("cassandraKeyspace"));
}

#[test]
fn password_is_never_printed() {
    let config = build(
        merged(&json!({
            "cassandraNodes": "c1",
            "cassandraUser": "alice",
            "cassandraPassword": "hunter2",
        })),
        &MapEnv::new(),
    )
    .unwrap();
    assert!(!format!("{config:?}").contains("hunter2"));
    let options = ClientOptions::from_json(r#"{"cassandraPassword": "hunter2"}"#).unwrap();
    assert!(!format!("{options:?}").contains("hunter2"));
}

#[test]
fn storage_backend_selection() {
    let nodes = json!({ "cassandraNodes": "c1" });
    let mut options = merged(&nodes);
    if let Some(object) = options.as_object_mut() {
        object.remove("storageBackend");
    }
    let config = build(options.clone(), &MapEnv::new()).unwrap();
    assert_eq!(config.storage.backend, StorageBackend::Cassandra);
    assert!(config.cassandra.is_some());

    if let Some(object) = options.as_object_mut() {
        object.remove("cassandraNodes");
    }
    let error = build(options.clone(), &MapEnv::new()).unwrap_err();
    assert_eq!(error.option(), Some("storageBackend"));

    let env = MapEnv::new().with("PROSODY_STORAGE_BACKEND", "cassandra");
    let error = build(options.clone(), &env).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cassandraNodes (PROSODY_CASSANDRA_NODES): required when storageBackend is \"cassandra\""
    );

    let env = MapEnv::new().with("PROSODY_STORAGE_BACKEND", "rocksdb");
    let error = build(options.clone(), &env).unwrap_err();
    assert_eq!(error.option(), Some("stateCacheDir"));

    let config = build(
        json!({ "mock": true, "groupId": "g", "cassandraNodes": "c1" }),
        &MapEnv::new(),
    )
    .unwrap();
    assert_eq!(config.storage.backend, StorageBackend::Memory);
    let error = build(
        json!({ "mock": true, "groupId": "g", "storageBackend": "cassandra", "cassandraNodes": "c1" }),
        &MapEnv::new(),
    )
    .unwrap_err();
    assert_eq!(error.option(), Some("storageBackend"));
}

#[test]
fn owned_cache_size_has_one_value_under_two_names() {
    let error = build(
        merged(&json!({ "stateOwnedCacheSize": 1024, "stateCacheSizeBytes": 2048 })),
        &MapEnv::new(),
    )
    .unwrap_err();
    assert_eq!(error.option(), Some("stateCacheSizeBytes"));
    assert!(error.to_string().contains("stateOwnedCacheSize"), "{error}");
}

#[test]
fn loader_options_accept_their_old_names() {
    let config = build(
        merged(&json!({
            "deferCacheSize": 7,
            "deferSeekTimeoutMs": "3s",
            "deferDiscardThreshold": 9,
        })),
        &MapEnv::new(),
    )
    .unwrap();
    assert_eq!(config.defer.loader.cache_size.get(), 7);
    assert_eq!(config.defer.loader.seek_timeout, secs(3));
    assert_eq!(config.defer.loader.discard_threshold, 9);
}

#[test]
fn read_cache_zero_ttl_points_at_disabling() {
    let error = build(
        merged(&json!({ "stateReadCache": { "ttlMs": 0 } })),
        &MapEnv::new(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("\"none\" to disable"), "{error}");
    let config = build(merged(&json!({ "stateReadCache": false })), &MapEnv::new()).unwrap();
    assert_eq!(config.storage.read_cache_ttl, None);
    let env = MapEnv::new().with("PROSODY_STATE_READ_CACHE_TTL", "none");
    assert_eq!(build(base(), &env).unwrap().storage.read_cache_ttl, None);
}

#[test]
fn blank_variables_count_as_unset() {
    let env = MapEnv::new()
        .with("PROSODY_MAX_CONCURRENCY", "")
        .with("PROSODY_FAILURE_TOPIC", "  ");
    let config = build(base(), &env).unwrap();
    assert_eq!(config.consumer.max_concurrency.get(), 32);
    assert_eq!(config.failure.failure_topic, None);
}

#[test]
fn rust_callers_fill_the_struct() {
    let options = ClientOptions {
        bootstrap_servers: Some(vec!["localhost:9092".to_owned()]),
        group_id: Some("orders".to_owned()),
        mode: Some(Mode::LowLatency),
        failure_topic: Some("orders.dlq".to_owned()),
        timeout_ms: Some(secs(10)),
        probe_port: Some(ProbePort::Disabled),
        cassandra_nodes: Some(vec!["localhost:9042".to_owned()]),
        ..ClientOptions::default()
    };
    let config = Config::from_options_and_env(options, &MapEnv::new()).unwrap();
    assert_eq!(config.consumer.timeout, secs(10));
    assert_eq!(config.probes.port, None);
    assert_eq!(config.storage.backend, StorageBackend::Cassandra);
}
