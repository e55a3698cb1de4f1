//! Every Prosody storage trait on Apache Cassandra, through the `scylla` driver.
//!
//! [`CassandraStore`] implements [`TimerStore`], [`DeferStore`], [`DedupStore`], [`StateStore`]
//! and [`PublishedStateView`] over one session; the pipeline holds it as `Arc<dyn ...>` per
//! trait. It is for deployments with several consumer processes or machines: every client of a
//! consumer group sees the same timers, deferred work, dedup records and keyed state.
//!
//! ```no_run
//! # async fn example() -> Result<(), storage_cassandra::CassandraError> {
//! use storage_cassandra::{CassandraConfig, CassandraStore};
//!
//! let store = CassandraStore::connect(&CassandraConfig::new(["127.0.0.1:9042"])).await?;
//! # let _ = store;
//! # Ok(())
//! # }
//! ```
//!
//! # Modules, one concern each
//!
//! | module | concern |
//! |---|---|
//! | [`config`] | settings and their validation |
//! | `session` | the driver session: routing, consistency, timestamps, statement helpers |
//! | [`migrations`] | embedded versioned CQL, applied once per keyspace under a lock |
//! | `errors` | driver errors classified as transient or permanent |
//! | `ttl` | logical expiry (store clock) versus native TTL (space reclamation) |
//! | `timer`, `defer`, `dedup` | one trait each |
//! | `state` | keyed state: reads, planning, atomic apply, staged-commit recovery |
//! | `published` | the read-only view of published collections |
//!
//! # Guarantees
//!
//! - Prepared statements only (DDL aside), `LOCAL_QUORUM` by default, token-aware routing that
//!   prefers the configured datacenter and rack.
//! - Expiry is judged by the store's [`Clock`]; Cassandra's native TTL reclaims space later and
//!   never earlier (capped by the retention).
//! - [`StateStore::apply`] is all or nothing, also for megabyte batches: each cell is one
//!   partition, so a one-cell batch is one isolated mutation (not subject to
//!   `batch_size_fail_threshold`); several cells go in one logged batch, or, beyond
//!   [`CassandraConfig::logged_batch_limit_bytes`], through a staged commit (provisional intent
//!   parts, then one small commit-marker write, then the cells, all with one write timestamp;
//!   [`CassandraStore::recover_staged_batches`] completes a commit whose writer died). No
//!   Cassandra setting needs raising.
//! - Errors name the table and operation and are classified: timeouts, unavailable replicas
//!   and lost connections are transient; schema and encoding errors are permanent.
//!
//! The whole `prosody-api` conformance suite runs against a real Cassandra in this crate's
//! `tests/` (run `scripts/services up` first and export what it prints).
//!
//! [`TimerStore`]: prosody_api::storage::TimerStore
//! [`DeferStore`]: prosody_api::storage::DeferStore
//! [`DedupStore`]: prosody_api::storage::DedupStore
//! [`StateStore`]: prosody_api::storage::StateStore
//! [`StateStore::apply`]: prosody_api::storage::StateStore::apply
//! [`PublishedStateView`]: prosody_api::storage::PublishedStateView

pub mod config;
mod dedup;
mod defer;
mod errors;
pub mod migrations;
mod published;
mod session;
mod state;
mod timer;
mod ttl;

use std::fmt;
use std::sync::Arc;

use prosody_api::{Clock, SystemClock};

pub use config::{CassandraConfig, Consistency, Password, Replication};
pub use errors::CassandraError;
pub use state::RecoveryReport;

/// What every handle of one connection shares.
struct Shared {
    db: session::Db,
    timers: timer::Statements,
    defer: defer::Statements,
    dedup: dedup::Statements,
    state: state::Statements,
    ttl: ttl::TtlPolicy,
    applied_migrations: Vec<u32>,
}

/// A connection to a Cassandra keyspace implementing every storage trait.
///
/// Cheap to clone (clones share the session). [`CassandraStore::with_clock`] gives a handle
/// over the same session that judges expiry by another clock (tests use a manual one).
#[derive(Clone)]
pub struct CassandraStore {
    shared: Arc<Shared>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for CassandraStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CassandraStore")
            .field("keyspace", &self.shared.db.keyspace)
            .field("nodes", &self.shared.db.config.nodes)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl CassandraStore {
    /// Connects, creates the keyspace if absent, applies pending migrations (once across
    /// concurrently starting clients) and prepares every statement. Expiry is judged by the
    /// system clock.
    ///
    /// The session's background tasks run on the current Tokio runtime.
    ///
    /// # Errors
    /// [`CassandraError`]: an invalid setting, an unreachable cluster, a changed applied
    /// migration, or a migration lock held too long.
    pub async fn connect(config: &CassandraConfig) -> Result<Self, CassandraError> {
        Self::connect_with_clock(config, SystemClock).await
    }

    /// [`CassandraStore::connect`] with the clock that judges expiry.
    ///
    /// # Errors
    /// As [`CassandraStore::connect`].
    pub async fn connect_with_clock(
        config: &CassandraConfig,
        clock: impl Clock + 'static,
    ) -> Result<Self, CassandraError> {
        // Boxed: start-up is a long chain of awaits whose state would otherwise be inlined
        // into every caller's future.
        Box::pin(Self::open(config, Arc::new(clock))).await
    }

    async fn open(config: &CassandraConfig, clock: Arc<dyn Clock>) -> Result<Self, CassandraError> {
        config.validate()?;
        let db = session::Db::open(config).await?;
        let applied_migrations = migrations::migrate(&db).await?;
        let (timers, defer, dedup, state) = futures::try_join!(
            timer::Statements::prepare(&db),
            defer::Statements::prepare(&db),
            dedup::Statements::prepare(&db),
            state::Statements::prepare(&db),
        )?;
        let ttl = ttl::TtlPolicy::new(config.retention, config.ttl_margin);
        Ok(Self {
            shared: Arc::new(Shared {
                db,
                timers,
                defer,
                dedup,
                state,
                ttl,
                applied_migrations,
            }),
            clock,
        })
    }

    /// A handle over the same session judging expiry by `clock`.
    #[must_use]
    pub fn with_clock(&self, clock: impl Clock + 'static) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            clock: Arc::new(clock),
        }
    }

    /// The keyspace this store uses.
    #[must_use]
    pub fn keyspace(&self) -> &str {
        &self.shared.db.keyspace
    }

    /// The migration versions this store applied when it connected; empty when the keyspace
    /// was already up to date (another client applied them).
    #[must_use]
    pub fn applied_migrations(&self) -> &[u32] {
        &self.shared.applied_migrations
    }
}
