//! Turns a consumed Kafka record into an [`Event`]: a [`Message`] with a JSON payload, an
//! [`ExciseMessage`] for a null value (tombstone), or a [`DecodeError`] naming the problem and
//! the record.
//!
//! Decoding is generic over rdkafka's [`Message`](RdMessage) trait so the consumer passes its
//! `BorrowedMessage` (no copy of the payload before it is parsed) and unit tests pass an
//! `OwnedMessage` built in memory.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::str::Utf8Error;

use prosody_api::{
    ClassifyError, ErrorClass, ExciseMessage, Headers, Key, Message, Offset, Partition, Payload,
    Timestamp, Topic,
};
use rdkafka::message::Message as RdMessage;

use crate::event::{Event, RejectedRecord};

/// Default largest accepted record value: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The timestamp given to records whose broker reported none (Kafka's `NO_TIMESTAMP`).
const NO_TIMESTAMP: i64 = -1;

/// Why a record cannot be given to a handler.
#[derive(Debug, thiserror::Error)]
pub enum DecodeProblem {
    /// The record has no key; Prosody orders and stores everything per key.
    #[error("the key is missing")]
    MissingKey,
    /// The key is zero bytes long.
    #[error("the key is empty")]
    EmptyKey,
    /// The key bytes are not UTF-8.
    #[error("the key is not valid UTF-8: {0}")]
    KeyNotUtf8(#[source] Utf8Error),
    /// The value is larger than the configured maximum.
    #[error("the value is {size} bytes, over the limit of {max} bytes")]
    ValueTooLarge {
        /// Size of the value in bytes.
        size: usize,
        /// The configured maximum in bytes.
        max: usize,
    },
    /// The value is not a JSON document.
    #[error("the value is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
}

/// A record that could not be decoded, with where it lives so it can be logged, committed past
/// and routed to the failure topic.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode record at {topic}/{partition}@{offset}: {problem}")]
pub struct DecodeError {
    /// Topic of the record.
    pub topic: Topic,
    /// Partition of the record.
    pub partition: Partition,
    /// Offset of the record.
    pub offset: Offset,
    /// What is wrong with it.
    #[source]
    pub problem: DecodeProblem,
}

/// The same bytes fail the same way on every attempt.
impl ClassifyError for DecodeError {
    fn error_class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

/// Limits applied while decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeLimits {
    /// The largest accepted record value, in bytes (inclusive).
    pub max_value_bytes: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_value_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

/// A record taken off a partition queue, validated and copied but not yet checked as JSON: its
/// partition's reader only checks what routing needs (the key) and the size limit, so the JSON
/// check happens in the runner that handles the record, in parallel with others.
#[derive(Debug, Clone)]
pub struct Captured {
    topic: Topic,
    partition: Partition,
    offset: Offset,
    timestamp: Timestamp,
    key: Key,
    headers: Headers,
    value: Option<Vec<u8>>,
}

impl Captured {
    /// The record's key.
    #[must_use]
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The record's offset.
    #[must_use]
    pub fn offset(&self) -> Offset {
        self.offset
    }

    /// [`into_event`](Self::into_event) for the engine: a value that is not JSON becomes an
    /// [`Event::Rejected`] carrying the raw bytes, so the failure policy can forward them.
    #[must_use]
    pub fn into_routable(self) -> Event {
        self.parse().unwrap_or_else(|(error, record)| {
            Event::Rejected(Box::new(record.into_rejected(error.to_string())))
        })
    }

    /// Checks the value: a null value is an excise record, anything else must be JSON (kept
    /// as text; see [`Payload`]).
    ///
    /// # Errors
    /// [`DecodeProblem::NotJson`] when the value is not JSON.
    pub fn into_event(self) -> Result<Event, DecodeError> {
        self.parse().map_err(|(error, _)| error)
    }

    /// [`into_event`](Self::into_event), with a rejected record given back beside the error.
    fn parse(mut self) -> Result<Event, (DecodeError, Box<Self>)> {
        let Some(value) = self.value.take() else {
            return Ok(Event::Excise(ExciseMessage {
                topic: self.topic,
                partition: self.partition,
                offset: self.offset,
                timestamp: self.timestamp,
                key: self.key,
                headers: self.headers,
            }));
        };
        match Payload::from_json_bytes(value) {
            Ok(payload) => Ok(Event::Message(Message {
                topic: self.topic,
                partition: self.partition,
                offset: self.offset,
                timestamp: self.timestamp,
                key: self.key,
                payload,
                headers: self.headers,
            })),
            Err(invalid) => {
                let (error, bytes) = invalid.into_parts();
                self.value = Some(bytes);
                let error = DecodeError {
                    topic: self.topic.clone(),
                    partition: self.partition,
                    offset: self.offset,
                    problem: DecodeProblem::NotJson(error),
                };
                Err((error, Box::new(self)))
            }
        }
    }

    /// The record as a [`RejectedRecord`] with its raw key and value, rejected for `reason`.
    fn into_rejected(self, reason: String) -> RejectedRecord {
        RejectedRecord {
            raw_key: Some(self.key.as_str().as_bytes().to_vec()),
            topic: self.topic,
            partition: self.partition,
            offset: self.offset,
            key: self.key,
            raw_value: self.value,
            headers: self.headers,
            reason,
        }
    }
}

/// Validates and copies a record for routing: key present, non-empty and UTF-8, value within
/// the size limit. `topic` is the record's topic, passed in so the caller can share one
/// allocation for every record of a partition.
///
/// # Errors
/// A [`DecodeError`] naming the record and the problem.
pub fn capture<M: RdMessage>(
    record: &M,
    topic: &Topic,
    limits: &DecodeLimits,
) -> Result<Captured, DecodeError> {
    let fail = |problem| DecodeError {
        topic: topic.clone(),
        partition: Partition(record.partition()),
        offset: Offset(record.offset()),
        problem,
    };
    let key = decode_key(record.key()).map_err(fail)?;
    let value = record.payload();
    if let Some(value) = value
        && value.len() > limits.max_value_bytes
    {
        return Err(fail(DecodeProblem::ValueTooLarge {
            size: value.len(),
            max: limits.max_value_bytes,
        }));
    }
    Ok(Captured {
        topic: topic.clone(),
        partition: Partition(record.partition()),
        offset: Offset(record.offset()),
        timestamp: Timestamp::from_millis(record.timestamp().to_millis().unwrap_or(NO_TIMESTAMP)),
        key,
        headers: record.headers().map(read_headers).unwrap_or_default(),
        value: value.map(<[u8]>::to_vec),
    })
}

/// Decodes a record in one step: [`capture`] then [`Captured::into_event`].
///
/// # Errors
/// As for both steps.
pub fn decode<M: RdMessage>(record: &M, limits: &DecodeLimits) -> Result<Event, DecodeError> {
    capture(record, &Topic::from(record.topic()), limits)?.into_event()
}

/// Keeps what the failure topic needs of a record `decode` rejected: its raw key and value
/// (the value only up to `limits.max_value_bytes`, so an oversized record is not copied) and
/// its headers.
pub fn reject<M: RdMessage>(
    record: &M,
    error: &DecodeError,
    limits: &DecodeLimits,
) -> RejectedRecord {
    let raw_key = record.key().map(<[u8]>::to_vec);
    let key = Key::from(
        raw_key
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default()
            .into_owned(),
    );
    RejectedRecord {
        topic: error.topic.clone(),
        partition: error.partition,
        offset: error.offset,
        key,
        raw_key,
        raw_value: record
            .payload()
            .filter(|value| value.len() <= limits.max_value_bytes)
            .map(<[u8]>::to_vec),
        headers: record.headers().map(read_headers).unwrap_or_default(),
        reason: error.to_string(),
    }
}

fn decode_key(key: Option<&[u8]>) -> Result<Key, DecodeProblem> {
    match key {
        None => Err(DecodeProblem::MissingKey),
        Some([]) => Err(DecodeProblem::EmptyKey),
        Some(bytes) => std::str::from_utf8(bytes)
            .map(Key::from)
            .map_err(DecodeProblem::KeyNotUtf8),
    }
}

/// Copies the record's headers, in order, keeping null values.
///
/// rdkafka panics on a header *name* that is not UTF-8 (it unwraps `CStr::to_str`), and a
/// foreign producer can write one. A bad header must not crash the consumer, so each header is
/// read behind `catch_unwind` and an unreadable one is skipped with a warning.
fn read_headers<H: rdkafka::message::Headers>(source: &H) -> Headers {
    let mut headers = Headers::new();
    for index in 0..source.count() {
        let read = catch_unwind(AssertUnwindSafe(|| {
            source
                .try_get(index)
                .map(|header| (header.key.to_owned(), header.value.map(<[u8]>::to_vec)))
        }));
        match read {
            Ok(Some((name, value))) => headers.push(name, value),
            Ok(None) => {}
            Err(_) => tracing::warn!(index, "skipping a record header whose name is not UTF-8"),
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use prosody_api::record::{SOURCE_SYSTEM_HEADER, TRACEPARENT_HEADER};
    use rdkafka::Timestamp as RdTimestamp;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
    use serde_json::json;

    use super::*;

    fn record(key: Option<&[u8]>, value: Option<&[u8]>) -> OwnedMessage {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: SOURCE_SYSTEM_HEADER,
                value: Some("billing"),
            })
            .insert(Header {
                key: "nullable",
                value: None::<&[u8]>,
            })
            .insert(Header {
                key: TRACEPARENT_HEADER,
                value: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            });
        OwnedMessage::new(
            value.map(<[u8]>::to_vec),
            key.map(<[u8]>::to_vec),
            "orders".to_owned(),
            RdTimestamp::CreateTime(1_700_000_000_000),
            3,
            42,
            Some(headers),
        )
    }

    fn decode_default(record: &OwnedMessage) -> Result<Event, DecodeError> {
        decode(record, &DecodeLimits::default())
    }

    fn problem(result: Result<Event, DecodeError>) -> DecodeError {
        match result {
            Ok(decoded) => panic!("expected a decode error, got {decoded:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn decodes_a_json_message_with_location_and_headers() {
        let decoded = decode_default(&record(
            Some(b"k1"),
            Some(br#"{"type":"order.created","n":1}"#),
        ))
        .expect("valid record");
        let Event::Message(message) = decoded else {
            panic!("expected a message, got {decoded:?}");
        };
        assert_eq!(message.topic, Topic::from("orders"));
        assert_eq!(message.partition, Partition(3));
        assert_eq!(message.offset, Offset(42));
        assert_eq!(message.timestamp, Timestamp::from_millis(1_700_000_000_000));
        assert_eq!(message.key, Key::from("k1"));
        assert_eq!(message.payload, json!({"type": "order.created", "n": 1}));
        assert_eq!(message.headers.source_system(), Some("billing"));
        assert!(message.headers.traceparent().is_some());
        let names: Vec<_> = message.headers.iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            [SOURCE_SYSTEM_HEADER, "nullable", TRACEPARENT_HEADER]
        );
        assert_eq!(message.headers.iter().nth(1), Some(("nullable", None)));
    }

    #[test]
    fn null_value_is_an_excise_record() {
        let decoded = decode_default(&record(Some(b"k1"), None)).expect("tombstone");
        let Event::Excise(excise) = decoded else {
            panic!("expected an excise record, got {decoded:?}");
        };
        assert_eq!(excise.key, Key::from("k1"));
        assert_eq!(excise.offset, Offset(42));
        assert_eq!(excise.headers.source_system(), Some("billing"));
    }

    #[test]
    fn value_that_is_not_json_is_rejected_with_serde_reason() {
        let error = problem(decode_default(&record(Some(b"k1"), Some(b"{not json"))));
        assert!(
            matches!(error.problem, DecodeProblem::NotJson(_)),
            "{error}"
        );
        let text = error.to_string();
        assert!(
            text.starts_with("cannot decode record at orders/3@42: the value is not JSON: "),
            "{text}"
        );
        assert!(
            text.contains("line 1 column 2"),
            "serde's reason is kept: {text}"
        );
        assert!(error.is_permanent());
    }

    #[test]
    fn empty_value_is_not_json() {
        let error = problem(decode_default(&record(Some(b"k1"), Some(b""))));
        assert!(
            matches!(error.problem, DecodeProblem::NotJson(_)),
            "{error}"
        );
    }

    #[test]
    fn value_over_the_limit_is_rejected_with_sizes() {
        let big = format!("\"{}\"", "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES));
        let error = problem(decode_default(&record(Some(b"k1"), Some(big.as_bytes()))));
        assert_eq!(
            error.to_string(),
            format!(
                "cannot decode record at orders/3@42: the value is {} bytes, over the limit of 1048576 bytes",
                DEFAULT_MAX_PAYLOAD_BYTES + 2
            )
        );
    }

    #[test]
    fn limit_is_configurable_and_inclusive() {
        let limits = DecodeLimits { max_value_bytes: 3 };
        assert!(decode(&record(Some(b"k1"), Some(b"123")), &limits).is_ok());
        let error = problem(decode(&record(Some(b"k1"), Some(b"1234")), &limits));
        assert!(
            matches!(
                error.problem,
                DecodeProblem::ValueTooLarge { size: 4, max: 3 }
            ),
            "{error}"
        );
    }

    #[test]
    fn empty_key_is_rejected() {
        let error = problem(decode_default(&record(Some(b""), Some(b"{}"))));
        assert!(matches!(error.problem, DecodeProblem::EmptyKey), "{error}");
        assert_eq!(
            error.to_string(),
            "cannot decode record at orders/3@42: the key is empty"
        );
    }

    #[test]
    fn key_that_is_not_utf8_is_rejected() {
        let error = problem(decode_default(&record(
            Some(&[0x66, 0xff, 0xfe]),
            Some(b"{}"),
        )));
        assert!(
            matches!(error.problem, DecodeProblem::KeyNotUtf8(_)),
            "{error}"
        );
        assert!(
            error.to_string().contains("the key is not valid UTF-8"),
            "{error}"
        );
    }

    #[test]
    fn missing_key_is_rejected_for_messages_and_excises() {
        for value in [Some(&b"{}"[..]), None] {
            let error = problem(decode_default(&record(None, value)));
            assert!(
                matches!(error.problem, DecodeProblem::MissingKey),
                "{error}"
            );
            assert_eq!(
                error.to_string(),
                "cannot decode record at orders/3@42: the key is missing"
            );
        }
    }

    #[test]
    fn routable_event_turns_a_value_that_is_not_json_into_a_rejected_event() {
        let limits = DecodeLimits::default();
        let bad = record(Some(b"k1"), Some(b"{not json"));
        let routed = capture(&bad, &Topic::from("orders"), &limits)
            .expect("key and size are fine")
            .into_routable();
        let Event::Rejected(rejected) = routed else {
            panic!("expected a rejected event, got {routed:?}");
        };
        assert_eq!(rejected.raw_value.as_deref(), Some(&b"{not json"[..]));
        assert_eq!(rejected.raw_key.as_deref(), Some(&b"k1"[..]));
        assert!(
            rejected
                .reason
                .starts_with("cannot decode record at orders/3@42: the value is not JSON"),
            "{}",
            rejected.reason
        );
        let good = record(Some(b"k1"), Some(b"{}"));
        let routed = capture(&good, &Topic::from("orders"), &limits)
            .expect("fine")
            .into_routable();
        assert!(matches!(routed, Event::Message(_)), "{routed:?}");
    }

    #[test]
    fn rejected_record_keeps_raw_parts_but_not_an_oversized_value() {
        let limits = DecodeLimits { max_value_bytes: 4 };
        let bad_key = record(Some(&[0x66, 0xff]), Some(b"{}"));
        let error = problem(decode(&bad_key, &limits));
        let rejected = reject(&bad_key, &error, &limits);
        assert_eq!(rejected.raw_key.as_deref(), Some(&[0x66, 0xff][..]));
        assert_eq!(rejected.key, Key::from("f\u{fffd}"));
        assert_eq!(rejected.raw_value.as_deref(), Some(&b"{}"[..]));
        assert_eq!(rejected.offset, Offset(42));
        assert_eq!(rejected.headers.source_system(), Some("billing"));
        assert_eq!(rejected.reason, error.to_string());

        let big = record(Some(b"k"), Some(b"12345"));
        let error = problem(decode(&big, &limits));
        let rejected = reject(&big, &error, &limits);
        assert_eq!(rejected.raw_value, None);
        assert!(
            rejected.reason.contains("over the limit"),
            "{}",
            rejected.reason
        );
    }

    #[test]
    fn missing_timestamp_and_headers_are_tolerated() {
        let bare = OwnedMessage::new(
            Some(b"[1,2]".to_vec()),
            Some(b"k".to_vec()),
            "t".to_owned(),
            RdTimestamp::NotAvailable,
            0,
            0,
            None,
        );
        let Event::Message(message) = decode_default(&bare).expect("valid") else {
            panic!("expected a message");
        };
        assert_eq!(message.timestamp, Timestamp::from_millis(-1));
        assert!(message.headers.is_empty());
        assert_eq!(message.payload, json!([1, 2]));
    }
}
