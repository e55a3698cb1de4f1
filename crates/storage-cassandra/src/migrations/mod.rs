//! Versioned CQL migrations, embedded in the crate and applied once per keyspace.
//!
//! # Protocol
//!
//! 1. Create the keyspace (configured replication) and the two bookkeeping tables if absent.
//!    Existence is checked first, so a started cluster sees no DDL at all.
//! 2. Read the applied versions with their checksums. A known version whose recorded checksum
//!    differs from the embedded file is an error naming the version: applied migrations are
//!    history and must never change.
//! 3. Nothing pending: done, without taking any lock (the common start-up).
//! 4. Otherwise take the keyspace's migration lock (a lightweight transaction, see
//!    `lock`), read the applied versions again (another client may just have finished),
//!    apply each pending migration in version order and record it, then release the lock.
//!
//! Each migration's statements are `IF NOT EXISTS`, so a migration interrupted by a crash is
//! simply run again by the next client. Versions applied by a newer build and unknown to this
//! one are tolerated (schema changes are additive); they are logged.
//!
//! Caveat: the bookkeeping tables themselves are created before any lock exists. On a single
//! node that is safe (the node serializes schema changes); on a multi-node Cassandra 5.0
//! cluster, concurrent first start-ups could race on that one `CREATE TABLE IF NOT EXISTS`,
//! so a first deployment should start one client first (or create the keyspace beforehand).

mod lock;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prosody_api::StorageError;
use scylla::statement::Consistency;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::unprepared::Statement;

use crate::errors::{CassandraError, query_error};
use crate::session::Db;
use lock::MigrationLock;

const OPERATION: &str = "migrations.apply";
const MIGRATIONS_TABLE: &str = "prosody_migrations";

/// One embedded migration.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// Its version: applied in ascending order.
    pub version: u32,
    /// A short name, shown in errors.
    pub name: &'static str,
    /// The CQL, statements separated by `;`, `{ks}` standing for the keyspace.
    pub cql: &'static str,
}

impl Migration {
    /// The checksum recorded when the migration is applied: FNV-1a (64 bit) of the file,
    /// in hex. Not cryptographic; it detects edits, not attacks.
    #[must_use]
    pub fn checksum(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.cql.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
    }

    /// The statements of the file, comments dropped.
    fn statements(&self) -> impl Iterator<Item = String> + '_ {
        let without_comments: String = self
            .cql
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        without_comments
            .split(';')
            .map(str::trim)
            .filter(|statement| !statement.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
            .into_iter()
    }
}

/// Every migration of this build, in version order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        cql: include_str!("0001_initial.cql"),
    },
    Migration {
        version: 2,
        name: "deferred_keys",
        cql: include_str!("0002_deferred_keys.cql"),
    },
];

/// Brings the keyspace up to date; returns the versions this call applied (empty when another
/// client had already applied them).
pub(crate) async fn migrate(db: &Db) -> Result<Vec<u32>, CassandraError> {
    ensure_bookkeeping(db).await?;
    if pending(db).await?.is_empty() {
        return Ok(Vec::new());
    }
    let lock = MigrationLock::acquire(db).await?;
    let outcome = apply_pending(db, &lock).await;
    lock.release().await;
    outcome
}

async fn apply_pending(db: &Db, lock: &MigrationLock<'_>) -> Result<Vec<u32>, CassandraError> {
    let mut applied = Vec::new();
    let record = prepare_visible(
        db,
        OPERATION,
        MIGRATIONS_TABLE,
        "INSERT INTO {ks}.prosody_migrations (version, name, checksum, applied_at_ms) \
             VALUES (?, ?, ?, ?)",
    )
    .await?;
    for migration in pending(db).await? {
        lock.renew().await?;
        tracing::info!(
            keyspace = %db.keyspace,
            version = migration.version,
            name = migration.name,
            "applying migration"
        );
        for statement in migration.statements() {
            ddl(db, &statement).await?;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(0));
        db.execute(
            OPERATION,
            MIGRATIONS_TABLE,
            &record,
            (
                i32::try_from(migration.version).unwrap_or(i32::MAX),
                migration.name,
                migration.checksum(),
                now,
            ),
        )
        .await?;
        applied.push(migration.version);
    }
    Ok(applied)
}

/// The embedded migrations not applied yet, after checking the applied ones are unchanged.
async fn pending(db: &Db) -> Result<Vec<Migration>, CassandraError> {
    let read = prepare_visible(
        db,
        OPERATION,
        MIGRATIONS_TABLE,
        "SELECT version, checksum FROM {ks}.prosody_migrations",
    )
    .await?;
    let rows: Vec<(i32, String)> = db.all_rows(OPERATION, MIGRATIONS_TABLE, &read, ()).await?;
    let mut pending = Vec::new();
    for migration in MIGRATIONS {
        let recorded = rows
            .iter()
            .find(|(version, _)| i64::from(*version) == i64::from(migration.version));
        match recorded {
            Some((_, checksum)) if *checksum != migration.checksum() => {
                return Err(CassandraError::ChangedMigration {
                    keyspace: db.keyspace.clone(),
                    version: migration.version,
                    name: migration.name,
                    recorded: checksum.clone(),
                    embedded: migration.checksum(),
                });
            }
            Some(_) => {}
            None => pending.push(*migration),
        }
    }
    for (version, _) in &rows {
        if !MIGRATIONS
            .iter()
            .any(|migration| i64::from(migration.version) == i64::from(*version))
        {
            tracing::info!(
                keyspace = %db.keyspace,
                version,
                "keyspace has a migration this build does not know (applied by a newer build)"
            );
        }
    }
    Ok(pending)
}

/// How long a table that `system_schema` lists may take to become usable.
const SCHEMA_VISIBLE_WAIT: Duration = Duration::from_secs(10);

/// Prepares a statement on a bookkeeping table, waiting while the table is still invisible.
///
/// A node writes a new table to `system_schema` before it updates the schema that statements
/// are checked against, so a client that saw another client's freshly created table listed can
/// still be told it "does not exist" for a moment. That answer is retried, briefly and bounded;
/// any other error, or a table still missing after [`SCHEMA_VISIBLE_WAIT`], is returned.
async fn prepare_visible(
    db: &Db,
    operation: &'static str,
    table: &str,
    cql: &str,
) -> Result<PreparedStatement, StorageError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        match db.prepare(operation, table, cql).await {
            Err(error)
                if error.to_string().contains("does not exist")
                    && started.elapsed() < SCHEMA_VISIBLE_WAIT =>
            {
                tracing::debug!(%error, "table not visible yet; preparing again");
                // No notification exists for "this node's schema now has the table".
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            outcome => return outcome,
        }
    }
}

/// Runs one schema statement. DDL is the one kind of statement this crate does not prepare:
/// each runs once per keyspace, and the driver waits for schema agreement after it. Every
/// statement is `IF NOT EXISTS` (a test checks the embedded ones), so it is marked idempotent:
/// the driver's retry policy then retries it after a broken connection or an overloaded or
/// server error, which a node that has only just started may answer, instead of failing the
/// whole start-up (it retries only idempotent statements on those).
async fn ddl(db: &Db, statement: &str) -> Result<(), CassandraError> {
    let mut cql = Statement::new(statement.replace("{ks}", &db.keyspace));
    cql.set_is_idempotent(true);
    db.session
        .query_unpaged(cql, ())
        .await
        .map_err(|error| query_error(OPERATION, "schema", error))?;
    Ok(())
}

/// Creates the keyspace and the bookkeeping tables when they are missing.
async fn ensure_bookkeeping(db: &Db) -> Result<(), CassandraError> {
    let mut keyspaces = db
        .prepare(
            OPERATION,
            "system_schema.keyspaces",
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
        )
        .await?;
    keyspaces.set_consistency(Consistency::One);
    let found: Vec<(String,)> = db
        .rows(
            OPERATION,
            "system_schema.keyspaces",
            &keyspaces,
            (&db.keyspace,),
        )
        .await?;
    if found.is_empty() {
        ddl(
            db,
            &format!(
                "CREATE KEYSPACE IF NOT EXISTS {{ks}} WITH replication = {}",
                db.config.replication.to_cql()
            ),
        )
        .await?;
    }
    let mut tables = db
        .prepare(
            OPERATION,
            "system_schema.tables",
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?",
        )
        .await?;
    tables.set_consistency(Consistency::One);
    let found: Vec<(String,)> = db
        .rows(OPERATION, "system_schema.tables", &tables, (&db.keyspace,))
        .await?;
    let has = |name: &str| found.iter().any(|(table,)| table == name);
    if !has(MIGRATIONS_TABLE) {
        ddl(
            db,
            "CREATE TABLE IF NOT EXISTS {ks}.prosody_migrations (version int PRIMARY KEY, \
             name text, checksum text, applied_at_ms bigint)",
        )
        .await?;
    }
    if !has(lock::LOCK_TABLE) {
        ddl(
            db,
            "CREATE TABLE IF NOT EXISTS {ks}.prosody_migration_lock (name text PRIMARY KEY, \
             holder text)",
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_ascend_without_duplicates() {
        assert!(
            MIGRATIONS
                .windows(2)
                .all(|pair| pair[0].version < pair[1].version)
        );
    }

    #[test]
    fn checksums_are_stable_and_detect_edits() {
        let migration = MIGRATIONS[0];
        assert_eq!(migration.checksum(), migration.checksum());
        let edited = Migration {
            cql: "CREATE TABLE x (a int PRIMARY KEY);",
            ..migration
        };
        assert_ne!(edited.checksum(), migration.checksum());
        assert_eq!(
            Migration {
                cql: "",
                ..migration
            }
            .checksum(),
            "cbf29ce484222325"
        );
    }

    #[test]
    fn statements_split_on_semicolons_and_drop_comments() {
        let migration = Migration {
            version: 9,
            name: "t",
            cql: "-- a comment; with a semicolon\nCREATE TABLE a (x int PRIMARY KEY);\n\n\
                  CREATE TABLE b (y int PRIMARY KEY);\n",
        };
        let statements: Vec<String> = migration.statements().collect();
        assert_eq!(
            statements,
            [
                "CREATE TABLE a (x int PRIMARY KEY)",
                "CREATE TABLE b (y int PRIMARY KEY)"
            ]
        );
    }

    #[test]
    fn every_embedded_statement_is_idempotent_ddl() {
        for migration in MIGRATIONS {
            for statement in migration.statements() {
                assert!(
                    statement.contains("IF NOT EXISTS"),
                    "migration {} has a statement that cannot be re-run: {statement}",
                    migration.version
                );
            }
        }
    }
}
