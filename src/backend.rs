//! Backend selection: the stores every part of the pipeline uses, from the configured backend.
//!
//! [`Config`] has already chosen the backend (see `config::storage` for the rules and their
//! errors); this module opens it:
//!
//! | backend | timers, defer, dedup, published | keyed state |
//! |---|---|---|
//! | memory | memory stores: timers per client, dedup and defer one per process | memory |
//! | rocksdb | one [`RocksStore`] in `stateCacheDir` | the same store |
//! | cassandra | one [`CassandraStore`] session | [`CachedStateStore`] over Cassandra, the cache in `stateCacheDir` (a per-client temporary directory by default) |
//!
//! Every store is handed out as an `Arc<dyn ...>` trait object, so the pipeline and the
//! keyed-state runtime never name a backend. Dropping the [`Backend`] closes what it opened:
//! the `RocksDB` directory lock is released and a temporary cache directory is removed.

use std::sync::Arc;

use prosody_api::storage::{DedupStore, DeferStore, PublishedStateView, StateStore, TimerStore};
use prosody_api::{CoarseSystemClock, SlabSize, SystemClock};
use prosody_pipeline::consumer::Engine;
use storage_cassandra::{CassandraStore, Password};
use storage_memory::{MemoryDedupStore, MemoryDeferStore, MemoryStateStore, MemoryTimerStore};
use storage_rocksdb::{CachedStateStore, RocksOptions, RocksStore};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::{Config, StorageBackend};
use crate::error::ClientError;

/// Bytes of the keyed-state cache when `stateOwnedCacheSize` is not set.
const DEFAULT_OWNED_CACHE_BYTES: u64 = 256 * 1024 * 1024;

/// The stores of one client, opened from its configuration.
pub struct Backend {
    /// Which backend they come from.
    pub kind: StorageBackend,
    /// Durable timers.
    pub timers: Arc<dyn TimerStore>,
    /// Deferred messages and timers.
    pub defer: Arc<dyn DeferStore>,
    /// The durable tier of deduplication.
    pub dedup: Arc<dyn DedupStore>,
    /// Keyed state (cached in front of Cassandra).
    pub state: Arc<dyn StateStore>,
    /// Reads of published collections.
    pub published: Arc<dyn PublishedStateView>,
    /// The keyed-state cache, to invalidate when partitions are revoked.
    cache: Option<CachedStateStore>,
    /// The periodic sweep of Cassandra's staged state commits; aborted on drop.
    recovery: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("kind", &self.kind)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(recovery) = self.recovery.take() {
            recovery.abort();
        }
    }
}

impl Backend {
    /// Opens the configured backend. Cassandra is connected (and migrated) here, so an
    /// unreachable cluster fails the client's construction.
    ///
    /// # Errors
    /// [`ClientError::Storage`] naming the backend and what failed (a locked directory, an
    /// unreachable cluster, a changed migration).
    pub async fn open(config: &Config) -> Result<Self, ClientError> {
        let slab_size = slab_size(config);
        match config.storage.backend {
            StorageBackend::Memory => Ok(Self::memory(slab_size)),
            StorageBackend::RocksDb => Self::rocksdb(config, slab_size),
            StorageBackend::Cassandra => Self::cassandra(config, slab_size).await,
        }
    }

    fn memory(slab_size: SlabSize) -> Self {
        let state = Arc::new(MemoryStateStore::new(SystemClock));
        Self {
            kind: StorageBackend::Memory,
            timers: Arc::new(MemoryTimerStore::new(slab_size)),
            defer: process_defer_store(),
            dedup: process_dedup_store(),
            published: state.clone(),
            state,
            cache: None,
            recovery: None,
        }
    }

    fn rocksdb(config: &Config, slab_size: SlabSize) -> Result<Self, ClientError> {
        // The configuration requires the directory for this backend.
        let dir = config.storage.cache_dir.as_ref().ok_or_else(|| {
            ClientError::Storage("storageBackend \"rocksdb\" needs stateCacheDir".to_owned())
        })?;
        let store = RocksStore::open(dir, &RocksOptions::new().with_slab_size(slab_size))
            .map_err(|error| ClientError::Storage(format!("RocksDB backend: {error}")))?;
        info!(dir = %dir.display(), "storage: RocksDB");
        let store = Arc::new(store);
        Ok(Self {
            kind: StorageBackend::RocksDb,
            timers: store.clone(),
            defer: store.clone(),
            dedup: store.clone(),
            state: store.clone(),
            published: store,
            cache: None,
            recovery: None,
        })
    }

    async fn cassandra(config: &Config, slab_size: SlabSize) -> Result<Self, ClientError> {
        let settings = config.cassandra.as_ref().ok_or_else(|| {
            ClientError::Storage("storageBackend \"cassandra\" needs cassandraNodes".to_owned())
        })?;
        let mut driver = storage_cassandra::CassandraConfig::new(settings.nodes.clone())
            .with_keyspace(settings.keyspace.clone())
            .with_retention(settings.retention)
            .with_slab_size(slab_size);
        if let (Some(user), Some(password)) = (&settings.user, &settings.password) {
            driver = driver.with_credentials(user.clone(), Password::new(password.expose()));
        }
        if let Some(datacenter) = &settings.datacenter {
            driver = driver.with_location(datacenter.clone(), settings.rack.clone());
        }
        let store = CassandraStore::connect(&driver)
            .await
            .map_err(|error| ClientError::Storage(format!("Cassandra backend: {error}")))?;
        let capacity = config
            .storage
            .owned_cache_size_bytes
            .map_or(DEFAULT_OWNED_CACHE_BYTES, std::num::NonZeroU64::get);
        let cache = CachedStateStore::open(
            config.storage.cache_dir.as_deref(),
            Arc::new(store.clone()),
            capacity,
            Arc::new(SystemClock),
        )
        .map_err(|error| ClientError::Storage(format!("keyed-state cache: {error}")))?;
        info!(
            keyspace = store.keyspace(),
            cache = %cache.path().display(),
            "storage: Cassandra with a RocksDB keyed-state cache"
        );
        let recovery = tokio::spawn(sweep_staged_commits(
            store.clone(),
            config.storage.recovery_delay,
        ));
        let store = Arc::new(store);
        Ok(Self {
            kind: StorageBackend::Cassandra,
            timers: store.clone(),
            defer: store.clone(),
            dedup: store.clone(),
            state: Arc::new(cache.clone()),
            published: store,
            cache: Some(cache),
            recovery: Some(recovery),
        })
    }

    /// Makes `engine`'s revocations drop the keyed-state cache ([`Backend::partitions_revoked`]).
    /// The engine holds the backend weakly: it must not keep the stores open past shutdown.
    pub fn watch_revocations(backend: &Arc<Self>, engine: &Engine) {
        let backend = Arc::downgrade(backend);
        engine.on_revoked(Arc::new(move |_| {
            if let Some(backend) = backend.upgrade() {
                backend.partitions_revoked();
            }
        }));
    }

    /// Drops what this client cached for the keys it owned: called when partitions are
    /// revoked, since their next owner may change the data.
    pub fn partitions_revoked(&self) {
        if let Some(cache) = &self.cache
            && let Err(error) = cache.invalidate()
        {
            warn!(%error, "could not drop the keyed-state cache after a revocation");
        }
    }
}

/// Completes or drops staged state commits whose writer died: at start, then every
/// `stateRecoveryDelaySeconds`, for batches older than that delay.
async fn sweep_staged_commits(store: CassandraStore, delay: std::time::Duration) {
    let mut interval = tokio::time::interval(delay);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        match store.recover_staged_batches(delay).await {
            Ok(report) if report.replayed + report.dropped > 0 => {
                info!(?report, "staged state commits recovered");
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "staged state commit recovery failed; retried later"),
        }
    }
}

/// The configured slab size; the configuration keeps it a whole number of seconds >= 1.
fn slab_size(config: &Config) -> SlabSize {
    u32::try_from(config.timers.slab_size.as_secs())
        .ok()
        .and_then(SlabSize::from_secs)
        .unwrap_or_default()
}

/// The memory backend's dedup store: one per process, so dedup holds across the
/// subscriptions and clients of a process (records are scoped by group, topic and partition).
/// Its TTL (`idempotenceTtlS`) is whole seconds, so it reads the coarse clock: the store is
/// asked for the time on every handled message.
fn process_dedup_store() -> Arc<dyn DedupStore> {
    static MEMORY: std::sync::OnceLock<MemoryDedupStore> = std::sync::OnceLock::new();
    Arc::new(
        MEMORY
            .get_or_init(|| MemoryDedupStore::new(CoarseSystemClock))
            .clone(),
    )
}

/// The memory backend's defer store: one per process, so deferred work holds across the
/// subscriptions and clients of a process (scoped by group, topic and partition; a new owner
/// reschedules a missing retry timer) but not across restarts.
fn process_defer_store() -> Arc<dyn DeferStore> {
    static MEMORY: std::sync::OnceLock<MemoryDeferStore> = std::sync::OnceLock::new();
    Arc::new(MEMORY.get_or_init(MemoryDeferStore::new).clone())
}
