//! What waits in a key queue: a captured record (parsed when its turn comes) or a ready event.

use prosody_api::{Key, Offset};

use crate::event::Event;
use crate::kafka::decode::Captured;

/// Anything that belongs to one key and may carry a Kafka offset.
pub trait Keyed {
    /// The key whose queue the item waits in.
    fn key(&self) -> &Key;
    /// The Kafka offset the item came from, if any (timers have none).
    fn offset(&self) -> Option<Offset>;
}

/// One unit of work of a key queue.
#[derive(Debug)]
pub enum Work {
    /// A record from Kafka, validated but not yet parsed.
    Record(Captured),
    /// An event ready to dispatch.
    Event(Event),
}

impl Keyed for Work {
    fn key(&self) -> &Key {
        match self {
            Self::Record(record) => record.key(),
            Self::Event(event) => event.key(),
        }
    }

    fn offset(&self) -> Option<Offset> {
        match self {
            Self::Record(record) => Some(record.offset()),
            Self::Event(event) => event.offset(),
        }
    }
}

impl Keyed for Event {
    fn key(&self) -> &Key {
        Event::key(self)
    }

    fn offset(&self) -> Option<Offset> {
        Event::offset(self)
    }
}

impl From<Event> for Work {
    fn from(event: Event) -> Self {
        Self::Event(event)
    }
}

impl From<Captured> for Work {
    fn from(record: Captured) -> Self {
        Self::Record(record)
    }
}
