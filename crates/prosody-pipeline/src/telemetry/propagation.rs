//! W3C trace context (`traceparent`, `tracestate`) between Kafka headers and `tracing` spans.
//!
//! One [`TraceContextPropagator`] is used on both sides rather than the global propagator, so
//! propagation works whatever the application installed globally.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use prosody_api::Headers;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::kafka::headers::{HeaderInjector, OutgoingHeaders};

/// How a handler span relates to the span found in its record's headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpanRelation {
    /// The handler span is a child of the producer's span: one trace.
    #[default]
    Child,
    /// The handler span starts a new trace with a link to the producer's span.
    FollowsFrom,
}

struct ConsumedHeaders<'a>(&'a Headers);

impl Extractor for ConsumedHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get_str(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name).collect()
    }
}

/// The remote context carried by `headers`; `None` when they carry no valid `traceparent`.
#[must_use]
pub fn parent_context(headers: &Headers) -> Option<Context> {
    headers.traceparent()?;
    let context = TraceContextPropagator::new().extract(&ConsumedHeaders(headers));
    context.span().span_context().is_valid().then_some(context)
}

/// Relates `span` to the context in `headers` as `relation` says. Does nothing without a
/// valid context or without an OpenTelemetry layer in the subscriber.
pub fn relate(span: &tracing::Span, headers: &Headers, relation: SpanRelation) {
    let Some(parent) = parent_context(headers) else {
        return;
    };
    match relation {
        SpanRelation::Child => {
            // Fails only when the span was already started by the OpenTelemetry layer, which
            // cannot happen for a span created a moment ago.
            let _ = span.set_parent(parent);
        }
        SpanRelation::FollowsFrom => span.add_link(parent.span().span_context().clone()),
    }
}

struct OutgoingInjector<'a>(&'a mut OutgoingHeaders);

impl Injector for OutgoingInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.set(key, value);
    }
}

/// Writes the current `tracing` span's context into produced records, so a consumer's
/// handler span continues the trace that sent the record.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceInjector;

impl HeaderInjector for TraceInjector {
    fn inject(&self, headers: &mut OutgoingHeaders) {
        let context = tracing::Span::current().context();
        if context.span().span_context().is_valid() {
            TraceContextPropagator::new().inject_context(&context, &mut OutgoingInjector(headers));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn extracts_a_valid_traceparent_only() {
        let headers = Headers::new().with("traceparent", PARENT);
        let context = parent_context(&headers).expect("valid");
        assert_eq!(
            context.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(parent_context(&Headers::new()).is_none());
        assert!(parent_context(&Headers::new().with("traceparent", "garbage")).is_none());
    }

    #[test]
    fn injector_writes_nothing_outside_a_trace() {
        let mut headers = OutgoingHeaders::new();
        TraceInjector.inject(&mut headers);
        assert_eq!(headers.iter().count(), 0);
    }
}
