//! Migrations against the real Cassandra: applied once, recorded with checksums, a changed
//! applied migration is refused by name, and concurrent first starts apply exactly once.
//! Each test uses a fresh keyspace and drops it at the end.

// Test helpers state expectations the way the tests do.
#![allow(clippy::expect_used)]

mod common;

use futures::future::join_all;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use storage_cassandra::migrations::MIGRATIONS;
use storage_cassandra::{CassandraError, CassandraStore};

async fn raw_session() -> Session {
    SessionBuilder::new()
        .known_nodes(common::nodes())
        .build()
        .await
        .expect("a raw session")
}

async fn drop_keyspace(session: &Session, keyspace: &str) {
    session
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
        .await
        .expect("drop the test keyspace");
}

async fn recorded(session: &Session, keyspace: &str) -> Vec<(i32, String, String)> {
    session
        .query_unpaged(
            format!("SELECT version, name, checksum FROM {keyspace}.prosody_migrations"),
            (),
        )
        .await
        .expect("read the migrations table")
        .into_rows_result()
        .expect("rows")
        .rows::<(i32, String, String)>()
        .expect("typed rows")
        .collect::<Result<Vec<_>, _>>()
        .expect("decoded rows")
}

#[tokio::test]
async fn migrations_apply_once_and_record_their_checksums() {
    let keyspace = common::fresh_keyspace("mig_once");
    let config = common::config(&keyspace);
    let first = CassandraStore::connect(&config).await.expect("first start");
    let all: Vec<u32> = MIGRATIONS
        .iter()
        .map(|migration| migration.version)
        .collect();
    assert_eq!(first.applied_migrations(), all.as_slice());
    let second = CassandraStore::connect(&config)
        .await
        .expect("second start");
    assert!(
        second.applied_migrations().is_empty(),
        "nothing left to apply"
    );

    let session = raw_session().await;
    let expected: Vec<(i32, String, String)> = MIGRATIONS
        .iter()
        .map(|migration| {
            (
                i32::try_from(migration.version).expect("small version"),
                migration.name.to_owned(),
                migration.checksum(),
            )
        })
        .collect();
    assert_eq!(recorded(&session, &keyspace).await, expected);
    drop_keyspace(&session, &keyspace).await;
}

#[tokio::test]
async fn a_changed_applied_migration_is_a_clear_error() {
    let keyspace = common::fresh_keyspace("mig_changed");
    let config = common::config(&keyspace);
    CassandraStore::connect(&config).await.expect("first start");
    let session = raw_session().await;
    session
        .query_unpaged(
            format!(
                "UPDATE {keyspace}.prosody_migrations SET checksum = 'edited' WHERE version = 1"
            ),
            (),
        )
        .await
        .expect("tamper with the record");

    let error = CassandraStore::connect(&config)
        .await
        .expect_err("a changed migration must be refused");
    assert!(
        matches!(error, CassandraError::ChangedMigration { version: 1, .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("migration 1 (initial)"), "{message}");
    assert!(message.contains(&keyspace), "{message}");
    drop_keyspace(&session, &keyspace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_clients_starting_at_once_apply_migrations_once() {
    let keyspace = common::fresh_keyspace("mig_race");
    let config = common::config(&keyspace);
    let starts = join_all((0..5).map(|_| {
        let config = config.clone();
        tokio::spawn(async move { CassandraStore::connect(&config).await })
    }))
    .await;
    let stores: Vec<CassandraStore> = starts
        .into_iter()
        .map(|joined| joined.expect("task").expect("start"))
        .collect();
    let mut applied: Vec<u32> = stores
        .iter()
        .flat_map(|store| store.applied_migrations().iter().copied())
        .collect();
    applied.sort_unstable();
    let all: Vec<u32> = MIGRATIONS
        .iter()
        .map(|migration| migration.version)
        .collect();
    assert_eq!(
        applied, all,
        "every migration applied by exactly one client"
    );
    let session = raw_session().await;
    assert_eq!(recorded(&session, &keyspace).await.len(), MIGRATIONS.len());
    drop_keyspace(&session, &keyspace).await;
}
