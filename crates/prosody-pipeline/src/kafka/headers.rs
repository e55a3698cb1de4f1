//! Headers Prosody writes on every produced record, and the hook through which telemetry adds
//! the W3C trace context.
//!
//! The producer does not depend on OpenTelemetry: the telemetry layer implements
//! [`HeaderInjector`] (typically by running the global text-map propagator over the current
//! `tracing` span) and hands it to [`Producer::with_injector`](super::Producer::with_injector).

use std::fmt;

pub use prosody_api::record::{SOURCE_SYSTEM_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER};
use rdkafka::message::{Header, OwnedHeaders};

/// Headers of a record about to be produced, in insertion order, one value per name.
///
/// Its [`set`](Self::set) has the shape of OpenTelemetry's `Injector::set` so a propagator can
/// write into it through a one-line adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutgoingHeaders {
    entries: Vec<(String, String)>,
}

impl OutgoingHeaders {
    /// An empty header set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `value`, replacing an earlier value of the same name so a record never
    /// carries two conflicting trace parents.
    pub fn set(&mut self, name: &str, value: String) {
        match self
            .entries
            .iter_mut()
            .find(|(existing, _)| existing == name)
        {
            Some(entry) => entry.1 = value,
            None => self.entries.push((name.to_owned(), value)),
        }
    }

    /// The value of `name`, if set.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(existing, _)| existing == name)
            .map(|(_, value)| value.as_str())
    }

    /// Header names and values in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// The librdkafka representation.
    #[must_use]
    pub fn to_kafka(&self) -> OwnedHeaders {
        self.entries.iter().fold(
            OwnedHeaders::new_with_capacity(self.entries.len()),
            |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: Some(value.as_str()),
                })
            },
        )
    }
}

/// An explicit W3C trace context for one send, for callers that carry it themselves (for
/// example a JavaScript caller passing its own `traceparent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The `traceparent` header value, e.g. `00-<trace id>-<span id>-01`.
    pub traceparent: String,
    /// The optional `tracestate` header value.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// A context with only a `traceparent`.
    #[must_use]
    pub fn new(traceparent: impl Into<String>) -> Self {
        Self {
            traceparent: traceparent.into(),
            tracestate: None,
        }
    }

    fn write_to(&self, headers: &mut OutgoingHeaders) {
        headers.set(TRACEPARENT_HEADER, self.traceparent.clone());
        if let Some(state) = &self.tracestate {
            headers.set(TRACESTATE_HEADER, state.clone());
        }
    }
}

/// Writes context headers (W3C `traceparent`/`tracestate`, baggage...) for the record being
/// produced, usually taken from the current `tracing` span.
///
/// Closures `Fn(&mut OutgoingHeaders)` implement it.
pub trait HeaderInjector: Send + Sync {
    /// Adds headers to `headers`; adding nothing is fine when no trace is active.
    fn inject(&self, headers: &mut OutgoingHeaders);
}

impl<F> HeaderInjector for F
where
    F: Fn(&mut OutgoingHeaders) + Send + Sync,
{
    fn inject(&self, headers: &mut OutgoingHeaders) {
        self(headers);
    }
}

/// The injector used until telemetry installs one: adds nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoInjector;

impl HeaderInjector for NoInjector {
    fn inject(&self, _headers: &mut OutgoingHeaders) {}
}

/// Builds the headers of one record.
///
/// Precedence, lowest first: the injector (ambient span), then the caller's explicit trace
/// context (it knows better than the ambient span), then `source-system`, which nothing may
/// override because consumers rely on it for loop prevention.
pub(crate) fn build_headers(
    source_system: &str,
    injector: &dyn HeaderInjector,
    explicit: Option<&TraceContext>,
) -> OutgoingHeaders {
    let mut headers = OutgoingHeaders::new();
    injector.inject(&mut headers);
    if let Some(context) = explicit {
        context.write_to(&mut headers);
    }
    headers.set(SOURCE_SYSTEM_HEADER, source_system.to_owned());
    headers
}

impl fmt::Debug for dyn HeaderInjector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HeaderInjector")
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers;

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const OTHER_PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn stamps_source_system_without_trace_context() {
        let headers = build_headers("billing", &NoInjector, None);
        assert_eq!(headers.get(SOURCE_SYSTEM_HEADER), Some("billing"));
        assert_eq!(headers.get(TRACEPARENT_HEADER), None);
        assert_eq!(headers.iter().count(), 1);
    }

    #[test]
    fn explicit_trace_context_is_written() {
        let context = TraceContext {
            traceparent: PARENT.to_owned(),
            tracestate: Some("vendor=1".to_owned()),
        };
        let headers = build_headers("billing", &NoInjector, Some(&context));
        assert_eq!(headers.get(TRACEPARENT_HEADER), Some(PARENT));
        assert_eq!(headers.get(TRACESTATE_HEADER), Some("vendor=1"));
    }

    #[test]
    fn injector_supplies_ambient_context() {
        let injector = |headers: &mut OutgoingHeaders| {
            headers.set(TRACEPARENT_HEADER, PARENT.to_owned());
        };
        let headers = build_headers("billing", &injector, None);
        assert_eq!(headers.get(TRACEPARENT_HEADER), Some(PARENT));
    }

    #[test]
    fn explicit_context_wins_over_injector() {
        let injector = |headers: &mut OutgoingHeaders| {
            headers.set(TRACEPARENT_HEADER, OTHER_PARENT.to_owned());
        };
        let headers = build_headers("billing", &injector, Some(&TraceContext::new(PARENT)));
        assert_eq!(headers.get(TRACEPARENT_HEADER), Some(PARENT));
        assert_eq!(
            headers
                .iter()
                .filter(|(name, _)| *name == TRACEPARENT_HEADER)
                .count(),
            1
        );
    }

    #[test]
    fn injector_cannot_forge_source_system() {
        let injector = |headers: &mut OutgoingHeaders| {
            headers.set(SOURCE_SYSTEM_HEADER, "someone-else".to_owned());
        };
        let headers = build_headers("billing", &injector, None);
        assert_eq!(headers.get(SOURCE_SYSTEM_HEADER), Some("billing"));
    }

    #[test]
    fn converts_to_kafka_headers_in_order() {
        let headers = build_headers("billing", &NoInjector, Some(&TraceContext::new(PARENT)));
        let kafka = headers.to_kafka();
        let pairs: Vec<(String, Option<Vec<u8>>)> = kafka
            .iter()
            .map(|header| (header.key.to_owned(), header.value.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (
                    TRACEPARENT_HEADER.to_owned(),
                    Some(PARENT.as_bytes().to_vec())
                ),
                (SOURCE_SYSTEM_HEADER.to_owned(), Some(b"billing".to_vec())),
            ]
        );
    }
}
