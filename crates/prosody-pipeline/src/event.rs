//! The unit of work of a key queue.

use prosody_api::{ExciseMessage, Headers, Key, Message, Offset, Partition, Topic};

/// One event of one key, in the order it must be handled relative to the key's other events.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A record with a JSON value.
    Message(Message),
    /// A record with a null value: delete every copy of the key's data.
    Excise(ExciseMessage),
    /// A record that cannot be given to a handler (it failed to decode). It still queues and
    /// commits like any record so the mode's failure policy can route it (the failure topic)
    /// before its offset is committed.
    Rejected(Box<RejectedRecord>),
}

/// An undecodable record: its raw parts, for the failure topic, and why it was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedRecord {
    /// Topic of the record.
    pub topic: Topic,
    /// Partition of the record.
    pub partition: Partition,
    /// Offset of the record.
    pub offset: Offset,
    /// The queue the record waits in: its key read as lossy UTF-8 (empty when missing).
    pub key: Key,
    /// The raw key bytes.
    pub raw_key: Option<Vec<u8>>,
    /// The raw value bytes; `None` when the value was too large to keep.
    pub raw_value: Option<Vec<u8>>,
    /// The record's headers.
    pub headers: Headers,
    /// What is wrong with it, naming the record (the decoder's error text).
    pub reason: String,
}

impl Event {
    /// The key the event belongs to; it decides the queue the event waits in.
    #[must_use]
    pub fn key(&self) -> &Key {
        match self {
            Self::Message(message) => &message.key,
            Self::Excise(excise) => &excise.key,
            Self::Rejected(rejected) => &rejected.key,
        }
    }

    /// The Kafka offset the event came from, when it came from a record.
    #[must_use]
    pub fn offset(&self) -> Option<Offset> {
        match self {
            Self::Message(message) => Some(message.offset),
            Self::Excise(excise) => Some(excise.offset),
            Self::Rejected(rejected) => Some(rejected.offset),
        }
    }
}
