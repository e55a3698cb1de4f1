//! Connection and behaviour settings of the Cassandra backend.
//!
//! The facade maps the spec's `cassandra*` options onto [`CassandraConfig`]; everything else has
//! a default chosen for a production cluster and can be tightened for tests. Validation happens
//! in [`CassandraConfig::validate`] (called by `connect`), so a bad value fails at start-up and
//! names the field.

use std::fmt;
use std::time::Duration;

use prosody_api::SlabSize;
pub use scylla::statement::Consistency;

use crate::errors::CassandraError;

/// Cassandra rejects TTLs above 20 years; every TTL this crate writes is capped by it.
pub const MAX_TTL: Duration = Duration::from_secs(630_720_000);

/// How the keyspace is replicated when this crate creates it. An existing keyspace is used as
/// it is: replication is an operator's decision once data exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replication {
    /// `SimpleStrategy` with this replication factor (single datacenter, local development).
    Simple(u8),
    /// `NetworkTopologyStrategy` with a factor per datacenter.
    NetworkTopology(Vec<(String, u8)>),
}

impl Replication {
    /// The CQL replication map. Datacenter names are validated as identifiers-with-dashes
    /// before they reach here, because they are interpolated into DDL.
    pub(crate) fn to_cql(&self) -> String {
        match self {
            Self::Simple(factor) => {
                format!("{{'class': 'SimpleStrategy', 'replication_factor': {factor}}}")
            }
            Self::NetworkTopology(factors) => {
                let factors: Vec<String> = factors
                    .iter()
                    .map(|(datacenter, factor)| format!(", '{datacenter}': {factor}"))
                    .collect();
                format!("{{'class': 'NetworkTopologyStrategy'{}}}", factors.concat())
            }
        }
    }
}

/// A password that never shows up in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Self(password.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

/// Settings of a [`crate::CassandraStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CassandraConfig {
    /// Contact points, `host:port` (`cassandraNodes`). At least one.
    pub nodes: Vec<String>,
    /// Keyspace (`cassandraKeyspace`, default `prosody`): 1 to 48 letters, digits or
    /// underscores, starting with a letter. Created if absent.
    pub keyspace: String,
    /// User and password (`cassandraUser`/`cassandraPassword`), both or neither.
    pub credentials: Option<(String, Password)>,
    /// Preferred datacenter (`cassandraDatacenter`): its nodes are "local" for routing and for
    /// `LOCAL_*` consistency levels.
    pub datacenter: Option<String>,
    /// Preferred rack within the datacenter (`cassandraRack`).
    pub rack: Option<String>,
    /// Upper bound of every TTL this crate writes (`cassandraRetentionSeconds`, default one
    /// year): data not rewritten for this long is reclaimed by Cassandra.
    pub retention: Duration,
    /// Consistency of reads and writes (default `LOCAL_QUORUM`).
    pub consistency: Consistency,
    /// Replication of a keyspace this crate creates (default `SimpleStrategy` 1).
    pub replication: Replication,
    /// Width of timer slabs (`slabSizeMs`, default one hour). Fixed for a keyspace's data: a
    /// store reading with another size than was written with misses timers.
    pub slab_size: SlabSize,
    /// Added to a logical TTL to get Cassandra's native TTL, so clock skew between clients and
    /// nodes never lets Cassandra drop an entry the store's clock still considers live
    /// (default one hour). Expiry itself is judged on the store's clock, not by Cassandra.
    pub ttl_margin: Duration,
    /// Client-side timeout of one request (default 12 s, above Cassandra's server timeouts so
    /// the server's classified error arrives first).
    pub request_timeout: Duration,
    /// Multi-partition state batches whose encoded size exceeds this go through the staged
    /// commit path instead of one logged batch (default 40 KiB, below Cassandra's default
    /// `batch_size_fail_threshold` of 50 KiB).
    pub logged_batch_limit_bytes: usize,
    /// How long a start-up waits for another client's migration lock (default 2 min).
    pub migration_lock_wait: Duration,
    /// TTL of the migration lock row, so a crashed holder blocks others only this long
    /// (default 60 s).
    pub migration_lock_ttl: Duration,
}

impl CassandraConfig {
    /// Defaults for everything but the contact points.
    pub fn new(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            nodes: nodes.into_iter().map(Into::into).collect(),
            keyspace: "prosody".to_owned(),
            credentials: None,
            datacenter: None,
            rack: None,
            retention: Duration::from_secs(365 * 24 * 3600),
            consistency: Consistency::LocalQuorum,
            replication: Replication::Simple(1),
            slab_size: SlabSize::DEFAULT,
            ttl_margin: Duration::from_secs(3600),
            request_timeout: Duration::from_secs(12),
            logged_batch_limit_bytes: 40 * 1024,
            migration_lock_wait: Duration::from_secs(120),
            migration_lock_ttl: Duration::from_secs(60),
        }
    }

    /// Sets [`CassandraConfig::keyspace`].
    #[must_use]
    pub fn with_keyspace(mut self, keyspace: impl Into<String>) -> Self {
        self.keyspace = keyspace.into();
        self
    }

    /// Sets [`CassandraConfig::credentials`].
    #[must_use]
    pub fn with_credentials(mut self, user: impl Into<String>, password: Password) -> Self {
        self.credentials = Some((user.into(), password));
        self
    }

    /// Sets [`CassandraConfig::datacenter`] and [`CassandraConfig::rack`].
    #[must_use]
    pub fn with_location(mut self, datacenter: impl Into<String>, rack: Option<String>) -> Self {
        self.datacenter = Some(datacenter.into());
        self.rack = rack;
        self
    }

    /// Sets [`CassandraConfig::retention`].
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Sets [`CassandraConfig::consistency`].
    #[must_use]
    pub fn with_consistency(mut self, consistency: Consistency) -> Self {
        self.consistency = consistency;
        self
    }

    /// Sets [`CassandraConfig::replication`].
    #[must_use]
    pub fn with_replication(mut self, replication: Replication) -> Self {
        self.replication = replication;
        self
    }

    /// Sets [`CassandraConfig::slab_size`].
    #[must_use]
    pub fn with_slab_size(mut self, slab_size: SlabSize) -> Self {
        self.slab_size = slab_size;
        self
    }

    /// Sets [`CassandraConfig::ttl_margin`].
    #[must_use]
    pub fn with_ttl_margin(mut self, margin: Duration) -> Self {
        self.ttl_margin = margin;
        self
    }

    /// Sets [`CassandraConfig::logged_batch_limit_bytes`].
    #[must_use]
    pub fn with_logged_batch_limit_bytes(mut self, bytes: usize) -> Self {
        self.logged_batch_limit_bytes = bytes;
        self
    }

    /// Checks every field; the error names the field and what it accepts.
    ///
    /// # Errors
    /// [`CassandraError::Config`] for the first invalid field.
    pub fn validate(&self) -> Result<(), CassandraError> {
        let fail =
            |field: &'static str, reason: String| Err(CassandraError::Config { field, reason });
        if self.nodes.is_empty() || self.nodes.iter().any(|node| node.trim().is_empty()) {
            return fail(
                "nodes",
                "needs at least one non-empty `host:port`".to_owned(),
            );
        }
        if !is_identifier(&self.keyspace) {
            return fail(
                "keyspace",
                format!(
                    "`{}` is not 1 to 48 letters, digits or underscores starting with a letter",
                    self.keyspace
                ),
            );
        }
        if self.rack.is_some() && self.datacenter.is_none() {
            return fail(
                "rack",
                "a rack preference needs a datacenter preference".to_owned(),
            );
        }
        if self.retention < Duration::from_secs(1) || self.retention > MAX_TTL {
            return fail(
                "retention",
                format!(
                    "{:?} is outside 1 s ..= {} s (Cassandra's largest TTL)",
                    self.retention,
                    MAX_TTL.as_secs()
                ),
            );
        }
        if let Replication::Simple(0) = self.replication {
            return fail(
                "replication",
                "a replication factor must be >= 1".to_owned(),
            );
        }
        if let Replication::NetworkTopology(factors) = &self.replication {
            let bad = factors.is_empty()
                || factors.iter().any(|(datacenter, factor)| {
                    *factor == 0
                        || datacenter.is_empty()
                        || !datacenter
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                });
            if bad {
                return fail(
                    "replication",
                    "needs at least one datacenter (letters, digits, `_`, `-`) with a factor >= 1"
                        .to_owned(),
                );
            }
        }
        if self.slab_size.as_secs() > 7 * 24 * 3600 {
            return fail(
                "slab_size",
                "slabs wider than a week make a slab partition unbounded in practice".to_owned(),
            );
        }
        if self.migration_lock_ttl < Duration::from_secs(1) {
            return fail("migration_lock_ttl", "must be at least 1 s".to_owned());
        }
        Ok(())
    }
}

/// A name Cassandra accepts unquoted and that is safe to interpolate into DDL.
pub(crate) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic())
        && name.len() <= 48
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(config: &CassandraConfig) -> Option<&'static str> {
        match config.validate() {
            Err(CassandraError::Config { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(field_of(&CassandraConfig::new(["127.0.0.1:9042"])), None);
    }

    #[test]
    fn invalid_fields_are_named() {
        let base = CassandraConfig::new(["127.0.0.1:9042"]);
        let cases = [
            (CassandraConfig::new(Vec::<String>::new()), "nodes"),
            (base.clone().with_keyspace("1abc"), "keyspace"),
            (base.clone().with_keyspace("a; DROP"), "keyspace"),
            (base.clone().with_keyspace("a".repeat(49)), "keyspace"),
            (
                CassandraConfig {
                    rack: Some("r".into()),
                    ..base.clone()
                },
                "rack",
            ),
            (base.clone().with_retention(Duration::ZERO), "retention"),
            (
                base.clone()
                    .with_retention(MAX_TTL + Duration::from_secs(1)),
                "retention",
            ),
            (
                base.clone().with_replication(Replication::Simple(0)),
                "replication",
            ),
            (
                base.clone()
                    .with_replication(Replication::NetworkTopology(vec![("dc'1".into(), 3)])),
                "replication",
            ),
        ];
        for (config, field) in cases {
            assert_eq!(field_of(&config), Some(field), "{config:?}");
        }
    }

    #[test]
    fn replication_renders_cql_maps() {
        assert_eq!(
            Replication::Simple(1).to_cql(),
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        );
        assert_eq!(
            Replication::NetworkTopology(vec![("dc1".into(), 3), ("dc-2".into(), 2)]).to_cql(),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc-2': 2}"
        );
    }

    #[test]
    fn passwords_do_not_leak_through_debug() {
        let config = CassandraConfig::new(["n:1"]).with_credentials("u", Password::new("hunter2"));
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
