//! The unit of work of a key queue.

use prosody_api::{ExciseMessage, Key, Message, Offset};

/// One event of one key, in the order it must be handled relative to the key's other events.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A record with a JSON value.
    Message(Message),
    /// A record with a null value: delete every copy of the key's data.
    Excise(ExciseMessage),
}

impl Event {
    /// The key the event belongs to; it decides the queue the event waits in.
    #[must_use]
    pub fn key(&self) -> &Key {
        match self {
            Self::Message(message) => &message.key,
            Self::Excise(excise) => &excise.key,
        }
    }

    /// The Kafka offset the event came from, when it came from a record.
    #[must_use]
    pub fn offset(&self) -> Option<Offset> {
        match self {
            Self::Message(message) => Some(message.offset),
            Self::Excise(excise) => Some(excise.offset),
        }
    }
}
