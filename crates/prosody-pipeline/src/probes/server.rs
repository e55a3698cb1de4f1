//! The HTTP server that answers `/readyz` and `/livez` from a [`HealthRegistry`].

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::tracker::HealthRegistry;

/// The port probes listen on unless configured otherwise.
pub const DEFAULT_PROBE_PORT: u16 = 8000;

/// How long a partition with work may go without progress before `/livez` fails, unless
/// configured otherwise.
pub const DEFAULT_STALL_THRESHOLD: Duration = Duration::from_secs(5 * 60);

// Probes come from a kubelet or a load balancer: a handful of connections. The cap keeps a
// misbehaving client from growing the server without bound.
const MAX_CONNECTIONS: usize = 64;
// A client that opens a connection and never finishes its request must not hold a slot forever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
// `stop()` lets in-flight requests finish, but never waits longer than this for them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
// Bodies list at most this many stalled partitions; the count is always exact.
const MAX_LISTED_PARTITIONS: usize = 100;

/// Where and how the probe server runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// The port to listen on; `None` disables the probe server. Port 0 picks a free port (see
    /// [`ProbeServer::local_addr`]).
    pub port: Option<u16>,
    /// The address to bind; all interfaces (`0.0.0.0`) by default so an orchestrator can reach it.
    pub address: IpAddr,
    /// How long a partition with pending work may make no progress before `/livez` fails.
    pub stall_threshold: Duration,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            port: Some(DEFAULT_PROBE_PORT),
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            stall_threshold: DEFAULT_STALL_THRESHOLD,
        }
    }
}

/// Why the probe server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The listening socket could not be opened (port in use, address not local, no permission).
    #[error("probePort: the probe server cannot listen on {address}: {source}")]
    Bind {
        /// The address that was asked for.
        address: SocketAddr,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

/// A running probe server. Dropping it stops the server in the background; [`ProbeServer::stop`]
/// stops it and waits until the port is closed.
#[derive(Debug)]
pub struct ProbeServer {
    local_addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl ProbeServer {
    /// Starts the probe server described by `config`, answering from `registry`; `Ok(None)` when
    /// probes are disabled (`config.port` is `None`). Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// [`ProbeError::Bind`] when the socket cannot be opened.
    pub async fn start(
        config: &ProbeConfig,
        registry: HealthRegistry,
    ) -> Result<Option<Self>, ProbeError> {
        let Some(port) = config.port else {
            return Ok(None);
        };
        let address = SocketAddr::new(config.address, port);
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| ProbeError::Bind { address, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| ProbeError::Bind { address, source })?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(
            listener,
            Probes {
                registry,
                stall_threshold: config.stall_threshold,
            },
            shutdown.clone(),
        ));
        debug!(%local_addr, "probe server listening");
        Ok(Some(Self {
            local_addr,
            shutdown,
            task: Some(task),
        }))
    }

    /// The address the server listens on (with the real port when port 0 was asked for).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting connections, lets in-flight requests finish (for a few seconds at most),
    /// and returns once the listening socket is closed.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            warn!(%error, "probe server task failed");
        }
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        // Without `stop()` nobody awaits the task; it still shuts down gracefully on its own.
        self.shutdown.cancel();
    }
}

async fn serve(listener: TcpListener, probes: Probes, shutdown: CancellationToken) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if connections.len() >= MAX_CONNECTIONS {
                        debug!(%peer, "probe server at its connection limit; closing");
                        continue;
                    }
                    let probes = probes.clone();
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_TIMEOUT)
                        .serve_connection(
                            TokioIo::new(stream),
                            service_fn(move |request: Request<Incoming>| {
                                let response =
                                    probes.respond(request.method(), request.uri().path());
                                async move { Ok::<_, Infallible>(response) }
                            }),
                        );
                    connections.spawn(graceful.watch(connection));
                }
                Err(error) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    warn!(%error, "probe server cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    // Closing the listener first makes new probes fail fast while old ones finish.
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        debug!("probe connections did not finish in time; aborting them");
    }
    connections.shutdown().await;
}

#[derive(Clone, Debug)]
struct Probes {
    registry: HealthRegistry,
    stall_threshold: Duration,
}

#[derive(Serialize)]
struct ReadyBody {
    status: &'static str,
    assigned_partitions: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
}

#[derive(Serialize)]
struct LiveBody {
    status: &'static str,
    assigned_partitions: usize,
    busy_partitions: usize,
    stall_threshold_ms: u128,
    #[serde(skip_serializing_if = "Option::is_none")]
    stalled_count: Option<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partitions: Vec<StalledBody>,
}

#[derive(Serialize)]
struct StalledBody {
    topic: String,
    partition: i32,
    ms_since_progress: u128,
}

#[derive(Serialize)]
struct ErrorBody {
    status: &'static str,
    reason: &'static str,
}

impl Probes {
    fn respond(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        let known = matches!(path, "/readyz" | "/livez");
        if !known {
            return json(
                StatusCode::NOT_FOUND,
                &ErrorBody {
                    status: "not_found",
                    reason: "probes are /readyz and /livez",
                },
            );
        }
        if method != Method::GET && method != Method::HEAD {
            let mut response = json(
                StatusCode::METHOD_NOT_ALLOWED,
                &ErrorBody {
                    status: "method_not_allowed",
                    reason: "probes answer GET and HEAD",
                },
            );
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        if path == "/readyz" {
            self.readyz()
        } else {
            self.livez()
        }
    }

    fn readyz(&self) -> Response<Full<Bytes>> {
        let assigned = self.registry.assigned_partition_count();
        if assigned > 0 {
            json(
                StatusCode::OK,
                &ReadyBody {
                    status: "ready",
                    assigned_partitions: assigned,
                    reason: None,
                },
            )
        } else {
            json(
                StatusCode::SERVICE_UNAVAILABLE,
                &ReadyBody {
                    status: "not_ready",
                    assigned_partitions: 0,
                    reason: Some("no partition is assigned to this consumer"),
                },
            )
        }
    }

    fn livez(&self) -> Response<Full<Bytes>> {
        let snapshot = self
            .registry
            .snapshot(self.stall_threshold, self.registry.now());
        let busy = snapshot.iter().filter(|p| p.has_pending_work).count();
        let stalled: Vec<_> = snapshot.iter().filter(|p| p.stalled).collect();
        let stall_threshold_ms = self.stall_threshold.as_millis();
        if stalled.is_empty() {
            return json(
                StatusCode::OK,
                &LiveBody {
                    status: "live",
                    assigned_partitions: snapshot.len(),
                    busy_partitions: busy,
                    stall_threshold_ms,
                    stalled_count: None,
                    partitions: Vec::new(),
                },
            );
        }
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            &LiveBody {
                status: "stalled",
                assigned_partitions: snapshot.len(),
                busy_partitions: busy,
                stall_threshold_ms,
                stalled_count: Some(stalled.len()),
                partitions: stalled
                    .iter()
                    .take(MAX_LISTED_PARTITIONS)
                    .map(|p| StalledBody {
                        topic: p.topic.to_string(),
                        partition: p.partition,
                        ms_since_progress: p.since_progress.as_millis(),
                    })
                    .collect(),
            },
        )
    }
}

fn json(status: StatusCode, body: &impl Serialize) -> Response<Full<Bytes>> {
    // Serializing these plain structs cannot fail; an empty object keeps the status meaningful
    // should it ever do so.
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // A cached probe answer is a wrong probe answer.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
