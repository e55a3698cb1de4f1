//! The client's lifecycle and observability against a real broker: probes, consumer state,
//! resubscription, shutdown semantics and regex subscriptions.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::harness::{self, Behaviour, Recorder};
use prosody::config::{ClientOptions, ProbePort};
use prosody::{ClientError, ConsumerState, ProsodyClient};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

async fn client(options: ClientOptions) -> ProsodyClient {
    ProsodyClient::from_options(options).await.expect("client")
}

/// The status code of `GET path` on the probe server.
async fn probe(address: SocketAddr, path: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to probes");
    let request = format!("GET {path} HTTP/1.1\r\nHost: probes\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"))
}

/// Waits (bounded) until `path` answers `status`: probes are polled by orchestrators too.
async fn until_probe(address: SocketAddr, path: &str, status: u16) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while probe(address, path).await != status {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{path} never answered {status}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_report_readiness_and_stalls() {
    let topic = common::unique_name("probes");
    harness::create_topic(&topic, 1).await;
    let probed = |topics: &str, group: &str| ClientOptions {
        probe_port: Some(ProbePort::Port(0)),
        stall_threshold_ms: Some(Duration::from_millis(800)),
        ..harness::options(topics, group)
    };

    // A client whose subscription matches no topic is never assigned: not ready.
    let idle = client(probed(
        &format!("^{topic}_matches_nothing.*"),
        &common::unique_name("idle"),
    ))
    .await;
    idle.subscribe(Recorder::new().handler("idle", Behaviour::default()))
        .await
        .expect("subscribe");
    let idle_probes = idle
        .probe_address()
        .expect("probe server runs while subscribed");
    assert_eq!(probe(idle_probes, "/readyz").await, 503);
    assert_eq!(
        probe(idle_probes, "/livez").await,
        200,
        "nothing to do is not a stall"
    );

    let gate = Arc::new(Semaphore::new(0));
    let recorder = Recorder::new();
    let busy = client(probed(&topic, &common::unique_name("busy"))).await;
    busy.subscribe(recorder.handler(
        "busy",
        Behaviour {
            max_sleep_ms: 0,
            gate: Some(gate.clone()),
        },
    ))
    .await
    .expect("subscribe");
    let busy_probes = busy.probe_address().expect("probe server");
    until_probe(busy_probes, "/readyz", 200).await;
    assert_eq!(busy.assigned_partition_count(), 1);
    assert_eq!(
        probe(idle_probes, "/readyz").await,
        503,
        "still nothing assigned"
    );

    busy.send(&topic, "stuck", &json!({"seq": 0}))
        .await
        .expect("send");
    until_probe(busy_probes, "/livez", 503).await;
    assert!(busy.is_stalled());
    gate.add_permits(1);
    recorder.wait_for(1, Duration::from_secs(10)).await;
    until_probe(busy_probes, "/livez", 200).await;
    assert!(!busy.is_stalled());

    busy.unsubscribe().await.expect("unsubscribe");
    assert!(
        busy.probe_address().is_none(),
        "the probe server stops with unsubscribe"
    );
    assert!(
        tokio::net::TcpStream::connect(busy_probes).await.is_err(),
        "port closed"
    );
    idle.shutdown().await.expect("shutdown");
    busy.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_resubscribe_and_shutdown() {
    let topic = common::unique_name("lifecycle");
    let group = common::unique_name("lifecycle_group");
    harness::create_topic(&topic, 2).await;

    let sender = client(ClientOptions {
        subscribed_topics: None,
        ..harness::options(&topic, &common::unique_name("sender"))
    })
    .await;
    assert_eq!(sender.consumer_state(), ConsumerState::Unconfigured);
    assert!(matches!(
        sender
            .subscribe(Recorder::new().handler("x", Behaviour::default()))
            .await,
        Err(ClientError::NoTopics)
    ));

    let client = client(ClientOptions {
        source_system: None,
        ..harness::options(&topic, &group)
    })
    .await;
    assert_eq!(
        client.source_system(),
        group,
        "source system defaults to the group id"
    );
    assert_eq!(client.consumer_state(), ConsumerState::Configured);
    assert!(matches!(
        client.unsubscribe().await,
        Err(ClientError::NotSubscribed)
    ));

    let recorder = Recorder::new();
    client
        .subscribe(recorder.handler("first", Behaviour::default()))
        .await
        .expect("subscribe");
    assert_eq!(client.consumer_state(), ConsumerState::Running);
    assert!(matches!(
        client
            .subscribe(recorder.handler("again", Behaviour::default()))
            .await,
        Err(ClientError::AlreadySubscribed)
    ));
    sender
        .send(&topic, "a", &json!({"seq": 0}))
        .await
        .expect("send");
    recorder.wait_for(1, Duration::from_secs(60)).await;
    client.unsubscribe().await.expect("unsubscribe");
    assert_eq!(client.consumer_state(), ConsumerState::Configured);
    assert_eq!(client.assigned_partition_count(), 0);

    // Subscribing again resumes after the committed offset.
    sender
        .send(&topic, "a", &json!({"seq": 1}))
        .await
        .expect("send");
    client
        .subscribe(recorder.handler("second", Behaviour::default()))
        .await
        .expect("resubscribe");
    recorder.wait_for(2, Duration::from_secs(60)).await;
    let seqs: Vec<_> = recorder
        .handled()
        .iter()
        .map(|event| (event.client.clone(), event.seq))
        .collect();
    assert_eq!(
        seqs,
        vec![
            ("first".to_owned(), Some(0)),
            ("second".to_owned(), Some(1))
        ]
    );

    // Concurrent shutdowns await one operation; every later operation fails clearly.
    let (one, two) = tokio::join!(client.shutdown(), client.shutdown());
    one.expect("shutdown");
    two.expect("concurrent shutdown");
    client.shutdown().await.expect("shutdown is idempotent");
    assert_eq!(client.consumer_state(), ConsumerState::ShutDown);
    assert!(matches!(
        client.send(&topic, "a", &json!({})).await,
        Err(ClientError::ShutDown)
    ));
    assert!(matches!(
        client
            .subscribe(recorder.handler("late", Behaviour::default()))
            .await,
        Err(ClientError::ShutDown)
    ));
    assert!(matches!(
        client.unsubscribe().await,
        Err(ClientError::ShutDown)
    ));
    sender.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_subscription_covers_matching_topics() {
    let prefix = common::unique_name("regex");
    let (first, second) = (format!("{prefix}_orders"), format!("{prefix}_payments"));
    harness::create_topic(&first, 1).await;
    harness::create_topic(&second, 1).await;
    let client = client(harness::options(
        &format!("^{prefix}_.*"),
        &common::unique_name("regex_group"),
    ))
    .await;
    client
        .send(&first, "k1", &json!({"seq": 0}))
        .await
        .expect("send");
    client
        .send(&second, "k2", &json!({"seq": 0}))
        .await
        .expect("send");
    let recorder = Recorder::new();
    client
        .subscribe(recorder.handler("a", Behaviour::default()))
        .await
        .expect("subscribe");
    recorder.wait_for(2, Duration::from_secs(60)).await;
    let keys: BTreeSet<String> = recorder
        .handled()
        .into_iter()
        .map(|event| event.key)
        .collect();
    assert_eq!(keys, BTreeSet::from(["k1".to_owned(), "k2".to_owned()]));
    client.shutdown().await.expect("shutdown");
}

/// A client dropped without `shutdown`, after the runtime it ran on is gone, with a handler
/// still running: its poll thread must not wait on that runtime (it used to panic there), and
/// what was handled commits; the running record is left for the next owner.
#[test]
fn a_client_dropped_after_its_runtime_commits_what_was_done_and_leaves() {
    let topic = common::unique_name("abandoned");
    let group = common::unique_name("abandoned_group");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        harness::create_topic(&topic, 1).await;
        let client = client(ClientOptions {
            // Only the abandoning thread can commit within this test.
            commit_interval_ms: Some(Duration::from_secs(600)),
            ..harness::options(&topic, &group)
        })
        .await;
        let recorder = Recorder::new();
        // Ten records finish; the eleventh (same key) is still running when everything drops,
        // so a graceful drain would have to wait on the runtime.
        let behaviour = Behaviour {
            gate: Some(Arc::new(Semaphore::new(10))),
            ..Behaviour::default()
        };
        client
            .subscribe(recorder.handler("abandoned", behaviour))
            .await
            .expect("subscribe");
        harness::produce(&client, &topic, 11, 1).await;
        recorder.wait_for(10, Duration::from_secs(60)).await;
        harness::until(
            Duration::from_secs(60),
            "the eleventh handler running",
            || recorder.running() == 1,
        )
        .await;
        client
    });
    drop(runtime);
    drop(client);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let committed = common::kafka_read::committed(&group, &topic, 1);
        if committed == [10] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "committed {committed:?}, expected [10]"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
