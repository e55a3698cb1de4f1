//! Turns [`ClientOptions`] and the environment into a validated [`Config`].
//!
//! Each section is resolved by its own function; rules that tie two settings together run after
//! both are resolved, and name the setting the user is most likely to change.

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use super::checks;
use super::env::{EnvSource, ProcessEnv};
use super::error::ConfigError;
use super::fields;
use super::kinds::{Mode, SpanRelation};
use super::options::ClientOptions;
use super::resolver::{AT_LEAST_ONE, Given, Resolver};
use super::sections::{
    CassandraConfig, Config, ConsumerConfig, DedupConfig, DeferConfig, FailureConfig, KafkaConfig,
    LoaderConfig, MonopolizationConfig, ProbeConfig, RetryConfig, SchedulerConfig, StorageConfig,
    TelemetryConfig, TimerConfig,
};
use super::storage;
use super::value::{self, ProbePort, ReadCache, Unit};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

const POSITIVE_DURATION: &str = "must be a positive duration such as \"30s\" or \"5m\"";
const FRACTION: &str = "must be a number greater than 0 and at most 1";
const SAFE_SIZE: &str = "must be an integer number of bytes from 1 to 9007199254740991";

impl Config {
    /// Resolves `options` against the process environment: each option given wins, else its
    /// `PROSODY_*` variable, else the default of FEATURES.md section 9.
    ///
    /// # Errors
    ///
    /// The first invalid, missing or conflicting setting, named by its option (and variable
    /// when the value came from the environment) with what it accepts.
    pub fn from_options(options: ClientOptions) -> Result<Self, ConfigError> {
        Self::from_options_and_env(options, &ProcessEnv)
    }

    /// Like [`from_options`](Self::from_options), reading variables from `env` instead of the
    /// process environment.
    ///
    /// # Errors
    ///
    /// As for [`from_options`](Self::from_options).
    pub fn from_options_and_env(
        options: ClientOptions,
        env: &dyn EnvSource,
    ) -> Result<Self, ConfigError> {
        build(options, &Resolver::new(env))
    }
}

/// Requires a positive duration.
fn positive(given: Given<Duration>) -> Result<Duration, ConfigError> {
    Ok(given.ensure(|d| !d.is_zero(), POSITIVE_DURATION)?.value)
}

/// Requires a count of at least one.
fn non_zero(given: Given<usize>) -> Result<NonZeroUsize, ConfigError> {
    given.try_map(|&count| NonZeroUsize::new(count).ok_or_else(|| AT_LEAST_ONE.to_owned()))
}

/// Requires a byte size JavaScript can represent exactly.
fn safe_size(given: Given<u64>) -> Result<NonZeroU64, ConfigError> {
    given.try_map(|&bytes| {
        NonZeroU64::new(bytes)
            .filter(|bytes| bytes.get() <= checks::MAX_SAFE_INTEGER)
            .ok_or_else(|| SAFE_SIZE.to_owned())
    })
}

/// Requires a fraction in (0, 1].
fn fraction(given: Given<f64>) -> Result<f64, ConfigError> {
    Ok(given.ensure(|&v| checks::is_fraction(v), FRACTION)?.value)
}

/// Requires a topic name, if one is given.
fn topic(given: Option<Given<String>>) -> Result<Option<String>, ConfigError> {
    given
        .map(|given| {
            Ok(given
                .ensure(|t| checks::is_topic_name(t), checks::TOPIC_EXPECTED)?
                .value)
        })
        .transpose()
}

/// Requires `upper >= lower`, naming `upper`.
fn not_below(
    upper: Given<Duration>,
    lower: &Given<Duration>,
) -> Result<Given<Duration>, ConfigError> {
    if upper.value >= lower.value {
        Ok(upper)
    } else {
        let name = lower.field.option.unwrap_or_default();
        let bound = value::show_duration(lower.value);
        Err(upper.invalid(format!("must be at least {name} ({bound})")))
    }
}

fn build(mut options: ClientOptions, r: &Resolver<'_>) -> Result<Config, ConfigError> {
    let o = &mut options;
    let kafka = kafka(r, o)?;
    let mock = kafka.mock;
    let consumer = consumer(r, o)?;
    let failure = failure(r, o)?;
    let dedup = dedup(r, o)?;
    let defer = defer(r, o)?;
    let monopolization = monopolization(r, o)?;
    let scheduler = scheduler(r, o)?;
    let timers = TimerConfig {
        slab_size: r
            .duration(fields::SLAB_SIZE, o.slab_size_ms.take(), Unit::Millis, HOUR)?
            .ensure(
                |d| *d >= Duration::from_secs(1),
                "must be a duration of at least 1s (the timer precision)",
            )?
            .value,
    };
    let telemetry = telemetry(r, o, mock)?;
    let probes = ProbeConfig {
        port: match r
            .get_or(
                fields::PROBE_PORT,
                o.probe_port.take(),
                value::parse_probe_port,
                ProbePort::Port(8000),
            )?
            .value
        {
            ProbePort::Disabled => None,
            ProbePort::Port(port) => Some(port),
        },
    };
    let cassandra = cassandra(r, o)?;
    let storage = storage_config(r, o, mock, cassandra.is_some())?;
    Ok(Config {
        kafka,
        consumer,
        failure,
        dedup,
        defer,
        monopolization,
        scheduler,
        timers,
        telemetry,
        probes,
        cassandra,
        storage,
    })
}

fn kafka(r: &Resolver<'_>, o: &mut ClientOptions) -> Result<KafkaConfig, ConfigError> {
    let mock = r.flag(fields::MOCK, o.mock.take(), false)?;
    let bootstrap_servers = r.list(fields::BOOTSTRAP_SERVERS, o.bootstrap_servers.take())?;
    if bootstrap_servers.value.is_empty() && !mock {
        return Err(ConfigError::Missing {
            field: fields::BOOTSTRAP_SERVERS.full(),
            reason: "required unless mock is true".to_owned(),
        });
    }
    let bootstrap_servers = bootstrap_servers
        .validate(|list| checks::addresses(list))?
        .value;
    let Some(group_id) = r.text(fields::GROUP_ID, o.group_id.take())? else {
        return Err(ConfigError::Missing {
            field: fields::GROUP_ID.full(),
            reason: "required: it names the consumer group and is the default sourceSystem"
                .to_owned(),
        });
    };
    let group_id = group_id.value;
    let source_system = r
        .text(fields::SOURCE_SYSTEM, o.source_system.take())?
        .map_or_else(|| group_id.clone(), |given| given.value);
    Ok(KafkaConfig {
        bootstrap_servers,
        mock,
        source_system,
        subsystem: r
            .text(fields::SUBSYSTEM, o.subsystem.take())?
            .map(|given| given.value),
        send_timeout: positive(r.duration(
            fields::SEND_TIMEOUT,
            o.send_timeout_ms.take(),
            Unit::Millis,
            Duration::from_secs(1),
        )?)?,
        statistics_interval: r
            .duration(
                fields::STATISTICS_INTERVAL,
                None,
                Unit::Millis,
                Duration::from_secs(5),
            )?
            .value,
        group_id,
    })
}

fn failure(r: &Resolver<'_>, o: &mut ClientOptions) -> Result<FailureConfig, ConfigError> {
    let mode = r.choice(fields::MODE, o.mode.take(), Mode::Pipeline)?.value;
    let failure_topic = topic(r.text(fields::FAILURE_TOPIC, o.failure_topic.take())?)?;
    if mode == Mode::LowLatency && failure_topic.is_none() {
        return Err(ConfigError::Missing {
            field: fields::FAILURE_TOPIC.full(),
            reason: "required when mode is \"low-latency\"".to_owned(),
        });
    }
    let base = r
        .duration(
            fields::RETRY_BASE,
            o.retry_base_ms.take(),
            Unit::Millis,
            Duration::from_millis(20),
        )?
        .ensure(|d| !d.is_zero(), POSITIVE_DURATION)?;
    let max_delay = r.duration(
        fields::MAX_RETRY_DELAY,
        o.max_retry_delay_ms.take(),
        Unit::Millis,
        5 * MINUTE,
    )?;
    Ok(FailureConfig {
        mode,
        failure_topic,
        retry: RetryConfig {
            max_retries: r
                .integer(fields::MAX_RETRIES, o.max_retries.take(), 3)?
                .value,
            max_delay: not_below(max_delay, &base)?.value,
            base: base.value,
        },
    })
}

fn dedup(r: &Resolver<'_>, o: &mut ClientOptions) -> Result<DedupConfig, ConfigError> {
    Ok(DedupConfig {
        cache_size: non_zero(r.count(
            fields::IDEMPOTENCE_CACHE_SIZE,
            o.idempotence_cache_size.take(),
            8192,
        )?)?,
        version: r
            .text(fields::IDEMPOTENCE_VERSION, o.idempotence_version.take())?
            .map_or_else(|| "1".to_owned(), |given| given.value),
        ttl: cassandra_ttl(r.duration(
            fields::IDEMPOTENCE_TTL,
            o.idempotence_ttl_s.take(),
            Unit::Seconds,
            Duration::from_secs(604_800),
        )?)?,
    })
}

fn defer(r: &Resolver<'_>, o: &mut ClientOptions) -> Result<DeferConfig, ConfigError> {
    let base = r
        .duration(
            fields::DEFER_BASE,
            o.defer_base_ms.take(),
            Unit::Millis,
            Duration::from_secs(1),
        )?
        .ensure(|d| !d.is_zero(), POSITIVE_DURATION)?;
    let max_delay = r.duration(
        fields::DEFER_MAX_DELAY,
        o.defer_max_delay_ms.take(),
        Unit::Millis,
        24 * HOUR,
    )?;
    Ok(DeferConfig {
        enabled: r.flag(fields::DEFER_ENABLED, o.defer_enabled.take(), true)?,
        max_delay: not_below(max_delay, &base)?.value,
        base: base.value,
        failure_threshold: fraction(r.number(
            fields::DEFER_FAILURE_THRESHOLD,
            o.defer_failure_threshold.take(),
            0.9,
        )?)?,
        failure_window: positive(r.duration(
            fields::DEFER_FAILURE_WINDOW,
            o.defer_failure_window_ms.take(),
            Unit::Millis,
            5 * MINUTE,
        )?)?,
        store_cache_size: non_zero(r.count(
            fields::DEFER_STORE_CACHE_SIZE,
            o.defer_store_cache_size.take(),
            8192,
        )?)?,
        loader: LoaderConfig {
            cache_size: non_zero(r.count(
                fields::LOADER_CACHE_SIZE,
                o.loader_cache_size.take(),
                1024,
            )?)?,
            seek_timeout: positive(r.duration(
                fields::LOADER_SEEK_TIMEOUT,
                o.loader_seek_timeout_ms.take(),
                Unit::Millis,
                Duration::from_secs(30),
            )?)?,
            discard_threshold: r
                .integer(
                    fields::LOADER_DISCARD_THRESHOLD,
                    o.loader_discard_threshold.take(),
                    100,
                )?
                .value,
        },
    })
}

fn monopolization(
    r: &Resolver<'_>,
    o: &mut ClientOptions,
) -> Result<MonopolizationConfig, ConfigError> {
    Ok(MonopolizationConfig {
        enabled: r.flag(
            fields::MONOPOLIZATION_ENABLED,
            o.monopolization_enabled.take(),
            true,
        )?,
        threshold: fraction(r.number(
            fields::MONOPOLIZATION_THRESHOLD,
            o.monopolization_threshold.take(),
            0.9,
        )?)?,
        window: positive(r.duration(
            fields::MONOPOLIZATION_WINDOW,
            o.monopolization_window_ms.take(),
            Unit::Millis,
            5 * MINUTE,
        )?)?,
        cache_size: non_zero(r.count(
            fields::MONOPOLIZATION_CACHE_SIZE,
            o.monopolization_cache_size.take(),
            8192,
        )?)?,
    })
}

fn scheduler(r: &Resolver<'_>, o: &mut ClientOptions) -> Result<SchedulerConfig, ConfigError> {
    Ok(SchedulerConfig {
        failure_weight: r
            .number(
                fields::SCHEDULER_FAILURE_WEIGHT,
                o.scheduler_failure_weight.take(),
                0.3,
            )?
            .ensure(
                |&w| w > 0.0 && w < 1.0,
                "must be a number greater than 0 and less than 1",
            )?
            .value,
        max_wait: positive(r.duration(
            fields::SCHEDULER_MAX_WAIT,
            o.scheduler_max_wait_ms.take(),
            Unit::Millis,
            2 * MINUTE,
        )?)?,
        wait_weight: r
            .number(
                fields::SCHEDULER_WAIT_WEIGHT,
                o.scheduler_wait_weight.take(),
                200.0,
            )?
            .ensure(
                |&w| w.is_finite() && w >= 0.0,
                "must be a finite number >= 0",
            )?
            .value,
        cache_size: non_zero(r.count(
            fields::SCHEDULER_CACHE_SIZE,
            o.scheduler_cache_size.take(),
            8192,
        )?)?,
    })
}

fn telemetry(
    r: &Resolver<'_>,
    o: &mut ClientOptions,
    mock: bool,
) -> Result<TelemetryConfig, ConfigError> {
    Ok(TelemetryConfig {
        // Mock mode has no real Kafka to send lifecycle events to.
        enabled: r.flag(fields::TELEMETRY_ENABLED, o.telemetry_enabled.take(), true)? && !mock,
        topic: topic(r.text(fields::TELEMETRY_TOPIC, o.telemetry_topic.take())?)?
            .unwrap_or_else(|| "prosody.telemetry-events".to_owned()),
        message_spans: r
            .choice(
                fields::MESSAGE_SPANS,
                o.message_spans.take(),
                SpanRelation::Child,
            )?
            .value,
        timer_spans: r
            .choice(
                fields::TIMER_SPANS,
                o.timer_spans.take(),
                SpanRelation::FollowsFrom,
            )?
            .value,
        log_filter: log_filter(r)?,
    })
}

/// Requires whole seconds that Cassandra accepts as a TTL.
fn cassandra_ttl(given: Given<Duration>) -> Result<Duration, ConfigError> {
    Ok(given
        .ensure(
            |&d| checks::is_whole_seconds(d, checks::MAX_CASSANDRA_TTL),
            "must be a whole number of seconds from 1s to 20 years",
        )?
        .value)
}

/// Reads `PROSODY_LOG`, checking it parses as `tracing` filter directives.
fn log_filter(r: &Resolver<'_>) -> Result<String, ConfigError> {
    let given = r.get_or(
        fields::LOG,
        None,
        |raw| {
            tracing_subscriber::EnvFilter::try_new(raw)
                .map(|_| raw.trim().to_owned())
                .map_err(|error| {
                    format!(
                        "must be tracing filter directives such as \"info\" or \"prosody=debug,warn\" ({error})"
                    )
                })
        },
        "info".to_owned(),
    )?;
    Ok(given.value)
}

fn consumer(r: &Resolver<'_>, o: &mut ClientOptions) -> Result<ConsumerConfig, ConfigError> {
    let subscribed_topics = r
        .list(fields::SUBSCRIBED_TOPICS, o.subscribed_topics.take())?
        .validate(|topics| checks::subscription(topics))?
        .value;

    let max_concurrency = r.count(fields::MAX_CONCURRENCY, o.max_concurrency.take(), 32)?;
    let max_uncommitted = r.count(fields::MAX_UNCOMMITTED, o.max_uncommitted.take(), 64)?;
    let concurrency = non_zero(max_concurrency.clone())?;
    let uncommitted = non_zero(max_uncommitted.clone())?;
    // Running handlers count as uncommitted, so a smaller limit would silently cap concurrency.
    if uncommitted < concurrency {
        let source = if max_concurrency.is_set() {
            ""
        } else {
            " by default"
        };
        return Err(max_uncommitted.invalid(format!(
            "must be at least maxConcurrency ({concurrency}{source}) because running handlers \
             count as uncommitted"
        )));
    }

    let stall_threshold = positive(r.duration(
        fields::STALL_THRESHOLD,
        o.stall_threshold_ms.take(),
        Unit::Millis,
        5 * MINUTE,
    )?)?;
    Ok(ConsumerConfig {
        subscribed_topics,
        allowed_events: r
            .list(fields::ALLOWED_EVENTS, o.allowed_events.take())?
            .value,
        max_concurrency: concurrency,
        max_uncommitted: uncommitted,
        timeout: positive(r.duration(
            fields::TIMEOUT,
            o.timeout_ms.take(),
            Unit::Millis,
            stall_threshold * 4 / 5,
        )?)?,
        commit_interval: positive(r.duration(
            fields::COMMIT_INTERVAL,
            o.commit_interval_ms.take(),
            Unit::Millis,
            Duration::from_secs(1),
        )?)?,
        poll_interval: positive(r.duration(
            fields::POLL_INTERVAL,
            o.poll_interval_ms.take(),
            Unit::Millis,
            Duration::from_millis(100),
        )?)?,
        shutdown_timeout: r
            .duration(
                fields::SHUTDOWN_TIMEOUT,
                o.shutdown_timeout_ms.take(),
                Unit::Millis,
                Duration::from_secs(30),
            )?
            .value,
        stall_threshold,
    })
}

/// Resolves and checks every Cassandra setting even without nodes, so a typo fails now rather
/// than on the deployment that first adds nodes.
fn cassandra(
    r: &Resolver<'_>,
    o: &mut ClientOptions,
) -> Result<Option<CassandraConfig>, ConfigError> {
    let nodes = r
        .list(fields::CASSANDRA_NODES, o.cassandra_nodes.take())?
        .validate(|list| checks::addresses(list))?
        .value;
    let keyspace = r
        .text(fields::CASSANDRA_KEYSPACE, o.cassandra_keyspace.take())?
        .map(|given| given.ensure(|k| checks::is_keyspace(k), checks::KEYSPACE_EXPECTED))
        .transpose()?
        .map_or_else(|| "prosody".to_owned(), |given| given.value);
    let user = r.text(fields::CASSANDRA_USER, o.cassandra_user.take())?;
    let password = r
        .get(
            fields::CASSANDRA_PASSWORD,
            o.cassandra_password.take(),
            |raw| Ok(value::Secret::new(raw)),
        )?
        .map(|given| given.ensure(|p| !p.expose().is_empty(), "must not be empty"))
        .transpose()?;
    match (&user, &password) {
        (Some(user), None) => {
            return Err(user.conflict(
                "needs cassandraPassword (PROSODY_CASSANDRA_PASSWORD) as well; set both or neither",
            ));
        }
        (None, Some(password)) => {
            return Err(password.conflict(
                "needs cassandraUser (PROSODY_CASSANDRA_USER) as well; set both or neither",
            ));
        }
        _ => {}
    }
    let datacenter = r.text(fields::CASSANDRA_DATACENTER, o.cassandra_datacenter.take())?;
    let rack = r.text(fields::CASSANDRA_RACK, o.cassandra_rack.take())?;
    if let (Some(rack), None) = (&rack, &datacenter) {
        return Err(rack.conflict(
            "needs cassandraDatacenter (PROSODY_CASSANDRA_DATACENTER): a rack preference only \
             applies within a datacenter",
        ));
    }
    let retention = cassandra_ttl(r.duration(
        fields::CASSANDRA_RETENTION,
        o.cassandra_retention_seconds.take(),
        Unit::Seconds,
        Duration::from_secs(31_557_600),
    )?)?;
    if nodes.is_empty() {
        return Ok(None);
    }
    Ok(Some(CassandraConfig {
        nodes,
        keyspace,
        user: user.map(|given| given.value),
        password: password.map(|given| given.value),
        datacenter: datacenter.map(|given| given.value),
        rack: rack.map(|given| given.value),
        retention,
    }))
}

fn storage_config(
    r: &Resolver<'_>,
    o: &mut ClientOptions,
    mock: bool,
    has_cassandra_nodes: bool,
) -> Result<StorageConfig, ConfigError> {
    let cache_dir = r
        .get(fields::STATE_CACHE_DIR, o.state_cache_dir.take(), |raw| {
            Ok(PathBuf::from(raw.trim()))
        })?
        .map(|given| given.ensure(|dir| !dir.as_os_str().is_empty(), "must not be empty"))
        .transpose()?
        .map(|given| given.value);
    let backend = storage::select(
        r,
        o.storage_backend.take(),
        &storage::Inputs {
            mock,
            has_cassandra_nodes,
            cache_dir: cache_dir.as_ref(),
        },
    )?;

    let parse_size = |raw: &str| raw.trim().parse::<u64>().map_err(|_| SAFE_SIZE.to_owned());
    let owned = r.get(
        fields::STATE_OWNED_CACHE_SIZE,
        o.state_owned_cache_size.take(),
        parse_size,
    )?;
    let legacy = r.get(
        fields::STATE_CACHE_SIZE_BYTES,
        o.state_cache_size_bytes.take(),
        parse_size,
    )?;
    let owned_cache_size_bytes = match (owned, legacy) {
        (Some(_), Some(legacy)) => {
            return Err(legacy.conflict(
                "is the 0.5.1 name of stateOwnedCacheSize (PROSODY_STATE_OWNED_CACHE_SIZE); set \
                 only one of them",
            ));
        }
        (Some(given), None) | (None, Some(given)) => Some(safe_size(given)?),
        (None, None) => None,
    };

    let read_cache_ttl = match r
        .get_or(
            fields::STATE_READ_CACHE,
            o.state_read_cache.take(),
            value::parse_read_cache,
            ReadCache::Default,
        )?
        .ensure(
            |cache| !matches!(cache, ReadCache::Ttl(ttl) if ttl.is_zero()),
            "must be a positive duration (use false or \"none\" to disable)",
        )?
        .value
    {
        ReadCache::Disabled => None,
        ReadCache::Default => Some(Duration::from_secs(5)),
        ReadCache::Ttl(ttl) => Some(ttl),
    };

    let collections = match o.state_collections.take() {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) => items,
        Some(other) => {
            return Err(ConfigError::Invalid {
                field: fields::STATE_COLLECTIONS.option_ref(),
                expected: "must be an array of collection definitions".to_owned(),
                got: other.to_string(),
            });
        }
    };

    Ok(StorageConfig {
        backend,
        cache_dir,
        owned_cache_size_bytes,
        read_cache_size_bytes: safe_size(r.get_or(
            fields::STATE_READ_CACHE_SIZE,
            o.state_read_cache_size.take(),
            parse_size,
            1 << 20,
        )?)?,
        read_cache_ttl,
        recovery_delay: r
            .duration(
                fields::STATE_RECOVERY_DELAY,
                o.state_recovery_delay_seconds.take(),
                Unit::Seconds,
                Duration::from_secs(30),
            )?
            .ensure(
                |&d| checks::is_whole_seconds(d, Duration::MAX),
                "must be a whole number of seconds, at least 1s",
            )?
            .value,
        collections,
    })
}
