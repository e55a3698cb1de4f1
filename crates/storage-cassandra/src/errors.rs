//! Error classification: driver failures become [`StorageError`]s with a class, and start-up
//! failures become [`CassandraError`]s.
//!
//! The rule: if the same request can succeed later without anyone changing code or schema, the
//! failure is transient (timeouts, unavailable replicas, overload, a broken connection, a node
//! still bootstrapping); if it cannot (invalid CQL, a missing table, a value the driver cannot
//! encode, an unauthorized user), it is permanent, so the pipeline routes the event to its
//! failure policy instead of retrying forever. Data that cannot be decoded is `Corrupt`.
//! Every message names the table and the storage operation, so an operator can find the
//! statement without a debugger.

use std::error::Error as StdError;

use prosody_api::{ClassifyError, ErrorClass, StorageError, StorageErrorKind};
use scylla::errors::{
    DbError, ExecutionError, NewSessionError, PagerExecutionError, RequestAttemptError,
};

/// A failure to start: bad settings, an unreachable cluster, or a schema that cannot be
/// brought up to date.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CassandraError {
    /// A setting is invalid.
    #[error("invalid Cassandra setting `{field}`: {reason}")]
    Config {
        /// The field of [`crate::CassandraConfig`].
        field: &'static str,
        /// What it accepts.
        reason: String,
    },
    /// No session could be opened.
    #[error("cannot connect to Cassandra at {nodes}: {source}")]
    Connect {
        /// The contact points tried.
        nodes: String,
        /// The driver's error.
        #[source]
        source: Box<NewSessionError>,
    },
    /// An applied migration differs from the file embedded in this build.
    #[error(
        "migration {version} ({name}) was applied to keyspace `{keyspace}` with checksum \
         {recorded}, but this build embeds checksum {embedded}: applied migrations must never \
         change; revert the file and add a new migration instead"
    )]
    ChangedMigration {
        /// The keyspace.
        keyspace: String,
        /// The migration's version.
        version: u32,
        /// The migration's name.
        name: &'static str,
        /// The checksum recorded when it was applied.
        recorded: String,
        /// The checksum of the embedded file.
        embedded: String,
    },
    /// Another client held the migration lock for too long.
    #[error(
        "waited {waited_secs} s for the migration lock of keyspace `{keyspace}` (held by \
         {holder}); it expires on its own if that client crashed"
    )]
    LockTimeout {
        /// The keyspace.
        keyspace: String,
        /// Who held the lock at the last check.
        holder: String,
        /// How long this client waited.
        waited_secs: u64,
    },
    /// A start-up statement failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl ClassifyError for CassandraError {
    fn error_class(&self) -> ErrorClass {
        match self {
            Self::Config { .. } | Self::ChangedMigration { .. } => ErrorClass::Permanent,
            Self::Connect { .. } | Self::LockTimeout { .. } => ErrorClass::Transient,
            Self::Storage(error) => error.error_class(),
        }
    }
}

/// The class of a database error reported by a node.
///
/// Transient: unavailable replicas, overload, a bootstrapping node, read/write timeouts and
/// failures, truncate errors, rate limits, an unprepared statement (the driver re-prepares),
/// server errors, and any error this build does not know (`DbError` is non-exhaustive, and
/// dropping an event must be a deliberate decision).
fn db_error_class(error: &DbError) -> ErrorClass {
    match error {
        DbError::SyntaxError
        | DbError::Invalid
        | DbError::AlreadyExists { .. }
        | DbError::FunctionFailure { .. }
        | DbError::AuthenticationError
        | DbError::Unauthorized
        | DbError::ConfigError
        | DbError::ProtocolError => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

fn attempt_error_class(error: &RequestAttemptError) -> ErrorClass {
    match error {
        RequestAttemptError::DbError(db, _) => db_error_class(db),
        RequestAttemptError::SerializationError(_)
        | RequestAttemptError::CqlRequestSerialization(_)
        | RequestAttemptError::RepreparedIdChanged { .. } => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// The class of a failed execution.
pub(crate) fn execution_error_class(error: &ExecutionError) -> ErrorClass {
    match error {
        ExecutionError::LastAttemptError(attempt) => attempt_error_class(attempt),
        ExecutionError::BadQuery(_) => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

fn pager_error_class(error: &PagerExecutionError) -> ErrorClass {
    match error {
        PagerExecutionError::SerializationError(_) => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// A failed statement on `table` during `operation`.
pub(crate) fn query_error(
    operation: &'static str,
    table: &str,
    error: ExecutionError,
) -> StorageError {
    let class = execution_error_class(&error);
    StorageError::backend(
        operation,
        format!("statement on table `{table}` failed: {error}"),
    )
    .with_class(class)
    .with_source(error)
}

/// A failed paged statement on `table` during `operation`.
pub(crate) fn pager_error(
    operation: &'static str,
    table: &str,
    error: PagerExecutionError,
) -> StorageError {
    let class = pager_error_class(&error);
    StorageError::backend(
        operation,
        format!("paged query on table `{table}` failed: {error}"),
    )
    .with_class(class)
    .with_source(error)
}

/// Rows of `table` that do not decode as expected: the schema or the data is not what this
/// build wrote.
pub(crate) fn decode_error(
    operation: &'static str,
    table: &str,
    error: impl StdError + Send + Sync + 'static,
) -> StorageError {
    StorageError::new(
        operation,
        StorageErrorKind::Corrupt,
        format!("rows of table `{table}` do not decode: {error}"),
    )
    .with_source(error)
}

/// A stored value of `table` that is not what this crate writes.
pub(crate) fn corrupt(
    operation: &'static str,
    table: &str,
    detail: impl std::fmt::Display,
) -> StorageError {
    StorageError::new(
        operation,
        StorageErrorKind::Corrupt,
        format!("table `{table}`: {detail}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_problems_are_transient_and_schema_problems_permanent() {
        assert_eq!(db_error_class(&DbError::Overloaded), ErrorClass::Transient);
        assert_eq!(
            db_error_class(&DbError::IsBootstrapping),
            ErrorClass::Transient
        );
        assert_eq!(db_error_class(&DbError::Invalid), ErrorClass::Permanent);
        assert_eq!(db_error_class(&DbError::SyntaxError), ErrorClass::Permanent);
        assert_eq!(
            db_error_class(&DbError::Unauthorized),
            ErrorClass::Permanent
        );
        let timeout = ExecutionError::RequestTimeout(std::time::Duration::from_secs(1));
        assert_eq!(execution_error_class(&timeout), ErrorClass::Transient);
        let invalid = ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::Invalid,
            "unconfigured table".into(),
        ));
        let error = query_error("timer.schedule", "timers_by_key", invalid);
        assert!(error.is_permanent());
        assert!(error.to_string().contains("timers_by_key"), "{error}");
        assert!(error.to_string().contains("timer.schedule"), "{error}");
    }

    /// What the driver reports while a node is down or restarting (seen by the fault test,
    /// `tests/cassandra_fault.rs`): every one of them must be retried, never given up on.
    #[test]
    fn a_node_that_is_down_or_restarting_is_transient() {
        use std::sync::Arc;

        use scylla::errors::{ConnectionError, ConnectionPoolError};

        let refused = ConnectionError::IoError(Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let down = [
            ExecutionError::ConnectionPoolError(ConnectionPoolError::Broken {
                last_connection_error: refused,
            }),
            ExecutionError::ConnectionPoolError(ConnectionPoolError::Initializing),
            ExecutionError::EmptyPlan,
            ExecutionError::LastAttemptError(RequestAttemptError::DbError(
                DbError::IsBootstrapping,
                "starting".into(),
            )),
        ];
        for error in down {
            let error = query_error("state.apply", "keyed_state", error);
            assert!(!error.is_permanent(), "{error}");
            assert!(error.to_string().contains("keyed_state"), "{error}");
        }
    }

    #[test]
    fn start_up_errors_classify() {
        let config = CassandraError::Config {
            field: "keyspace",
            reason: "bad".into(),
        };
        assert!(config.is_permanent());
        let lock = CassandraError::LockTimeout {
            keyspace: "k".into(),
            holder: "h".into(),
            waited_secs: 1,
        };
        assert!(!lock.is_permanent());
    }
}
