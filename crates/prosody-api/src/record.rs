//! The records a handler receives: [`Message`] and [`ExciseMessage`].
//!
//! Headers are kept as an ordered list of raw bytes because Kafka allows repeated and null
//! header values; the accessors name the few headers Prosody itself reads (tracing and
//! `source-system`), and everything else passes through untouched.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::key::{Key, Offset, Partition, Topic};
use crate::payload::Payload;

/// The header a producer stamps with its source system; a consumer skips records whose value
/// equals its own group id so a service never consumes its own output.
pub const SOURCE_SYSTEM_HEADER: &str = "source-system";
/// W3C trace context header carrying the parent span.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// W3C trace state header accompanying [`TRACEPARENT_HEADER`].
pub const TRACESTATE_HEADER: &str = "tracestate";

/// A Kafka record timestamp: milliseconds since the Unix epoch, as Kafka stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// A timestamp from milliseconds since the Unix epoch.
    #[must_use]
    pub const fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    #[must_use]
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// The same instant as a [`SystemTime`].
    #[must_use]
    pub fn to_system_time(self) -> SystemTime {
        let magnitude = Duration::from_millis(self.0.unsigned_abs());
        if self.0 >= 0 {
            UNIX_EPOCH + magnitude
        } else {
            UNIX_EPOCH - magnitude
        }
    }
}

/// Kafka record headers in their original order. Names may repeat and values may be null.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    entries: Vec<(String, Option<Vec<u8>>)>,
}

impl Headers {
    /// No headers.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a header; an existing header of the same name is kept (Kafka allows repeats).
    pub fn push(&mut self, name: impl Into<String>, value: Option<Vec<u8>>) {
        self.entries.push((name.into(), value));
    }

    /// Builder form of [`Headers::push`] for a non-null value.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.push(name, Some(value.into()));
        self
    }

    /// The value of the last header with this name. The last one wins because a later stage
    /// (a retry, a re-send) appends rather than rewrites. `None` when absent or null.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .rev()
            .find(|(header, _)| header == name)
            .and_then(|(_, value)| value.as_deref())
    }

    /// [`Headers::get`] decoded as UTF-8; `None` also when the bytes are not UTF-8, because a
    /// malformed header must not fail the record.
    #[must_use]
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name)
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
    }

    /// The `source-system` header.
    #[must_use]
    pub fn source_system(&self) -> Option<&str> {
        self.get_str(SOURCE_SYSTEM_HEADER)
    }

    /// The `traceparent` header.
    #[must_use]
    pub fn traceparent(&self) -> Option<&str> {
        self.get_str(TRACEPARENT_HEADER)
    }

    /// The `tracestate` header.
    #[must_use]
    pub fn tracestate(&self) -> Option<&str> {
        self.get_str(TRACESTATE_HEADER)
    }

    /// All headers in record order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.entries
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_deref()))
    }

    /// Number of headers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no headers.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A Kafka record with a JSON payload, as given to [`crate::EventHandler::on_message`].
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Topic the record was read from.
    pub topic: Topic,
    /// Partition the record was read from.
    pub partition: Partition,
    /// Offset of the record in its partition.
    pub offset: Offset,
    /// Record timestamp.
    pub timestamp: Timestamp,
    /// Record key.
    pub key: Key,
    /// The record's JSON value: its text, and the parsed [`serde_json::Value`] on first use
    /// (`payload["field"]` reads it like a `Value`).
    pub payload: Payload,
    /// Record headers (tracing context, `source-system`, and any others).
    pub headers: Headers,
}

/// A Kafka record with a null value (a tombstone), as given to
/// [`crate::EventHandler::on_excise`]: the handler must delete every copy of the key's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExciseMessage {
    /// Topic the record was read from.
    pub topic: Topic,
    /// Partition the record was read from.
    pub partition: Partition,
    /// Offset of the record in its partition.
    pub offset: Offset,
    /// Record timestamp.
    pub timestamp: Timestamp,
    /// The key whose data must be excised.
    pub key: Key,
    /// Record headers.
    pub headers: Headers,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_header_wins_and_null_reads_as_absent() {
        let mut headers = Headers::new()
            .with(SOURCE_SYSTEM_HEADER, "first")
            .with(SOURCE_SYSTEM_HEADER, "second");
        assert_eq!(headers.source_system(), Some("second"));
        headers.push(TRACEPARENT_HEADER, None);
        assert_eq!(headers.traceparent(), None);
        assert_eq!(headers.len(), 3);
    }

    #[test]
    fn non_utf8_header_is_absent_as_text_but_present_as_bytes() {
        let headers = Headers::new().with(TRACESTATE_HEADER, vec![0xff, 0xfe]);
        assert_eq!(headers.tracestate(), None);
        assert_eq!(headers.get(TRACESTATE_HEADER), Some(&[0xff, 0xfe][..]));
    }

    #[test]
    fn timestamps_convert_both_sides_of_the_epoch() {
        assert_eq!(
            Timestamp::from_millis(1_500).to_system_time(),
            UNIX_EPOCH + Duration::from_millis(1_500)
        );
        assert_eq!(
            Timestamp::from_millis(-1_500).to_system_time(),
            UNIX_EPOCH - Duration::from_millis(1_500)
        );
    }
}
