//! The high-level client: configuration in, a producer always, a consumer while subscribed.

use std::net::SocketAddr;
use std::sync::Arc;

use prosody_api::Payload;
use prosody_api::storage::{DeferStore, PublishedStateView, StateStore, TimerStore, Ttl};
use prosody_api::{ConsumerGroup, EventHandler, SystemClock};
use prosody_pipeline::consumer::poll_loop::{PollLoop, PollSettings, QueueFlowControl};
use prosody_pipeline::consumer::{Engine, EngineLimits, Load, TopicPartition};
use prosody_pipeline::dispatch::HandlerService;
use prosody_pipeline::kafka::decode::DecodeLimits;
use prosody_pipeline::kafka::loader::{LoaderSettings, MessageLoader};
use prosody_pipeline::kafka::mock::MockKafka;
use prosody_pipeline::kafka::producer::{Delivery, Producer, ProducerConfig, SendOptions};
use prosody_pipeline::middleware::dedup::DedupLayer;
use prosody_pipeline::middleware::defer::{
    DeferLayer, DeferSettings, DeferSnapshot, DeferStatus, NewFailures,
};
use prosody_pipeline::middleware::failure_policy::Destination;
use prosody_pipeline::middleware::monopolization::{
    MonopolizationLayer, MonopolizationSettings, MonopolizationStatus,
};
use prosody_pipeline::middleware::retry::RetryPolicy;
use prosody_pipeline::middleware::telemetry::TelemetryLayer;
use prosody_pipeline::middleware::{ModePolicy, StackDispatch, StackSettings};
use prosody_pipeline::monotonic;
use prosody_pipeline::probes::{HealthRegistry, ProbeConfig, ProbeServer};
use prosody_pipeline::scheduler::{FairScheduler, SchedulerSettings};
use prosody_pipeline::state::{Collection, CollectionDefinition, StateRuntime, definition};
use prosody_pipeline::telemetry::{self, TelemetrySink, TraceInjector};
use prosody_pipeline::timers::{QueueStats, TimerSettings, Timers};
use tokio::runtime::Handle;
use tokio::sync::{Mutex, OnceCell};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::backend::Backend;
use crate::config::{ClientOptions, Config, ConfigError, Mode, SpanRelation};
use crate::error::ClientError;

/// Partitions of each subscribed topic that mock mode creates in its in-process cluster.
const MOCK_PARTITIONS: i32 = 4;

/// Lifecycle events each worker queues for the telemetry topic between the sender thread's
/// turns (every 5 ms) before new ones are dropped.
const TELEMETRY_QUEUE: usize = 8_192;

/// Where the consumer is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsumerState {
    /// No topics are configured: the client can send but not subscribe.
    Unconfigured,
    /// Ready to subscribe.
    Configured,
    /// Subscribed and consuming.
    Running,
    /// Shut down: every operation fails.
    ShutDown,
}

enum Lifecycle {
    Idle,
    Subscribed(Subscription),
    ShutDown,
}

struct Subscription {
    poll: PollLoop,
    /// Stops the keyed-state recovery sweep.
    recovery: Option<CancellationToken>,
    probes: Option<ProbeServer>,
    telemetry: Option<TelemetrySink>,
}

struct Inner {
    config: Config,
    bootstrap_servers: String,
    producer: Producer,
    lifecycle: Mutex<Lifecycle>,
    engine: parking_lot::Mutex<Option<Engine>>,
    health: HealthRegistry,
    probe_address: parking_lot::Mutex<Option<SocketAddr>>,
    shutdown: OnceCell<()>,
    timer_store: Arc<dyn TimerStore>,
    /// Taken (and closed) at shutdown: a temporary state-cache directory is removed then.
    backend: parking_lot::RwLock<Option<Arc<Backend>>>,
    /// The defer and monopolization layers' state while subscribed in pipeline mode.
    quality: parking_lot::Mutex<Option<(Option<DeferStatus>, Option<MonopolizationStatus>)>>,
    /// Keyed-state collections, validated; registered durably at subscribe.
    collections: parking_lot::Mutex<Vec<CollectionDefinition>>,
    // Declared last so it is dropped after every client using it.
    _mock: Option<MockKafka>,
}

/// A Prosody client: sends messages, and consumes them through an [`EventHandler`] while
/// subscribed. Cheap to clone; clones share one client.
#[derive(Clone)]
pub struct ProsodyClient {
    inner: Arc<Inner>,
}

impl ProsodyClient {
    /// Resolves `options` (with environment fallback) and creates a client.
    ///
    /// # Errors
    /// A [`ClientError::Config`] naming the first invalid option, or a Kafka error.
    pub async fn from_options(options: ClientOptions) -> Result<Self, ClientError> {
        Self::new(Config::from_options(options)?).await
    }

    /// Creates a client from a resolved configuration. In mock mode it starts librdkafka's
    /// in-process mock cluster (any bootstrap servers are ignored).
    ///
    /// Every store (timers, deferred work, dedup, keyed state, published reads) comes from the
    /// configured storage backend (see [`crate::backend`]). With the memory backend (and in
    /// mock mode) they live in this process only: a restart loses every pending timer, and
    /// another client taking over a partition does not see them.
    ///
    /// # Errors
    /// When the storage backend cannot be opened, the producer cannot be created or the mock
    /// cluster cannot start.
    pub async fn new(config: Config) -> Result<Self, ClientError> {
        let backend = Backend::open(&config).await?;
        let timer_store = backend.timers.clone();
        Self::build(config, backend, timer_store)
    }

    /// Creates a client whose timers live in `timer_store` instead of the configured backend's.
    /// Clients given the same store share their timers as clients of one durable backend do,
    /// which lets a test move partitions (and their timers) between clients in one process.
    /// The store's slab size wins over the configured `slabSizeMs`.
    ///
    /// # Errors
    /// As for [`ProsodyClient::new`].
    pub async fn with_timer_store(
        config: Config,
        timer_store: Arc<dyn TimerStore>,
    ) -> Result<Self, ClientError> {
        let backend = Backend::open(&config).await?;
        Self::build(config, backend, timer_store)
    }

    /// Creates a client whose timers and keyed state live in the given stores instead of the
    /// configured backend's (a test or benchmark choosing its backend, clients sharing a store).
    ///
    /// # Errors
    /// As for [`ProsodyClient::new`].
    pub async fn with_stores(
        config: Config,
        timer_store: Arc<dyn TimerStore>,
        state_store: Arc<dyn StateStore>,
    ) -> Result<Self, ClientError> {
        let mut backend = Backend::open(&config).await?;
        backend.state = state_store;
        Self::build(config, backend, timer_store)
    }

    fn build(
        config: Config,
        backend: Backend,
        timer_store: Arc<dyn TimerStore>,
    ) -> Result<Self, ClientError> {
        let collections = configured_collections(&config)?;
        telemetry::init_tracing(&config.telemetry.log_filter);
        // Mock mode never needs a broker (FEATURES.md section 8, and the seed's Quick Start
        // sets bootstrapServers beside mock: true): the in-process cluster replaces any servers.
        let mock = if config.kafka.mock {
            if !config.kafka.bootstrap_servers.is_empty() {
                info!(ignored = ?config.kafka.bootstrap_servers,
                    "mock mode: using the in-process Kafka cluster, not bootstrapServers");
            }
            let mock = MockKafka::start(1).map_err(ClientError::kafka)?;
            // The in-process cluster starts empty and has no admin API: create the topics the
            // client subscribes to, so mock mode needs no setup (sending auto-creates others).
            for topic in &config.consumer.subscribed_topics {
                if !topic.starts_with('^') {
                    mock.create_topic(topic, MOCK_PARTITIONS)
                        .map_err(ClientError::kafka)?;
                }
            }
            Some(mock)
        } else {
            None
        };
        let bootstrap_servers = mock.as_ref().map_or_else(
            || config.kafka.bootstrap_servers.join(","),
            |mock| mock.bootstrap_servers().to_owned(),
        );
        let producer = Producer::new(&ProducerConfig {
            send_timeout: config.kafka.send_timeout,
            ..ProducerConfig::new(
                bootstrap_servers.clone(),
                config.kafka.source_system.clone(),
            )
        })?
        .with_injector(Arc::new(TraceInjector));
        info!(
            bootstrap_servers,
            group_id = config.kafka.group_id,
            "prosody client created"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                bootstrap_servers,
                producer,
                lifecycle: Mutex::new(Lifecycle::Idle),
                engine: parking_lot::Mutex::new(None),
                health: HealthRegistry::new(),
                probe_address: parking_lot::Mutex::new(None),
                shutdown: OnceCell::new(),
                timer_store,
                backend: parking_lot::RwLock::new(Some(Arc::new(backend))),
                quality: parking_lot::Mutex::new(None),
                collections: parking_lot::Mutex::new(collections),
                _mock: mock,
            }),
        })
    }

    /// The resolved configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The store that keeps this client's timers.
    #[must_use]
    pub fn timer_store(&self) -> &Arc<dyn TimerStore> {
        &self.inner.timer_store
    }

    /// The keyed-state store of the configured backend (cached in front of Cassandra); `None`
    /// after shutdown.
    #[must_use]
    pub fn state_store(&self) -> Option<Arc<dyn StateStore>> {
        self.backend().map(|backend| backend.state.clone())
    }

    /// Read access to published collections of the configured backend; `None` after
    /// shutdown.
    #[must_use]
    pub fn published_state(&self) -> Option<Arc<dyn PublishedStateView>> {
        self.backend().map(|backend| backend.published.clone())
    }

    /// The deferred-work store of the configured backend; `None` after shutdown.
    #[must_use]
    pub fn defer_store(&self) -> Option<Arc<dyn DeferStore>> {
        self.backend().map(|backend| backend.defer.clone())
    }

    fn backend(&self) -> Option<Arc<Backend>> {
        self.inner.backend.read().clone()
    }

    /// The bootstrap servers in use (the mock cluster's in mock mode).
    #[must_use]
    pub fn bootstrap_servers(&self) -> &str {
        &self.inner.bootstrap_servers
    }

    /// The `source-system` header value stamped on every sent message.
    #[must_use]
    pub fn source_system(&self) -> &str {
        &self.inner.config.kafka.source_system
    }

    /// Sends a JSON payload to `topic` under `key`.
    ///
    /// # Errors
    /// [`ClientError::ShutDown`] after shutdown, or the producer's error (timeout, unknown
    /// topic, ...).
    pub async fn send(
        &self,
        topic: &str,
        key: &str,
        payload: impl Into<Payload>,
    ) -> Result<Delivery, ClientError> {
        self.send_with(topic, key, payload, SendOptions::default())
            .await
    }

    /// [`send`](Self::send) with options (cancellation, trace context).
    ///
    /// # Errors
    /// As for [`send`](Self::send); [`ClientError::Producer`] with a cancellation when the
    /// options' token fires first.
    pub async fn send_with(
        &self,
        topic: &str,
        key: &str,
        payload: impl Into<Payload>,
        options: SendOptions,
    ) -> Result<Delivery, ClientError> {
        self.ensure_open()?;
        Ok(self
            .inner
            .producer
            .send_with(topic, key, payload, options)
            .await?)
    }

    /// Sends an excise record (the key with a null value) to `topic`: consumers route it to
    /// `on_excise`, which deletes every copy of the key's data.
    ///
    /// # Errors
    /// As for [`send`](Self::send).
    pub async fn excise(&self, topic: &str, key: &str) -> Result<Delivery, ClientError> {
        self.ensure_open()?;
        Ok(self.inner.producer.excise(topic, key).await?)
    }

    /// Registers keyed-state collections (in addition to `stateCollections`); handlers bind
    /// them with `context.state(&definition)`. Call it before [`subscribe`](Self::subscribe):
    /// identities are stored durably when subscribing.
    ///
    /// # Errors
    /// [`ClientError::Config`] naming the collection and field of an invalid definition (a
    /// duplicate name included), [`ClientError::AlreadySubscribed`] while subscribed.
    pub async fn define_collections<D: Into<CollectionDefinition>>(
        &self,
        definitions: impl IntoIterator<Item = D>,
    ) -> Result<(), ClientError> {
        let lifecycle = self.inner.lifecycle.lock().await;
        match *lifecycle {
            Lifecycle::ShutDown => return Err(ClientError::ShutDown),
            Lifecycle::Subscribed(_) => return Err(ClientError::AlreadySubscribed),
            Lifecycle::Idle => {}
        }
        let mut collections = self.inner.collections.lock();
        let mut all = collections.clone();
        all.extend(definitions.into_iter().map(Into::into));
        validate_collections(&all, &self.inner.config)?;
        *collections = all;
        Ok(())
    }

    /// Starts consuming the configured topics with `handler`.
    ///
    /// # Errors
    /// [`ClientError::AlreadySubscribed`], [`ClientError::NoTopics`], [`ClientError::ShutDown`],
    /// or a Kafka error from creating the consumer.
    pub async fn subscribe<H: EventHandler>(&self, handler: H) -> Result<(), ClientError> {
        let mut lifecycle = self.inner.lifecycle.lock().await;
        match *lifecycle {
            Lifecycle::ShutDown => return Err(ClientError::ShutDown),
            Lifecycle::Subscribed(_) => return Err(ClientError::AlreadySubscribed),
            Lifecycle::Idle => {}
        }
        let config = &self.inner.config;
        if config.consumer.subscribed_topics.is_empty() {
            return Err(ClientError::NoTopics);
        }
        // Present while not shut down, which the lifecycle lock held here guarantees.
        let backend = self.backend().ok_or(ClientError::ShutDown)?;
        let timers = Timers::new(
            self.inner.timer_store.clone(),
            config.kafka.group_id.clone(),
            Arc::new(SystemClock),
            TimerSettings {
                // A burst of due timers may occupy the key queues as much as records may.
                max_in_flight: config.consumer.max_uncommitted.get(),
                ..TimerSettings::default()
            },
        );
        let telemetry = self.telemetry_sink()?;
        let scheduler = Arc::new(fair_scheduler(config));
        let loader = SharedLoader::default();
        let mut stack =
            self.stack_settings(scheduler.clone(), telemetry.clone(), &timers, &backend);
        if stack.mode == ModePolicy::Pipeline {
            self.pipeline_layers(&mut stack, &timers, &backend, &loader)?;
        }
        let (service, state) = self
            .handler_service(handler, &timers, &backend, &loader)
            .await?;
        let sweep_timers = timers.clone();
        let dispatch = Arc::new(StackDispatch::new(stack, service));
        let flow = Arc::new(QueueFlowControl::default());
        let engine = Engine::with_admission(
            EngineLimits {
                max_concurrency: config.consumer.max_concurrency.get(),
                max_uncommitted: config.consumer.max_uncommitted.get(),
                shutdown_timeout: config.consumer.shutdown_timeout,
            },
            dispatch,
            scheduler,
            flow.clone(),
            self.inner.health.clone(),
            Handle::current(),
            Some(timers),
        );
        Backend::watch_revocations(&backend, &engine);
        let settings = PollSettings {
            bootstrap_servers: self.inner.bootstrap_servers.clone(),
            group_id: config.kafka.group_id.clone(),
            topics: config.consumer.subscribed_topics.clone(),
            commit_interval: config.consumer.commit_interval,
            poll_interval: config.consumer.poll_interval,
            decode: DecodeLimits::default(),
            overrides: Vec::new(),
        };
        let probes = ProbeServer::start(
            &ProbeConfig {
                port: config.probes.port,
                stall_threshold: config.consumer.stall_threshold,
                ..ProbeConfig::default()
            },
            self.inner.health.clone(),
        )
        .await
        .map_err(|error| ClientError::Probes(error.to_string()))?;
        let poll = match PollLoop::start(&settings, engine.clone(), &flow, Handle::current()) {
            Ok(poll) => poll,
            Err(error) => {
                if let Some(probes) = probes {
                    probes.stop().await;
                }
                return Err(ClientError::kafka(error));
            }
        };
        let recovery =
            state.map(|state| start_recovery(&state, sweep_timers, config.storage.recovery_delay));
        *self.inner.probe_address.lock() = probes.as_ref().map(ProbeServer::local_addr);
        *self.inner.engine.lock() = Some(engine);
        *lifecycle = Lifecycle::Subscribed(Subscription {
            poll,
            recovery,
            probes,
            telemetry,
        });
        info!(topics = ?config.consumer.subscribed_topics, "subscribed");
        Ok(())
    }

    /// Stops consuming: running handlers finish (or are cancelled near the shutdown timeout),
    /// offsets are committed, and the group is left. The client can subscribe again.
    ///
    /// # Errors
    /// [`ClientError::NotSubscribed`] or [`ClientError::ShutDown`].
    pub async fn unsubscribe(&self) -> Result<(), ClientError> {
        let mut lifecycle = self.inner.lifecycle.lock().await;
        match std::mem::replace(&mut *lifecycle, Lifecycle::Idle) {
            Lifecycle::Subscribed(subscription) => {
                self.stop(subscription).await;
                Ok(())
            }
            Lifecycle::Idle => Err(ClientError::NotSubscribed),
            Lifecycle::ShutDown => {
                *lifecycle = Lifecycle::ShutDown;
                Err(ClientError::ShutDown)
            }
        }
    }

    /// Shuts the client down: unsubscribes if subscribed and flushes the producer. Idempotent;
    /// concurrent calls wait for the one shutdown. Every later operation fails with
    /// [`ClientError::ShutDown`].
    ///
    /// # Errors
    /// None today; the signature leaves room for failures of later shutdown steps.
    pub async fn shutdown(&self) -> Result<(), ClientError> {
        self.inner
            .shutdown
            .get_or_init(|| async {
                let mut lifecycle = self.inner.lifecycle.lock().await;
                if let Lifecycle::Subscribed(subscription) =
                    std::mem::replace(&mut *lifecycle, Lifecycle::ShutDown)
                {
                    self.stop(subscription).await;
                }
                // Closes the stores this client opened (unless a caller still holds one): the
                // recovery sweep stops and a temporary state-cache directory is removed.
                drop(self.inner.backend.write().take());
                info!("prosody client shut down");
            })
            .await;
        Ok(())
    }

    /// Where the consumer is in its lifecycle.
    #[must_use]
    pub fn consumer_state(&self) -> ConsumerState {
        if self.inner.shutdown.initialized() {
            ConsumerState::ShutDown
        } else if self.inner.engine.lock().is_some() {
            ConsumerState::Running
        } else if self.inner.config.consumer.subscribed_topics.is_empty() {
            ConsumerState::Unconfigured
        } else {
            ConsumerState::Configured
        }
    }

    /// Partitions currently assigned to this client (0 when not subscribed).
    #[must_use]
    pub fn assigned_partition_count(&self) -> usize {
        self.inner.health.assigned_partition_count()
    }

    /// True when a partition with work made no progress for the stall threshold (what
    /// `/livez` reports).
    #[must_use]
    pub fn is_stalled(&self) -> bool {
        let health = &self.inner.health;
        health.is_stalled(self.inner.config.consumer.stall_threshold, health.now())
    }

    /// The address the probe server listens on while subscribed (`None` when disabled or not
    /// subscribed); with `probePort: 0` this tells which port was picked.
    #[must_use]
    pub fn probe_address(&self) -> Option<SocketAddr> {
        *self.inner.probe_address.lock()
    }

    /// The consumer's load right now (queued, running, held, paused partitions); `None` when
    /// not subscribed. For metrics and tests of backpressure.
    #[must_use]
    pub fn load(&self) -> Option<Load> {
        self.inner.engine.lock().as_ref().map(Engine::load)
    }

    /// The in-memory timers of each assigned partition (loaded, firing, last slab read); empty
    /// when not subscribed. For metrics, tests and the timer scale benchmark.
    #[must_use]
    pub fn timer_stats(&self) -> Vec<(TopicPartition, QueueStats)> {
        self.inner
            .engine
            .lock()
            .as_ref()
            .and_then(Engine::timers)
            .map(Timers::all_stats)
            .unwrap_or_default()
    }

    async fn stop(&self, subscription: Subscription) {
        let Subscription {
            poll,
            recovery,
            probes,
            telemetry,
        } = subscription;
        poll.stop().await;
        if let Some(recovery) = recovery {
            recovery.cancel();
        }
        if let Some(telemetry) = telemetry {
            telemetry.close(self.inner.config.kafka.send_timeout).await;
        }
        if let Some(probes) = probes {
            probes.stop().await;
        }
        *self.inner.engine.lock() = None;
        *self.inner.quality.lock() = None;
        *self.inner.probe_address.lock() = None;
        self.inner.health.clear();
        info!("unsubscribed");
    }

    /// The sink of lifecycle events when telemetry is enabled: a thread of its own with a
    /// best-effort producer (see `prosody_pipeline::telemetry::sink`).
    fn telemetry_sink(&self) -> Result<Option<TelemetrySink>, ClientError> {
        let config = &self.inner.config;
        if !config.telemetry.enabled {
            return Ok(None);
        }
        let producer = ProducerConfig::new(
            self.inner.bootstrap_servers.clone(),
            config.kafka.source_system.clone(),
        );
        TelemetrySink::start(&producer, config.telemetry.topic.clone(), TELEMETRY_QUEUE)
            .map(Some)
            .map_err(ClientError::kafka)
    }

    /// The middleware stack of a subscription, as the configuration asks (see
    /// `prosody_pipeline::middleware` for the layers and their order per mode).
    fn stack_settings(
        &self,
        scheduler: Arc<FairScheduler>,
        telemetry: Option<TelemetrySink>,
        timers: &Timers,
        backend: &Backend,
    ) -> StackSettings {
        let config = &self.inner.config;
        let retry = RetryPolicy {
            base: config.failure.retry.base,
            max_delay: config.failure.retry.max_delay,
        };
        let failures = config
            .failure
            .failure_topic
            .as_ref()
            .map_or(Destination::Log, |topic| Destination::FailureTopic {
                topic: topic.clone(),
                producer: self.inner.producer.clone(),
                retry,
            });
        let span_relation = |relation| match relation {
            SpanRelation::Child => telemetry::SpanRelation::Child,
            SpanRelation::FollowsFrom => telemetry::SpanRelation::FollowsFrom,
        };
        StackSettings {
            mode: match config.failure.mode {
                Mode::Pipeline => ModePolicy::Pipeline,
                Mode::LowLatency => ModePolicy::LowLatency {
                    max_retries: config.failure.retry.max_retries,
                },
                Mode::BestEffort => ModePolicy::BestEffort,
            },
            group_id: config.kafka.group_id.clone(),
            allowed_events: config.consumer.allowed_events.clone(),
            failures,
            timers: Some(timers.clone()),
            retry,
            dedup: DedupLayer {
                store: backend.dedup.clone(),
                cache_size: config.dedup.cache_size.get() as u64,
                group_id: config.kafka.group_id.clone(),
                version: config.dedup.version.clone(),
                ttl: dedup_ttl(config.dedup.ttl),
            },
            defer: None,
            monopolization: None,
            admission: scheduler,
            timeout: config.consumer.timeout,
            shutdown_timeout: config.consumer.shutdown_timeout,
            telemetry: TelemetryLayer {
                sink: telemetry,
                group_id: ConsumerGroup::from(config.kafka.group_id.as_str()),
                message_spans: span_relation(config.telemetry.message_spans),
                timer_spans: span_relation(config.telemetry.timer_spans),
            },
        }
    }

    /// Adds the pipeline mode's defer layer and (when enabled) monopolization layer to `stack`.
    fn pipeline_layers(
        &self,
        stack: &mut StackSettings,
        timers: &Timers,
        backend: &Backend,
        loader: &SharedLoader,
    ) -> Result<(), ClientError> {
        let config = &self.inner.config;
        // The layer is there even with deferEnabled off: work deferred by an earlier run still
        // has to be retried (and later records of its key queue behind it), or it is lost.
        let settings = DeferSettings {
            new_failures: if config.defer.enabled {
                NewFailures::Defer
            } else {
                NewFailures::RetryInPlace
            },
            base: config.defer.base,
            max_delay: config.defer.max_delay,
            failure_threshold: config.defer.failure_threshold,
            failure_window: config.defer.failure_window,
            min_samples: DEFER_MIN_SAMPLES,
            cache_size: config.defer.store_cache_size.get() as u64,
        };
        let status = DeferStatus::new(&settings);
        let defer_status = Some(status.clone());
        stack.defer = Some(DeferLayer {
            settings,
            store: backend.defer.clone(),
            timers: timers.clone(),
            loader: self.message_loader(loader)?,
            status,
            give_up: stack.failures.clone(),
        });
        let mut monopolization_status = None;
        if config.monopolization.enabled {
            let status = MonopolizationStatus::default();
            monopolization_status = Some(status.clone());
            stack.monopolization = Some(MonopolizationLayer {
                settings: MonopolizationSettings {
                    threshold: config.monopolization.threshold,
                    window: config.monopolization.window,
                    cache_size: config.monopolization.cache_size.get() as u64,
                },
                status,
                // The fair scheduler's clock: run time starts at its grant.
                clock: Arc::new(monotonic::SystemClock),
            });
        }
        *self.inner.quality.lock() = Some((defer_status, monopolization_status));
        Ok(())
    }

    /// The defer layer's state (is deferral on, the failure rate, counters) while subscribed
    /// in pipeline mode (with `deferEnabled` off, `deferring` is false and the counters show
    /// the stored work still being retried); `None` otherwise.
    #[must_use]
    pub fn defer_status(&self) -> Option<DeferSnapshot> {
        self.inner
            .quality
            .lock()
            .as_ref()
            .and_then(|(defer, _)| defer.as_ref().map(DeferStatus::snapshot))
    }

    /// Events the monopolization layer rejected so far in this subscription; `None` when it is
    /// not in the stack.
    #[must_use]
    pub fn monopolization_rejections(&self) -> Option<u64> {
        self.inner
            .quality
            .lock()
            .as_ref()
            .and_then(|(_, monopolization)| {
                monopolization.as_ref().map(MonopolizationStatus::rejected)
            })
    }

    /// Sends the lifecycle events queued so far to the telemetry topic and exports the spans
    /// buffered so far.
    pub async fn flush_telemetry(&self) {
        let sink = match &*self.inner.lifecycle.lock().await {
            Lifecycle::Subscribed(subscription) => subscription.telemetry.clone(),
            Lifecycle::Idle | Lifecycle::ShutDown => None,
        };
        if let Some(sink) = sink {
            sink.flush().await;
        }
        tokio::task::spawn_blocking(telemetry::flush_tracing)
            .await
            .ok();
    }

    /// The bottom of the stack: the handler with timers and (with collections) keyed state.
    async fn handler_service<H: EventHandler>(
        &self,
        handler: H,
        timers: &Timers,
        backend: &Backend,
        loader: &SharedLoader,
    ) -> Result<(HandlerService<H>, Option<StateRuntime>), ClientError> {
        let mut service = HandlerService::new(Arc::new(handler)).with_timers(timers.clone());
        let state = self.state_runtime(backend, loader).await?;
        if let Some(state) = &state {
            service = service.with_state(state.clone());
        }
        Ok((service, state))
    }

    /// The keyed-state runtime of a subscription (`None` without collections), after storing
    /// the collections' identities durably.
    async fn state_runtime(
        &self,
        backend: &Backend,
        loader: &SharedLoader,
    ) -> Result<Option<StateRuntime>, ClientError> {
        let config = &self.inner.config;
        let definitions = self.inner.collections.lock().clone();
        if definitions.is_empty() {
            return Ok(None);
        }
        let collections = validate_collections(&definitions, config)?;
        let loader = self.message_loader(loader)?;
        let runtime = StateRuntime::new(
            backend.state.clone(),
            config.kafka.group_id.clone(),
            collections,
        )
        .with_loader(loader)
        .with_subsystem(config.kafka.subsystem.clone().map(Into::into));
        runtime.register().await?;
        Ok(Some(runtime))
    }

    /// The subscription's one Kafka record loader (deferred messages and message collections),
    /// started by whichever needs it first.
    fn message_loader(&self, shared: &SharedLoader) -> Result<Arc<MessageLoader>, ClientError> {
        if let Some(loader) = shared.get() {
            return Ok(loader.clone());
        }
        let settings = &self.inner.config.defer.loader;
        let loader = MessageLoader::new(LoaderSettings {
            bootstrap_servers: self.inner.bootstrap_servers.clone(),
            client_id: self.inner.config.kafka.group_id.clone(),
            cache_size: settings.cache_size.get() as u64,
            seek_timeout: settings.seek_timeout,
            discard_threshold: settings.discard_threshold,
            decode: DecodeLimits::default(),
            overrides: Vec::new(),
        })
        .map_err(ClientError::kafka)?;
        Ok(shared.get_or_init(|| Arc::new(loader)).clone())
    }

    fn ensure_open(&self) -> Result<(), ClientError> {
        if self.inner.shutdown.initialized() {
            Err(ClientError::ShutDown)
        } else {
            Ok(())
        }
    }
}

/// Outcomes the failure-rate window must hold before it can switch deferral off.
const DEFER_MIN_SAMPLES: u64 = 20;

/// `idempotenceTtlS` as a store TTL; the configuration keeps it within 1 s ..= 20 years.
/// The admission every handler of a subscription runs under.
fn fair_scheduler(config: &Config) -> FairScheduler {
    FairScheduler::new(SchedulerSettings {
        max_concurrency: config.consumer.max_concurrency.get(),
        failure_weight: config.scheduler.failure_weight,
        max_wait: config.scheduler.max_wait,
        wait_weight: config.scheduler.wait_weight,
        cache_size: config.scheduler.cache_size.get() as u64,
    })
}

/// A subscription's record loader, started on first use.
type SharedLoader = std::sync::OnceLock<Arc<MessageLoader>>;

fn dedup_ttl(ttl: std::time::Duration) -> Ttl {
    let secs = u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX).max(1);
    Ttl::from_secs(secs).unwrap_or(Ttl::new(std::num::NonZeroU32::MIN))
}
/// Starts the keyed-state recovery sweep; cancel the token to stop it.
fn start_recovery(
    state: &StateRuntime,
    timers: Timers,
    delay: std::time::Duration,
) -> CancellationToken {
    let cancel = CancellationToken::new();
    // Detached: it stops at the token, and every step of a sweep is idempotent.
    drop(state.spawn_recovery(timers, delay, cancel.clone(), &Handle::current()));
    cancel
}

/// `stateCollections` as definitions, validated.
fn configured_collections(config: &Config) -> Result<Vec<CollectionDefinition>, ClientError> {
    let definitions = config
        .storage
        .collections
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            serde_json::from_value(raw.clone()).map_err(|error| ConfigError::Options {
                path: format!("stateCollections[{index}]"),
                message: error.to_string(),
            })
        })
        .collect::<Result<Vec<CollectionDefinition>, _>>()?;
    validate_collections(&definitions, config)?;
    Ok(definitions)
}

fn validate_collections(
    definitions: &[CollectionDefinition],
    config: &Config,
) -> Result<Vec<Collection>, ClientError> {
    definition::validate_all(definitions, config.storage.recovery_delay).map_err(|error| {
        ClientError::Config(ConfigError::Options {
            path: format!("stateCollections[{}].{}", error.collection, error.field),
            message: error.expected,
        })
    })
}
