//! The keyspace-wide migration lock: one row taken with a lightweight transaction.
//!
//! `INSERT ... IF NOT EXISTS USING TTL` gives the row to exactly one client (Paxos decides), and
//! the TTL releases it if that client crashes mid-migration, so a dead holder blocks others for
//! at most the TTL. Release and renewal are conditional on still being the holder, so a client
//! whose lock expired can never delete a successor's lock.

use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prosody_api::{ClassifyError, ErrorClass};
use scylla::statement::SerialConsistency;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlValue, Row};

use crate::errors::{CassandraError, decode_error};
use crate::session::Db;

pub(crate) const LOCK_TABLE: &str = "prosody_migration_lock";
const OPERATION: &str = "migrations.lock";
/// First and longest pause between attempts: short enough that a start-up behind a quick
/// migration waits little, long enough not to hammer Paxos while a slow one runs.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// A held lock. Release it with [`MigrationLock::release`]; if the holder dies, the TTL does.
pub(crate) struct MigrationLock<'a> {
    db: &'a Db,
    holder: String,
    release: PreparedStatement,
    renew: PreparedStatement,
    ttl_secs: i32,
}

/// An id no other client uses: process, wall-clock nanos and a counter (for several stores in
/// one process).
fn holder_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "pid{}-{nanos}-{}",
        process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `[applied]` column of a lightweight transaction's result, and the current holder when
/// it was not applied.
fn outcome(rows: &[Row]) -> Result<(bool, Option<String>), CassandraError> {
    let Some(row) = rows.first() else {
        return Err(decode_error(
            OPERATION,
            LOCK_TABLE,
            std::io::Error::other("a lightweight transaction returned no row"),
        )
        .into());
    };
    let applied = matches!(row.columns.first(), Some(Some(CqlValue::Boolean(true))));
    // A refused transaction returns the row it found: `[applied]`, then the primary key
    // (`name`), then the regular columns (`holder`).
    let holder = match row.columns.get(2) {
        Some(Some(CqlValue::Text(text))) => Some(text.clone()),
        _ => None,
    };
    Ok((applied, holder))
}

impl<'a> MigrationLock<'a> {
    /// Takes the lock, waiting up to the configured time for another holder.
    pub(crate) async fn acquire(db: &'a Db) -> Result<Self, CassandraError> {
        let ttl = db.config.migration_lock_ttl;
        let ttl_secs = i32::try_from(ttl.as_secs()).unwrap_or(i32::MAX);
        let mut take = super::prepare_visible(
            db,
            OPERATION,
            LOCK_TABLE,
            "INSERT INTO {ks}.prosody_migration_lock (name, holder) VALUES ('schema', ?) \
                 IF NOT EXISTS USING TTL ?",
        )
        .await?;
        let mut release = super::prepare_visible(
            db,
            OPERATION,
            LOCK_TABLE,
            "DELETE FROM {ks}.prosody_migration_lock WHERE name = 'schema' IF holder = ?",
        )
        .await?;
        let mut renew = super::prepare_visible(
            db,
            OPERATION,
            LOCK_TABLE,
            "UPDATE {ks}.prosody_migration_lock USING TTL ? SET holder = ? \
                 WHERE name = 'schema' IF holder = ?",
        )
        .await?;
        for statement in [&mut take, &mut release, &mut renew] {
            // A lightweight transaction is not idempotent: a blind retry after a timeout could
            // report "not applied" for our own successful insert. The loop below re-checks.
            statement.set_is_idempotent(false);
            statement.set_serial_consistency(Some(SerialConsistency::LocalSerial));
        }
        let holder = holder_id();
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        loop {
            let attempt = db
                .rows(OPERATION, LOCK_TABLE, &take, (&holder, ttl_secs))
                .await;
            let (applied, current) = match attempt {
                Ok(rows) => outcome(&rows)?,
                // A transient failure (a Paxos write timeout when several clients start at
                // once, an overloaded node) leaves the outcome unknown: try again within the
                // wait budget; the holder check below recognises our own insert if it landed.
                Err(error)
                    if error.error_class() == ErrorClass::Transient
                        && started.elapsed() < db.config.migration_lock_wait =>
                {
                    tracing::debug!(keyspace = %db.keyspace, %error,
                        "taking the migration lock failed transiently: retrying");
                    (false, None)
                }
                Err(error) => return Err(error.into()),
            };
            // After an ambiguous failure our own earlier insert may hold the lock.
            if applied || current.as_deref() == Some(holder.as_str()) {
                tracing::debug!(keyspace = %db.keyspace, %holder, "took the migration lock");
                return Ok(Self {
                    db,
                    holder,
                    release,
                    renew,
                    ttl_secs,
                });
            }
            let waited = started.elapsed();
            if waited >= db.config.migration_lock_wait {
                return Err(CassandraError::LockTimeout {
                    keyspace: db.keyspace.clone(),
                    holder: current.unwrap_or_else(|| "an unknown client".to_owned()),
                    waited_secs: waited.as_secs(),
                });
            }
            tracing::debug!(keyspace = %db.keyspace, ?current, "waiting for the migration lock");
            // Polling is the protocol here: the holder is another process, and Cassandra has
            // no notification to wait on.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// Extends the lock's TTL before a step that may take a while.
    pub(crate) async fn renew(&self) -> Result<(), CassandraError> {
        let rows: Vec<Row> = self
            .db
            .rows(
                OPERATION,
                LOCK_TABLE,
                &self.renew,
                (self.ttl_secs, &self.holder, &self.holder),
            )
            .await?;
        let (applied, current) = outcome(&rows)?;
        if applied {
            Ok(())
        } else {
            Err(CassandraError::LockTimeout {
                keyspace: self.db.keyspace.clone(),
                holder: current.unwrap_or_else(|| "nobody (it expired)".to_owned()),
                waited_secs: 0,
            })
        }
    }

    /// Gives the lock back; if that fails, the TTL releases it.
    pub(crate) async fn release(self) {
        let released: Result<Vec<Row>, _> = self
            .db
            .rows(OPERATION, LOCK_TABLE, &self.release, (&self.holder,))
            .await;
        if let Err(error) = released {
            tracing::warn!(%error, "could not release the migration lock; it expires on its own");
        }
    }
}
