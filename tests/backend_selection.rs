//! Backend selection through the client: which stores a configuration gets, the `RocksDB`
//! directory lock, an incomplete choice failing at construction, and the per-client temporary
//! state-cache directory removed at shutdown.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use common::harness;
use prosody::config::{ClientOptions, StorageBackend};
use prosody::{ClientError, ProsodyClient};

fn options(group: &str) -> ClientOptions {
    ClientOptions {
        bootstrap_servers: Some(vec![common::bootstrap_servers()]),
        group_id: Some(group.to_owned()),
        mock: Some(false),
        telemetry_enabled: Some(false),
        ..ClientOptions::default()
    }
}

/// The directory in a store's `Debug` output (`dir: "..."`).
fn debug_dir(store: &dyn std::fmt::Debug) -> std::path::PathBuf {
    let debug = format!("{store:?}");
    let start = debug.find("dir: \"").expect("a dir field") + "dir: \"".len();
    let end = start + debug[start..].find('"').unwrap();
    debug[start..end].into()
}

#[tokio::test]
async fn rocksdb_is_one_locked_directory_per_client() {
    let dir = tempfile::tempdir().unwrap();
    let rocks = || ClientOptions {
        storage_backend: Some(StorageBackend::RocksDb),
        state_cache_dir: Some(dir.path().to_path_buf()),
        ..options(&common::unique_name("rocks_select"))
    };
    let first = ProsodyClient::from_options(rocks())
        .await
        .expect("first client");
    let state = first.state_store().unwrap();
    assert!(format!("{state:?}").starts_with("RocksStore"), "{state:?}");
    let error = ProsodyClient::from_options(rocks())
        .await
        .err()
        .expect("a second client on the directory fails");
    assert!(matches!(error, ClientError::Storage(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&dir.path().display().to_string()),
        "{message}"
    );
    assert!(message.contains("locked"), "{message}");
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );
}

#[tokio::test]
async fn cassandra_nodes_select_cassandra_with_a_temporary_cache_removed_at_shutdown() {
    let client = ProsodyClient::from_options(ClientOptions {
        cassandra_nodes: Some(common::cassandra_nodes()),
        cassandra_keyspace: Some("prosody_facade_tests".to_owned()),
        ..options(&common::unique_name("cassandra_select"))
    })
    .await
    .expect("client");
    assert_eq!(client.config().storage.backend, StorageBackend::Cassandra);
    let state = client.state_store().unwrap();
    assert!(
        format!("{state:?}").starts_with("CachedStateStore"),
        "{state:?}"
    );
    let cache_dir = debug_dir(&state);
    assert!(cache_dir.is_dir(), "{}", cache_dir.display());
    assert!(format!("{:?}", client.timer_store()).starts_with("CassandraStore"));
    drop(state);

    client.shutdown().await.unwrap();
    assert!(
        !cache_dir.exists(),
        "{} outlived shutdown",
        cache_dir.display()
    );
    assert!(client.state_store().is_none());
}

#[tokio::test]
async fn an_incomplete_choice_fails_at_construction_naming_the_option() {
    // (`cassandra` without nodes is covered by the configuration's unit tests: here
    // PROSODY_CASSANDRA_NODES of the test environment would supply them.)
    let error = ProsodyClient::from_options(ClientOptions {
        storage_backend: Some(StorageBackend::RocksDb),
        ..options("incomplete")
    })
    .await
    .err()
    .expect("rocksdb without a directory fails");
    assert!(error.to_string().starts_with("stateCacheDir"), "{error}");
}

#[tokio::test]
async fn mock_mode_keeps_everything_in_memory() {
    let client = ProsodyClient::from_options(ClientOptions {
        mock: Some(true),
        group_id: Some("mock_select".to_owned()),
        ..ClientOptions::default()
    })
    .await
    .expect("client");
    assert_eq!(client.config().storage.backend, StorageBackend::Memory);
    assert!(format!("{:?}", client.state_store().unwrap()).starts_with("MemoryStateStore"));
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn mock_mode_needs_no_broker_even_when_bootstrap_servers_are_set() {
    // Nothing listens on port 1: a client that tried these servers would never get its topic.
    let unreachable = "127.0.0.1:1".to_owned();
    let topic = "mock_orders";
    let client = ProsodyClient::from_options(ClientOptions {
        mock: Some(true),
        bootstrap_servers: Some(vec![unreachable.clone()]),
        group_id: Some("mock_servers".to_owned()),
        source_system: Some("mock_servers-sender".to_owned()),
        subscribed_topics: Some(vec![topic.to_owned()]),
        probe_port: Some(prosody::config::ProbePort::Disabled),
        // The default second was once too short for the first send to the in-process cluster
        // while CI ran the other tests and Cassandra on two cores; a client that tried the
        // unreachable servers still never gets its record through.
        send_timeout_ms: Some(std::time::Duration::from_secs(10)),
        ..ClientOptions::default()
    })
    .await
    .expect("client");
    assert_ne!(client.bootstrap_servers(), unreachable);
    let recorder = harness::Recorder::new();
    client
        .subscribe(recorder.handler("mock", harness::Behaviour::default()))
        .await
        .expect("subscribe");
    client
        .send(topic, "customer-1", &serde_json::json!({"n": 1}))
        .await
        .expect("send to the in-process cluster");
    recorder
        .wait_for(1, std::time::Duration::from_secs(30))
        .await;
    assert_eq!(recorder.handled()[0].key, "customer-1");
    client.shutdown().await.expect("shutdown");
}
