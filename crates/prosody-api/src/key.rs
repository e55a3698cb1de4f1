//! Identifiers: where a record lives in Kafka and which entity it belongs to.
//!
//! They are newtypes rather than bare `String`/`i32`/`i64` so a partition cannot be passed where
//! an offset is expected, and so storage scopes ([`crate::storage::PartitionScope`]) read as what
//! they mean. String identifiers share one immutable `Arc<str>`: a key or topic is cloned into
//! queues, contexts and storage scopes for every event, and a clone must not allocate.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Wraps a string.
            pub fn new(value: impl Into<String>) -> Self {
                Self(Arc::from(value.into()))
            }

            /// The string form.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The string form, copied.
            #[must_use]
            pub fn into_string(self) -> String {
                self.0.to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(Arc::from(value))
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(Arc::from(value))
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id! {
    /// A Kafka topic name.
    Topic
}

string_id! {
    /// A Kafka message key: the entity an event belongs to. Events of one key are processed one
    /// at a time, and timers, deferred work, dedup records and keyed state are stored per key.
    Key
}

string_id! {
    /// A Kafka consumer group id. Durable data is owned by a group, so two groups consuming the
    /// same topic never see each other's timers, dedup records or keyed state.
    ConsumerGroup
}

string_id! {
    /// A subsystem: the stable public name under which collections are published for readers
    /// outside the owning consumer group.
    Subsystem
}

string_id! {
    /// The durable name of a keyed-state collection.
    CollectionName
}

/// A Kafka partition number within a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Partition(pub i32);

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A Kafka offset within a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Offset(pub i64);

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_ids_round_trip_and_order_bytewise() {
        let a = Key::from("a");
        let b = Key::new(String::from("b"));
        assert!(a < b);
        assert_eq!(b.as_str(), "b");
        assert_eq!(a.to_string(), "a");
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"a\"");
    }

    #[test]
    fn numeric_ids_serialize_as_numbers() {
        assert_eq!(serde_json::to_string(&Partition(3)).unwrap(), "3");
        assert_eq!(serde_json::to_string(&Offset(-1)).unwrap(), "-1");
    }
}
