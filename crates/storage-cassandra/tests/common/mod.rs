//! Shared set-up of the integration tests: the local Cassandra's address and one session per
//! test.
//!
//! Every conformance case uses fresh consumer-group and subsystem names, so all cases share one
//! keyspace and run in parallel; each test (one Tokio runtime) opens one session and hands the
//! suite a handle per case with that case's manual clock.

#![allow(dead_code, clippy::missing_panics_doc, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prosody_api::{ManualClock, SlabSize};
use storage_cassandra::{CassandraConfig, CassandraStore};
use tokio::sync::OnceCell;

/// The keyspace every conformance test shares.
pub const CONFORMANCE_KEYSPACE: &str = "prosody_conformance";

/// The contact points from `PROSODY_CASSANDRA_NODES`; a test without them fails loudly rather
/// than passing without having run.
pub fn nodes() -> Vec<String> {
    let nodes = std::env::var("PROSODY_CASSANDRA_NODES").unwrap_or_default();
    assert!(
        !nodes.trim().is_empty(),
        "PROSODY_CASSANDRA_NODES is not set: these tests need the real Cassandra. Run \
         `scripts/services up` and export the variables it prints \
         (e.g. PROSODY_CASSANDRA_NODES=127.0.0.1:9042)."
    );
    nodes
        .split(',')
        .map(|node| node.trim().to_owned())
        .collect()
}

/// Settings for tests: a short retention so test data is reclaimed by Cassandra within a day.
pub fn config(keyspace: &str) -> CassandraConfig {
    CassandraConfig::new(nodes())
        .with_keyspace(keyspace)
        .with_retention(Duration::from_secs(24 * 3600))
}

/// A keyspace name no other test or run uses.
pub fn fresh_keyspace(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000
    )
}

/// One session per test, shared by the test's cases.
#[derive(Clone)]
pub struct Shared {
    config: CassandraConfig,
    store: Arc<OnceCell<CassandraStore>>,
}

impl Shared {
    /// Stores of the shared conformance keyspace with the default slab size.
    pub fn new() -> Self {
        Self::with_config(config(CONFORMANCE_KEYSPACE))
    }

    /// Stores of the shared conformance keyspace with `slab_size`.
    pub fn with_slab_size(slab_size: SlabSize) -> Self {
        Self::with_config(config(CONFORMANCE_KEYSPACE).with_slab_size(slab_size))
    }

    pub fn with_config(config: CassandraConfig) -> Self {
        Self {
            config,
            store: Arc::new(OnceCell::new()),
        }
    }

    /// A store judging expiry by `clock`.
    pub async fn store(&self, clock: ManualClock) -> CassandraStore {
        self.store
            .get_or_init(|| async {
                CassandraStore::connect(&self.config)
                    .await
                    .unwrap_or_else(|error| panic!("cannot connect to Cassandra: {error}"))
            })
            .await
            .with_clock(clock)
    }
}

/// Expands into a conformance factory over one [`Shared`] session.
#[macro_export]
macro_rules! factory {
    ($shared:expr) => {{
        let shared = $shared;
        move |clock| {
            let shared = shared.clone();
            async move { shared.store(clock).await }
        }
    }};
}
