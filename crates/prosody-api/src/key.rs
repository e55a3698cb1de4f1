//! Identifiers: where a record lives in Kafka and which entity it belongs to.
//!
//! They are newtypes rather than bare `String`/`i32`/`i64` so a partition cannot be passed where
//! an offset is expected, and so storage scopes ([`crate::storage::PartitionScope`]) read as what
//! they mean. A key or topic is cloned into queues, contexts and storage scopes for every event,
//! and a clone must not allocate: a key shares one immutable `Arc<str>`, and topic and group
//! names, which are few, are held once per process and shared by reference.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

/// Hashes the names of [`hashed_string_id`] types: one process-wide random state, so equal
/// names hash equally wherever they were made.
static NAME_HASHER: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// The names of [`hashed_string_id`] types, each held once for the life of the process.
static NAMES: LazyLock<RwLock<HashSet<&'static str>>> = LazyLock::new(RwLock::default);

/// The process's one copy of `name`, made on first use. Topic and group names come from the
/// configuration, the broker's metadata and stored data, so there are few of them; holding them
/// for good lets every event clone them without touching a reference count, which every core
/// would otherwise write to on every event (measured: a group's count was the most written line
/// of the dedup layer's event path on two cores).
fn intern(name: &str) -> &'static str {
    let found = NAMES
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
        .copied();
    if let Some(found) = found {
        return found;
    }
    let mut names = NAMES.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(found) = names.get(name) {
        return found;
    }
    let held: &'static str = Box::leak(Box::from(name));
    names.insert(held);
    held
}

/// A string identifier that carries its hash, computed once when it is made, and whose name is
/// held once per process (see [`intern`]): cloning one copies a reference. Topic and group
/// names are tens of bytes long and few, but every event looks them up in maps (a partition's
/// deferral ownership, its dedup scope): hashing them there cost more than the lookups. The
/// hash stands in for the string in `Hash`, and since equal names share their one copy, `Eq`
/// compares addresses.
macro_rules! hashed_string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name {
            name: &'static str,
            hash: u64,
        }

        impl $name {
            /// Wraps a string.
            pub fn new(value: impl Into<String>) -> Self {
                Self::from(value.into())
            }

            fn interned(name: &str) -> Self {
                let name = intern(name);
                let hash = NAME_HASHER.hash_one(name);
                Self { name, hash }
            }

            /// The string form.
            #[must_use]
            pub fn as_str(&self) -> &str {
                self.name
            }

            /// The string form, copied.
            #[must_use]
            pub fn into_string(self) -> String {
                self.name.to_owned()
            }
        }

        impl Hash for $name {
            fn hash<H: Hasher>(&self, state: &mut H) {
                state.write_u64(self.hash);
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                std::ptr::eq(self.name, other.name)
            }
        }

        impl Eq for $name {}

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }

        /// By name, as the string would order.
        impl Ord for $name {
            fn cmp(&self, other: &Self) -> Ordering {
                self.name.cmp(other.name)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($name)).field(&self.name).finish()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::interned(value)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self::interned(&value)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                self.name
            }
        }

        /// As its string.
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.name)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer).map(Self::from)
            }
        }
    };
}

hashed_string_id! {
    /// A Kafka topic name.
    Topic
}

string_id! {
    /// A Kafka message key: the entity an event belongs to. Events of one key are processed one
    /// at a time, and timers, deferred work, dedup records and keyed state are stored per key.
    Key
}

hashed_string_id! {
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
    fn hashed_ids_made_apart_are_equal_and_hash_alike_by_name() {
        let hash = |topic: &Topic| {
            let mut hasher = std::hash::DefaultHasher::new();
            topic.hash(&mut hasher);
            hasher.finish()
        };
        let (one, other) = (Topic::from("orders"), Topic::new(String::from("orders")));
        assert_eq!(one, other);
        assert_eq!(hash(&one), hash(&other));
        assert_eq!(one, one.clone());
        let different = Topic::from("orders-dlq");
        assert_ne!(one, different);
        assert_ne!(hash(&one), hash(&different));
        assert!(one < different, "ordered as their names are");
        assert!(ConsumerGroup::from("b") > ConsumerGroup::from("a"));
    }

    #[test]
    fn hashed_ids_made_apart_share_one_copy_of_their_name() {
        let made = Topic::from(String::from("interned-orders"));
        let read: Topic = serde_json::from_str("\"interned-orders\"").unwrap();
        assert!(std::ptr::eq(made.as_str(), read.as_str()));
        let group = ConsumerGroup::from("interned-orders");
        assert!(
            std::ptr::eq(group.as_str(), made.as_str()),
            "one copy per name, whatever it names"
        );
    }

    #[test]
    fn hashed_ids_read_and_print_as_their_names() {
        let topic = Topic::from("orders");
        assert_eq!(serde_json::to_string(&topic).unwrap(), "\"orders\"");
        let read: Topic = serde_json::from_str("\"orders\"").unwrap();
        assert_eq!(read, topic);
        assert_eq!(format!("{topic:?}"), "Topic(\"orders\")");
        assert_eq!(topic.to_string(), "orders");
        assert_eq!(ConsumerGroup::from("g").into_string(), "g");
    }

    #[test]
    fn numeric_ids_serialize_as_numbers() {
        assert_eq!(serde_json::to_string(&Partition(3)).unwrap(), "3");
        assert_eq!(serde_json::to_string(&Offset(-1)).unwrap(), "-1");
    }
}
