//! The driver session and the few helpers every store module uses to run prepared statements.
//!
//! Routing: the default policy is token aware (a request goes straight to a replica of its
//! partition) and prefers the configured datacenter and rack, so `LOCAL_*` consistency stays in
//! one datacenter and a rack's replicas answer first. Timestamps are generated on the client by
//! one monotonic generator per session: successive writes of this client are ordered even when
//! different coordinators (with skewed clocks) handle them, which matters because a state apply
//! deletes and re-inserts rows and relies on last-write-wins. The same generator is shared with
//! the staged-commit path, which stamps a batch once and replays it with that timestamp.

use std::sync::Arc;

use futures::TryStreamExt;
use prosody_api::StorageError;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::deserialize::row::DeserializeRow;
use scylla::policies::load_balancing::DefaultPolicy;
use scylla::policies::timestamp_generator::{MonotonicTimestampGenerator, TimestampGenerator};
use scylla::response::query_result::QueryResult;
use scylla::serialize::batch::BatchValues;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::Batch;
use scylla::statement::prepared::PreparedStatement;

use crate::config::CassandraConfig;
use crate::errors::{CassandraError, decode_error, pager_error, query_error};

/// Client-side write timestamps, shared by the session and the staged-commit path.
#[derive(Debug)]
pub(crate) struct Timestamps(MonotonicTimestampGenerator);

impl Timestamps {
    /// The next timestamp: microseconds, strictly increasing within this process' session.
    pub(crate) fn next(&self) -> i64 {
        self.0.next_timestamp()
    }
}

impl TimestampGenerator for Timestamps {
    fn next_timestamp(&self) -> i64 {
        self.0.next_timestamp()
    }
}

/// A session bound to one keyspace, with the configuration it was opened with.
#[derive(Debug)]
pub(crate) struct Db {
    pub(crate) session: Session,
    pub(crate) keyspace: String,
    pub(crate) config: CassandraConfig,
    pub(crate) timestamps: Arc<Timestamps>,
}

impl Db {
    /// Opens a session to the configured nodes.
    pub(crate) async fn open(config: &CassandraConfig) -> Result<Self, CassandraError> {
        let mut policy = DefaultPolicy::builder().token_aware(true);
        policy = match (&config.datacenter, &config.rack) {
            (Some(datacenter), Some(rack)) => {
                policy.prefer_datacenter_and_rack(datacenter.clone(), rack.clone())
            }
            (Some(datacenter), None) => policy.prefer_datacenter(datacenter.clone()),
            _ => policy,
        };
        let profile = ExecutionProfile::builder()
            .consistency(config.consistency)
            .request_timeout(Some(config.request_timeout))
            .load_balancing_policy(policy.build())
            .build();
        let timestamps = Arc::new(Timestamps(MonotonicTimestampGenerator::new()));
        let mut builder = SessionBuilder::new()
            .known_nodes(&config.nodes)
            .default_execution_profile_handle(profile.into_handle())
            .timestamp_generator(Arc::clone(&timestamps) as Arc<dyn TimestampGenerator>)
            // The store needs no schema metadata; fetching it costs a round of queries per
            // connect and grows with the number of keyspaces on the cluster.
            .fetch_schema_metadata(false);
        if let Some((user, password)) = &config.credentials {
            builder = builder.user(user, password.expose());
        }
        let session = builder
            .build()
            .await
            .map_err(|source| CassandraError::Connect {
                nodes: config.nodes.join(","),
                source: Box::new(source),
            })?;
        Ok(Self {
            session,
            keyspace: config.keyspace.clone(),
            config: config.clone(),
            timestamps,
        })
    }

    /// Prepares `cql` (with `{ks}` replaced by the keyspace). Every statement this crate runs
    /// is idempotent by design (absolute writes), so the driver may retry any of them.
    pub(crate) async fn prepare(
        &self,
        operation: &'static str,
        table: &str,
        cql: &str,
    ) -> Result<PreparedStatement, StorageError> {
        let cql = cql.replace("{ks}", &self.keyspace);
        let mut prepared = self.session.prepare(cql.as_str()).await.map_err(|error| {
            StorageError::backend(
                operation,
                format!("cannot prepare `{cql}` on table `{table}`: {error}"),
            )
            .with_source(error)
        })?;
        prepared.set_is_idempotent(true);
        Ok(prepared)
    }

    /// Executes a prepared statement without paging.
    pub(crate) async fn execute(
        &self,
        operation: &'static str,
        table: &str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<QueryResult, StorageError> {
        self.session
            .execute_unpaged(statement, values)
            .await
            .map_err(|error| query_error(operation, table, error))
    }

    /// Executes a batch.
    pub(crate) async fn batch(
        &self,
        operation: &'static str,
        table: &str,
        batch: &Batch,
        values: impl BatchValues,
    ) -> Result<(), StorageError> {
        self.session
            .batch(batch, values)
            .await
            .map(drop)
            .map_err(|error| query_error(operation, table, error))
    }

    /// Executes a query whose result is small and bounded by the query itself (a `LIMIT`, a
    /// primary key), and decodes every row.
    pub(crate) async fn rows<R>(
        &self,
        operation: &'static str,
        table: &str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<Vec<R>, StorageError>
    where
        R: for<'frame, 'metadata> DeserializeRow<'frame, 'metadata>,
    {
        let result = self.execute(operation, table, statement, values).await?;
        let rows = result
            .into_rows_result()
            .map_err(|error| decode_error(operation, table, error))?;
        rows.rows::<R>()
            .map_err(|error| decode_error(operation, table, error))?
            .collect::<Result<Vec<R>, _>>()
            .map_err(|error| decode_error(operation, table, error))
    }

    /// Executes a query whose result may span pages and decodes every row.
    pub(crate) async fn all_rows<R>(
        &self,
        operation: &'static str,
        table: &str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<Vec<R>, StorageError>
    where
        R: for<'frame, 'metadata> DeserializeRow<'frame, 'metadata> + Send + 'static,
    {
        let pager = self
            .session
            .execute_iter(statement.clone(), values)
            .await
            .map_err(|error| pager_error(operation, table, error))?;
        pager
            .rows_stream::<R>()
            .map_err(|error| decode_error(operation, table, error))?
            .try_collect()
            .await
            .map_err(|error| {
                StorageError::backend(
                    operation,
                    format!("reading the pages of table `{table}` failed: {error}"),
                )
                .with_source(error)
            })
    }
}
