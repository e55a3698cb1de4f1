//! Decoding Kafka records into events (provisional; replaced by the full decoder).

use prosody_api::{ExciseMessage, Headers, Key, Message, Offset, Partition, Timestamp, Topic};
use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Headers as _};

use crate::event::Event;

/// Limits applied while decoding.
#[derive(Clone, Debug)]
pub struct DecodeLimits {
    /// The largest accepted record value, in bytes.
    pub max_value_bytes: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_value_bytes: 1024 * 1024,
        }
    }
}

/// Why a record cannot become an event.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The record has no key or an empty one.
    #[error("record has no key")]
    MissingKey,
    /// The key is not UTF-8.
    #[error("record key is not UTF-8")]
    KeyNotUtf8,
    /// The value is too large.
    #[error("record value of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Value size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The value is not JSON.
    #[error("record value is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
}

/// Decodes a record: a null value is an excise record, anything else must be JSON.
///
/// # Errors
/// When the key is missing, empty or not UTF-8, or the value is too large or not JSON.
pub fn decode(record: &BorrowedMessage<'_>, limits: &DecodeLimits) -> Result<Event, DecodeError> {
    let key = match record.key() {
        None | Some([]) => return Err(DecodeError::MissingKey),
        Some(bytes) => std::str::from_utf8(bytes).map_err(|_| DecodeError::KeyNotUtf8)?,
    };
    let mut headers = Headers::new();
    if let Some(borrowed) = record.headers() {
        for header in borrowed.iter() {
            headers.push(header.key, header.value.map(<[u8]>::to_vec));
        }
    }
    let topic = Topic::from(record.topic());
    let partition = Partition(record.partition());
    let offset = Offset(record.offset());
    let timestamp = Timestamp::from_millis(record.timestamp().to_millis().unwrap_or(0));
    let key = Key::from(key);
    let Some(value) = record.payload() else {
        return Ok(Event::Excise(ExciseMessage {
            topic,
            partition,
            offset,
            timestamp,
            key,
            headers,
        }));
    };
    if value.len() > limits.max_value_bytes {
        return Err(DecodeError::TooLarge {
            size: value.len(),
            limit: limits.max_value_bytes,
        });
    }
    Ok(Event::Message(Message {
        topic,
        partition,
        offset,
        timestamp,
        key,
        payload: serde_json::from_slice(value)?,
        headers,
    }))
}
