//! The unit of work of a key queue.

use prosody_api::{
    ExciseMessage, Headers, Key, Message, Offset, Partition, Timer, TimerKind, Topic,
};

/// One event of one key, in the order it must be handled relative to the key's other events.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A record with a JSON value.
    Message(Message),
    /// A record with a null value: delete every copy of the key's data.
    Excise(ExciseMessage),
    /// A stored timer of the key came due. It has no Kafka offset: it is done when the timer is
    /// removed from the store, not when an offset commits.
    Timer(FiredTimer),
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
            Self::Timer(fired) => &fired.timer.key,
            Self::Rejected(rejected) => &rejected.key,
        }
    }

    /// The Kafka offset the event came from, when it came from a record.
    #[must_use]
    pub fn offset(&self) -> Option<Offset> {
        match self {
            Self::Message(message) => Some(message.offset),
            Self::Excise(excise) => Some(excise.offset),
            Self::Timer(_) => None,
            Self::Rejected(rejected) => Some(rejected.offset),
        }
    }

    /// The topic and partition the event belongs to (for a timer, the partition whose store
    /// scope holds it).
    #[must_use]
    pub fn source(&self) -> (&Topic, Partition) {
        match self {
            Self::Message(message) => (&message.topic, message.partition),
            Self::Excise(excise) => (&excise.topic, excise.partition),
            Self::Timer(fired) => (&fired.topic, fired.partition),
            Self::Rejected(rejected) => (&rejected.topic, rejected.partition),
        }
    }
}

/// A timer that came due, with the partition it is stored under. The kind decides who handles
/// it: application timers go to `on_timer`, defer-retry timers to the defer middleware.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FiredTimer {
    /// The topic of the owning partition.
    pub topic: Topic,
    /// The owning partition.
    pub partition: Partition,
    /// Who scheduled it.
    pub kind: TimerKind,
    /// The key and due time, as the handler receives them.
    pub timer: Timer,
}
