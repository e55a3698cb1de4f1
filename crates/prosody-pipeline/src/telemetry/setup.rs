//! Process-wide logging and trace export.
//!
//! [`init_tracing`] installs a `tracing` subscriber: log lines filtered by the `PROSODY_LOG`
//! directives and, when the standard OTLP variables name an endpoint
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), an OpenTelemetry
//! layer exporting spans over OTLP/HTTP (protobuf), configured by the other `OTEL_*`
//! variables. An application that installed its own subscriber first keeps it: Prosody's
//! spans then go wherever that subscriber sends them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::warn;
use tracing_subscriber::layer::{Layer, Layered, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, fmt};

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// False only when Prosody installed the subscriber itself without a trace exporter: then no
/// layer records handler spans, and creating one per attempt would be pure cost. With the
/// application's own subscriber we cannot tell, so spans are made.
static HANDLER_SPANS: AtomicBool = AtomicBool::new(true);

/// Whether the telemetry layer should create handler spans.
#[must_use]
pub fn handler_spans_wanted() -> bool {
    HANDLER_SPANS.load(Ordering::Relaxed)
}

/// True when the environment asks for OTLP trace export.
fn otlp_requested() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|value| value.trim() == "true")
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|value| value.trim() == "none");
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

fn otlp_provider() -> Option<SdkTracerProvider> {
    if !otlp_requested() {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(exporter) => exporter,
        Err(error) => {
            warn!(%error, "OTLP trace export requested but unavailable: spans are not exported");
            return None;
        }
    };
    Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .build(),
    )
}

/// Installs the process's `tracing` subscriber with `filter` (`PROSODY_LOG` directives, e.g.
/// `info,prosody_pipeline=debug`), log lines to standard error. Returns false when a subscriber
/// was already installed, by the application or an earlier call; the existing one is kept.
// Installing is the point of the call; the answer is for callers that care.
#[allow(clippy::must_use_candidate)]
pub fn init_tracing(filter: &str) -> bool {
    init_tracing_with(filter, fmt::layer())
}

/// As [`init_tracing`], with `output` writing the log lines instead of the standard-error
/// formatter (the Node.js binding forwards them to the JavaScript logger). Span export over
/// OTLP, and whether handler spans are made at all, follow the same rules whatever the output.
pub fn init_tracing_with<L>(filter: &str, output: L) -> bool
where
    L: Layer<Layered<EnvFilter, Registry>> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = otlp_provider();
    let otel = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("prosody")));
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .with(otel)
        .try_init()
        .is_ok();
    if installed {
        HANDLER_SPANS.store(provider.is_some(), Ordering::Relaxed);
        if let Some(provider) = provider {
            opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
            opentelemetry::global::set_tracer_provider(provider.clone());
            let _ = PROVIDER.set(provider);
        }
    }
    installed
}

/// Exports the spans buffered so far (no-op without OTLP export).
pub fn flush_tracing() {
    if let Some(provider) = PROVIDER.get()
        && let Err(error) = provider.force_flush()
    {
        warn!(%error, "flushing spans failed");
    }
}

/// Flushes and stops span export; later spans are not exported.
pub fn shutdown_tracing() {
    if let Some(provider) = PROVIDER.get()
        && let Err(error) = provider.shutdown()
    {
        warn!(%error, "stopping span export failed");
    }
}
