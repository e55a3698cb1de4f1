//! Rust `tracing` events to the JavaScript logger.
//!
//! [`install`] sets the global subscriber once: an `EnvFilter` from `PROSODY_LOG` (default
//! `info`) and a layer that formats each event (message and fields) and queues it to the
//! JavaScript `log(level, target, message)` function registered by [`set_log_sink`]. `index.js`
//! forwards it to the current logger (`setLogger`). The threadsafe function is weak (logging
//! never keeps the process alive) and its queue is bounded: when JavaScript falls behind,
//! records are dropped rather than piling up.
//!
//! Before a sink is registered, events go to standard error. Spans are exported over OTLP when
//! the standard `OTEL_*` variables name an endpoint, exactly as in a Rust service.

use std::fmt::Write as _;
use std::sync::{LazyLock, Once};

use napi::Status;
use napi::bindgen_prelude::{FnArgs, Function};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use parking_lot::RwLock;
use prosody::pipeline::telemetry;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

/// Log records queued to JavaScript at most; more are dropped until it catches up.
const LOG_QUEUE: usize = 4096;

type LogArgs = (u32, String, String);
type LogFn =
    ThreadsafeFunction<FnArgs<LogArgs>, (), FnArgs<LogArgs>, Status, false, true, LOG_QUEUE>;

static SINK: LazyLock<RwLock<Option<LogFn>>> = LazyLock::new(|| RwLock::new(None));
static INSTALL: Once = Once::new();

/// Installs the global `tracing` subscriber (once; later calls do nothing). Another subscriber
/// installed first by the embedding process wins.
pub fn install() {
    INSTALL.call_once(|| {
        // The pipeline's setup, so span export over OTLP (the `OTEL_*` variables) works as in
        // Rust services, with the log lines going to JavaScript instead of standard error.
        let filter = std::env::var("PROSODY_LOG").unwrap_or_else(|_| "info".to_owned());
        telemetry::init_tracing_with(&filter, JsLayer);
    });
}

/// Prepares logging: installs the subscriber. Idempotent.
#[napi]
pub fn initialize() {
    install();
}

/// Exports the spans buffered so far (nothing without OTLP export configured).
#[napi]
pub async fn flush_telemetry() {
    // The exporter blocks on its HTTP request: off the async workers.
    let _ = tokio::task::spawn_blocking(telemetry::flush_tracing).await;
}

/// Exports the spans buffered so far and stops span export.
#[napi]
pub async fn shutdown_telemetry() {
    let _ = tokio::task::spawn_blocking(telemetry::shutdown_tracing).await;
}

/// Registers `log(level, target, message)` as the destination of Rust log records; levels are
/// 0 error, 1 warn, 2 info, 3 debug, 4 trace.
///
/// # Errors
/// When the threadsafe function cannot be created.
#[napi]
pub fn set_log_sink(log: Function<'_, FnArgs<LogArgs>, ()>) -> napi::Result<()> {
    let sink = log
        .build_threadsafe_function::<FnArgs<LogArgs>>()
        .weak::<true>()
        .max_queue_size::<LOG_QUEUE>()
        .build()?;
    *SINK.write() = Some(sink);
    install();
    Ok(())
}

fn level_code(level: Level) -> u32 {
    match level {
        Level::ERROR => 0,
        Level::WARN => 1,
        Level::INFO => 2,
        Level::DEBUG => 3,
        Level::TRACE => 4,
    }
}

#[derive(Default)]
struct Formatter {
    message: String,
    fields: String,
}

impl Visit for Formatter {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

struct JsLayer;

impl<S: Subscriber> tracing_subscriber::Layer<S> for JsLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut formatter = Formatter::default();
        event.record(&mut formatter);
        let mut text = formatter.message;
        text.push_str(&formatter.fields);
        let metadata = event.metadata();
        let level = *metadata.level();
        let target = metadata.target().to_owned();
        let sink = SINK.read();
        match sink.as_ref() {
            Some(sink) => {
                // Queue full or Node.js exiting: the record is dropped, by design.
                let _ = sink.call(
                    FnArgs::from((level_code(level), target, text)),
                    ThreadsafeFunctionCallMode::NonBlocking,
                );
            }
            None => eprintln!("{level} {target}: {text}"),
        }
    }
}
