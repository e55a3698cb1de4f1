//! Observability: logging and OpenTelemetry tracing setup, W3C trace-context propagation
//! through Kafka headers, and lifecycle events produced to the telemetry topic.
//!
//! The handler span and the lifecycle events are emitted by the
//! [`telemetry` layer](crate::middleware::telemetry); this module holds what that layer and
//! the producer share.

pub mod clock;
pub mod events;
pub mod propagation;
pub mod setup;
pub mod sink;

pub use clock::{Moment, WallAnchor};
pub use events::{EventRecord, LifecycleEvent, Stage};
pub use propagation::{SpanRelation, TraceInjector, parent_context};
pub use setup::{
    flush_tracing, handler_spans_wanted, init_tracing, init_tracing_with, shutdown_tracing,
};
pub use sink::{SinkError, TelemetrySink};
