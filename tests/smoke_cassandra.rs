//! Smoke test of the real Cassandra node through the scylla driver: keyspace, table, rows
//! written and read back, and a TTL that expires.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::time::{Duration, Instant};

use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;

async fn session() -> Session {
    SessionBuilder::new()
        .known_nodes(common::cassandra_nodes())
        .connection_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("connect to Cassandra")
}

async fn count_rows(session: &Session, keyspace: &str, id: i32) -> usize {
    session
        .query_unpaged(
            format!("SELECT id FROM {keyspace}.items WHERE id = ?"),
            (id,),
        )
        .await
        .expect("select")
        .into_rows_result()
        .expect("rows")
        .rows_num()
}

#[tokio::test(flavor = "multi_thread")]
async fn keyspace_table_rows_and_ttl() {
    let session = session().await;
    let keyspace = common::unique_name("smoke");
    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE {keyspace} WITH replication = \
                 {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
            ),
            &[],
        )
        .await
        .expect("create keyspace");
    session
        .query_unpaged(
            format!("CREATE TABLE {keyspace}.items (id int PRIMARY KEY, body text)"),
            &[],
        )
        .await
        .expect("create table");

    let insert = session
        .prepare(format!(
            "INSERT INTO {keyspace}.items (id, body) VALUES (?, ?)"
        ))
        .await
        .expect("prepare insert");
    for id in 0..100_i32 {
        session
            .execute_unpaged(&insert, (id, format!("item {id}")))
            .await
            .expect("insert");
    }
    let rows: Vec<(i32, String)> = session
        .query_unpaged(format!("SELECT id, body FROM {keyspace}.items"), &[])
        .await
        .expect("select all")
        .into_rows_result()
        .expect("rows")
        .rows::<(i32, String)>()
        .expect("typed rows")
        .collect::<Result<_, _>>()
        .expect("decode");
    assert_eq!(rows.len(), 100);
    assert!(rows.iter().all(|(id, body)| *body == format!("item {id}")));

    // A row written with a two-second TTL is readable at once and gone once it expires.
    session
        .query_unpaged(
            format!("INSERT INTO {keyspace}.items (id, body) VALUES (?, ?) USING TTL 2"),
            (1_000_i32, "short-lived"),
        )
        .await
        .expect("insert with ttl");
    assert_eq!(
        count_rows(&session, &keyspace, 1_000).await,
        1,
        "visible before expiry"
    );
    let written = Instant::now();
    // Expiry is a time-based event with no notification; poll with a bound well past the TTL.
    while count_rows(&session, &keyspace, 1_000).await > 0 {
        assert!(
            written.elapsed() < Duration::from_secs(10),
            "TTL row still present after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        count_rows(&session, &keyspace, 0).await,
        1,
        "rows without TTL remain"
    );

    session
        .query_unpaged(format!("DROP KEYSPACE {keyspace}"), &[])
        .await
        .expect("drop keyspace");
}
