//! The probe server over real HTTP on 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::{HealthRegistry, ManualClock, ProbeConfig, ProbeServer};

const THRESHOLD: Duration = Duration::from_secs(30);
// Bounds every network wait so a broken server fails the test instead of hanging it.
const TIMEOUT: Duration = Duration::from_secs(10);

fn local_config() -> ProbeConfig {
    ProbeConfig {
        port: Some(0),
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        stall_threshold: THRESHOLD,
    }
}

async fn start(registry: &HealthRegistry) -> ProbeServer {
    ProbeServer::start(&local_config(), registry.clone())
        .await
        .expect("bind 127.0.0.1:0")
        .expect("probes are enabled")
}

async fn connect(addr: SocketAddr) -> SendRequest<Empty<Bytes>> {
    connect_watched(addr).await.0
}

/// A connection, with the task that drives it: the task ends when the server closes it.
async fn connect_watched(
    addr: SocketAddr,
) -> (SendRequest<Empty<Bytes>>, JoinHandle<hyper::Result<()>>) {
    let stream = tokio::time::timeout(TIMEOUT, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    (sender, tokio::spawn(connection))
}

async fn send(
    sender: &mut SendRequest<Empty<Bytes>>,
    method: Method,
    path: &str,
) -> (StatusCode, String) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::new())
        .expect("request");
    let response = tokio::time::timeout(TIMEOUT, sender.send_request(request))
        .await
        .expect("response in time")
        .expect("response");
    let status = response.status();
    assert_eq!(
        response.headers()[hyper::header::CONTENT_TYPE],
        "application/json"
    );
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        String::from_utf8(body.to_vec()).expect("utf-8 body"),
    )
}

async fn get(addr: SocketAddr, path: &str) -> (StatusCode, Value) {
    let mut sender = connect(addr).await;
    let (status, body) = send(&mut sender, Method::GET, path).await;
    (status, serde_json::from_str(&body).expect("JSON body"))
}

#[tokio::test]
async fn disabled_when_no_port() {
    let config = ProbeConfig {
        port: None,
        ..local_config()
    };
    let server = ProbeServer::start(&config, HealthRegistry::new())
        .await
        .expect("disabled start succeeds");
    assert!(server.is_none());
}

#[tokio::test]
async fn readyz_turns_ready_on_assignment_and_back_on_revocation() {
    let registry = HealthRegistry::new();
    let server = start(&registry).await;
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0);

    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["assigned_partitions"], 0);

    registry.partition_assigned("orders", 0);
    registry.partition_assigned("orders", 1);
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ready");
    assert_eq!(body["assigned_partitions"], 2);

    registry.partition_revoked("orders", 0);
    registry.partition_revoked("orders", 1);
    let (status, _) = get(addr, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    server.stop().await;
}

#[tokio::test]
async fn livez_fails_while_a_busy_partition_makes_no_progress() {
    let clock = Arc::new(ManualClock::new());
    let registry = HealthRegistry::with_clock(clock.clone());
    let server = start(&registry).await;
    let addr = server.local_addr();

    // Unassigned and idle processes are alive.
    let (status, body) = get(addr, "/livez").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "live");

    let stuck = registry.partition_assigned("orders", 3);
    let idle = registry.partition_assigned("orders", 1);
    stuck.work_pending();
    clock.advance(THRESHOLD.saturating_sub(Duration::from_secs(1)));
    let (status, body) = get(addr, "/livez").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["busy_partitions"], 1);

    clock.advance(Duration::from_secs(2));
    let (status, body) = get(addr, "/livez").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "stalled");
    assert_eq!(body["stall_threshold_ms"], 30_000);
    assert_eq!(body["stalled_count"], 1);
    assert_eq!(body["assigned_partitions"], 2);
    let partitions = body["partitions"].as_array().expect("partition list");
    assert_eq!(partitions.len(), 1);
    assert_eq!(partitions[0]["topic"], "orders");
    assert_eq!(partitions[0]["partition"], 3);
    assert_eq!(partitions[0]["ms_since_progress"], 31_000);
    // The idle partition is not blamed.
    drop(idle);

    stuck.progress();
    let (status, body) = get(addr, "/livez").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    server.stop().await;
}

#[tokio::test]
async fn one_connection_serves_many_probes() {
    let registry = HealthRegistry::new();
    let server = start(&registry).await;
    let mut sender = connect(server.local_addr()).await;
    for _ in 0..3 {
        let (status, _) = send(&mut sender, Method::GET, "/livez").await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = send(&mut sender, Method::HEAD, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.is_empty(), "HEAD has no body: {body}");
    server.stop().await;
}

#[tokio::test]
async fn unknown_paths_and_methods_are_rejected() {
    let registry = HealthRegistry::new();
    let server = start(&registry).await;
    let addr = server.local_addr();

    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["status"], "not_found");

    let mut sender = connect(addr).await;
    let (status, _) = send(&mut sender, Method::POST, "/livez").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    // A query string does not change the route.
    let (status, _) = get(addr, "/livez?verbose=1").await;
    assert_eq!(status, StatusCode::OK);

    server.stop().await;
}

#[tokio::test]
async fn stop_closes_the_port_even_with_an_open_keep_alive_connection() {
    let registry = HealthRegistry::new();
    let server = start(&registry).await;
    let addr = server.local_addr();
    let (mut kept, kept_task) = connect_watched(addr).await;
    let (status, _) = send(&mut kept, Method::GET, "/livez").await;
    assert_eq!(status, StatusCode::OK);

    tokio::time::timeout(TIMEOUT, server.stop())
        .await
        .expect("stop finishes in time");

    let refused = TcpStream::connect(addr).await;
    assert!(refused.is_err(), "port still open after stop()");
    // The idle keep-alive connection was closed by the graceful shutdown.
    tokio::time::timeout(TIMEOUT, kept_task)
        .await
        .expect("kept connection closed in time")
        .expect("connection task")
        .expect("clean close");
    assert!(kept.is_closed());
}

#[tokio::test]
async fn dropping_the_handle_stops_the_server() {
    let registry = HealthRegistry::new();
    let server = start(&registry).await;
    let addr = server.local_addr();
    drop(server);

    // Dropping only signals the server task, so wait (bounded) for the listener to close.
    tokio::time::timeout(TIMEOUT, async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("port closes after the handle is dropped");
}

#[tokio::test]
async fn bind_failure_names_the_option() {
    let registry = HealthRegistry::new();
    let first = start(&registry).await;
    let taken = ProbeConfig {
        port: Some(first.local_addr().port()),
        ..local_config()
    };
    let error = ProbeServer::start(&taken, registry.clone())
        .await
        .expect_err("port is taken");
    let message = error.to_string();
    assert!(message.contains("probePort"), "{message}");
    assert!(
        message.contains(&first.local_addr().to_string()),
        "{message}"
    );
    first.stop().await;
}
