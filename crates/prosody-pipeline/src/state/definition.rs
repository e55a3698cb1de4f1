//! Collection definitions: a durable name, a kind, a payload and options, validated once
//! when the client registers them (so a bad option fails at construction, naming the field).

use std::collections::HashSet;
use std::fmt;
use std::num::{NonZeroU16, NonZeroU32};
use std::time::Duration;

use prosody_api::storage::Ttl;
use serde::{Deserialize, Serialize};

/// The shape of a collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectionKind {
    /// One value per key.
    Value,
    /// A string-keyed ordered map per key.
    Map,
    /// A double-ended queue per key.
    Deque,
}

/// What a collection stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadKind {
    /// JSON values.
    Json,
    /// The Kafka message the handler received, stored as a reference and reloaded from Kafka.
    Message,
}

/// The per-collection read cache of published readers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReadCacheOption {
    /// The client's default (`stateReadCache`).
    #[default]
    Default,
    /// `false` disables it, `true` keeps the default.
    Enabled(bool),
    /// `{ "ttlMs": n }`.
    Ttl {
        /// Milliseconds a cached read stays fresh.
        #[serde(rename = "ttlMs")]
        ttl_ms: u64,
    },
}

/// The default `keysetLimit` of a map.
pub const DEFAULT_KEYSET_LIMIT: u16 = 128;
/// The largest `keysetLimit`.
pub const MAX_KEYSET_LIMIT: u16 = 4096;

/// A keyed-state collection: `value`, `map`, `deque` and their `message*` variants.
///
/// Declare each collection once, register it on the client, and pass the same definition to
/// [`super::StateContextExt::state`] in handlers. The serde form is the spec's
/// `StateCollectionConfig` (`{"name", "kind", "payload", "ttlSeconds", ...}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectionDefinition {
    /// The durable name, unique within the client.
    pub name: String,
    /// The kind.
    pub kind: CollectionKind,
    /// The payload.
    pub payload: PayloadKind,
    /// TTL of every write, in whole seconds (at least 1, more than the recovery delay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// Writes go to the store at once instead of at the end of a successful attempt.
    #[serde(default)]
    pub read_uncommitted: bool,
    /// Readable by any client through the published-state API (JSON payloads only).
    #[serde(default)]
    pub published: bool,
    /// The published readers' cache.
    #[serde(default, skip_serializing_if = "is_default_cache")]
    pub read_cache: ReadCacheOption,
    /// Map only: the ordered-scan bound, `0..=4096` (0 disables it); 128 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyset_limit: Option<u16>,
    /// Deque only: at most this many items; a push beyond drops the oldest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
}

fn is_default_cache(cache: &ReadCacheOption) -> bool {
    *cache == ReadCacheOption::Default
}

impl CollectionDefinition {
    fn of(name: impl Into<String>, kind: CollectionKind, payload: PayloadKind) -> Self {
        Self {
            name: name.into(),
            kind,
            payload,
            ttl_seconds: None,
            read_uncommitted: false,
            published: false,
            read_cache: ReadCacheOption::Default,
            keyset_limit: None,
            capacity: None,
        }
    }

    /// A JSON value collection.
    pub fn value(name: impl Into<String>) -> Self {
        Self::of(name, CollectionKind::Value, PayloadKind::Json)
    }

    /// A JSON map collection.
    pub fn map(name: impl Into<String>) -> Self {
        Self::of(name, CollectionKind::Map, PayloadKind::Json)
    }

    /// A JSON deque collection.
    pub fn deque(name: impl Into<String>) -> Self {
        Self::of(name, CollectionKind::Deque, PayloadKind::Json)
    }

    /// A value collection of messages.
    pub fn message_value(name: impl Into<String>) -> Self {
        Self::of(name, CollectionKind::Value, PayloadKind::Message)
    }

    /// A map collection of messages.
    pub fn message_map(name: impl Into<String>) -> Self {
        Self::of(name, CollectionKind::Map, PayloadKind::Message)
    }

    /// A deque collection of messages.
    pub fn message_deque(name: impl Into<String>) -> Self {
        Self::of(name, CollectionKind::Deque, PayloadKind::Message)
    }

    /// Sets `ttlSeconds`.
    #[must_use]
    pub fn ttl_seconds(mut self, secs: u64) -> Self {
        self.ttl_seconds = Some(secs);
        self
    }

    /// Sets `readUncommitted`.
    #[must_use]
    pub fn read_uncommitted(mut self, read_uncommitted: bool) -> Self {
        self.read_uncommitted = read_uncommitted;
        self
    }

    /// Sets `published`.
    #[must_use]
    pub fn published(mut self, published: bool) -> Self {
        self.published = published;
        self
    }

    /// Sets `readCache`.
    #[must_use]
    pub fn read_cache(mut self, cache: ReadCacheOption) -> Self {
        self.read_cache = cache;
        self
    }

    /// Sets `keysetLimit`.
    #[must_use]
    pub fn keyset_limit(mut self, limit: u16) -> Self {
        self.keyset_limit = Some(limit);
        self
    }

    /// Sets `capacity`.
    #[must_use]
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// The identity that is stored durably: a later client must agree on it.
    #[must_use]
    pub fn identity(&self) -> Identity {
        Identity {
            kind: self.kind,
            payload: self.payload,
        }
    }

    /// Checks the options against the spec and resolves them.
    ///
    /// # Errors
    /// A [`DefinitionError`] naming the field.
    pub fn validate(&self, recovery_delay: Duration) -> Result<Collection, DefinitionError> {
        let invalid = |field: &'static str, expected: String| DefinitionError {
            collection: self.name.clone(),
            field,
            expected,
        };
        if self.name.is_empty() {
            return Err(invalid("name", "must not be empty".to_owned()));
        }
        if self.name.starts_with(RESERVED_PREFIX) {
            return Err(invalid(
                "name",
                format!("must not start with `{RESERVED_PREFIX}` (reserved by Prosody)"),
            ));
        }
        let ttl = match self.ttl_seconds {
            None => None,
            Some(secs) => {
                let ttl = u32::try_from(secs)
                    .ok()
                    .and_then(Ttl::from_secs)
                    .ok_or_else(|| invalid("ttlSeconds", format!("must be 1..={}", u32::MAX)))?;
                if ttl.as_duration() <= recovery_delay {
                    return Err(invalid(
                        "ttlSeconds",
                        format!(
                            "must exceed stateRecoveryDelaySeconds ({}s)",
                            recovery_delay.as_secs()
                        ),
                    ));
                }
                Some(ttl)
            }
        };
        if self.published && self.payload == PayloadKind::Message {
            return Err(invalid(
                "published",
                "is only allowed for JSON payloads".to_owned(),
            ));
        }
        if let ReadCacheOption::Ttl { ttl_ms: 0 } = self.read_cache {
            return Err(invalid(
                "readCache.ttlMs",
                "must be positive (use false to disable)".to_owned(),
            ));
        }
        let keyset_limit = match (self.kind, self.keyset_limit) {
            (CollectionKind::Map, None) => NonZeroU16::new(DEFAULT_KEYSET_LIMIT),
            (CollectionKind::Map, Some(limit)) if limit <= MAX_KEYSET_LIMIT => {
                NonZeroU16::new(limit)
            }
            (CollectionKind::Map, Some(_)) => {
                return Err(invalid(
                    "keysetLimit",
                    format!("must be 0..={MAX_KEYSET_LIMIT}"),
                ));
            }
            (_, None) => None,
            (_, Some(_)) => {
                return Err(invalid("keysetLimit", "is only allowed on maps".to_owned()));
            }
        };
        let capacity = match (self.kind, self.capacity) {
            (CollectionKind::Deque, Some(capacity)) => Some(
                u32::try_from(capacity)
                    .ok()
                    .and_then(NonZeroU32::new)
                    .ok_or_else(|| invalid("capacity", format!("must be 1..={}", u32::MAX)))?,
            ),
            (_, None) => None,
            (_, Some(_)) => {
                return Err(invalid("capacity", "is only allowed on deques".to_owned()));
            }
        };
        Ok(Collection {
            name: self.name.clone(),
            identity: self.identity(),
            ttl,
            read_uncommitted: self.read_uncommitted,
            published: self.published,
            keyset_limit,
            capacity,
        })
    }
}

/// Names starting with this are Prosody's own bookkeeping cells.
pub const RESERVED_PREFIX: &str = "__prosody";

/// A collection's durable identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    /// The kind.
    pub kind: CollectionKind,
    /// The payload.
    pub payload: PayloadKind,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            CollectionKind::Value => "value",
            CollectionKind::Map => "map",
            CollectionKind::Deque => "deque",
        };
        match self.payload {
            PayloadKind::Json => f.write_str(kind),
            PayloadKind::Message => write!(f, "message {kind}"),
        }
    }
}

/// A validated collection, as the runtime uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collection {
    /// The durable name.
    pub name: String,
    /// Kind and payload.
    pub identity: Identity,
    /// TTL of every write.
    pub ttl: Option<Ttl>,
    /// Writes go through at once.
    pub read_uncommitted: bool,
    /// Published for readers outside the group.
    pub published: bool,
    /// The map's keyset limit (`None`: unbounded).
    pub keyset_limit: Option<NonZeroU16>,
    /// The deque's capacity.
    pub capacity: Option<NonZeroU32>,
}

/// An invalid collection definition: which collection, which field, what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stateCollections: collection `{collection}`: {field} {expected}")]
pub struct DefinitionError {
    /// The collection's name.
    pub collection: String,
    /// The offending field (`ttlSeconds`, `capacity`, ...).
    pub field: &'static str,
    /// What the field must be.
    pub expected: String,
}

/// Validates a client's definitions: each on its own, and names unique.
///
/// # Errors
/// The first invalid definition or the first repeated name.
pub fn validate_all(
    definitions: &[CollectionDefinition],
    recovery_delay: Duration,
) -> Result<Vec<Collection>, DefinitionError> {
    let mut names = HashSet::new();
    definitions
        .iter()
        .map(|definition| {
            if !names.insert(definition.name.as_str()) {
                return Err(DefinitionError {
                    collection: definition.name.clone(),
                    field: "name",
                    expected: "must be unique within the client".to_owned(),
                });
            }
            definition.validate(recovery_delay)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_secs(30);

    fn field_of(definition: &CollectionDefinition) -> &'static str {
        definition.validate(DELAY).expect_err("invalid").field
    }

    #[test]
    fn options_are_validated_naming_the_field() {
        assert_eq!(field_of(&CollectionDefinition::value("")), "name");
        assert_eq!(
            field_of(&CollectionDefinition::value("__prosody_x")),
            "name"
        );
        assert_eq!(
            field_of(&CollectionDefinition::value("v").ttl_seconds(0)),
            "ttlSeconds"
        );
        assert_eq!(
            field_of(&CollectionDefinition::value("v").ttl_seconds(30)),
            "ttlSeconds"
        );
        assert!(
            CollectionDefinition::value("v")
                .ttl_seconds(31)
                .validate(DELAY)
                .is_ok()
        );
        assert_eq!(
            field_of(&CollectionDefinition::map("m").keyset_limit(4097)),
            "keysetLimit"
        );
        assert_eq!(
            field_of(&CollectionDefinition::deque("d").keyset_limit(1)),
            "keysetLimit"
        );
        assert_eq!(
            field_of(&CollectionDefinition::deque("d").capacity(0)),
            "capacity"
        );
        assert_eq!(
            field_of(&CollectionDefinition::map("m").capacity(3)),
            "capacity"
        );
        assert_eq!(
            field_of(&CollectionDefinition::message_value("m").published(true)),
            "published"
        );
        assert_eq!(
            field_of(
                &CollectionDefinition::value("v").read_cache(ReadCacheOption::Ttl { ttl_ms: 0 })
            ),
            "readCache.ttlMs"
        );
    }

    #[test]
    fn map_keyset_limit_defaults_to_128_and_zero_disables_it() {
        let map = CollectionDefinition::map("m").validate(DELAY).unwrap();
        assert_eq!(map.keyset_limit.map(NonZeroU16::get), Some(128));
        let unbounded = CollectionDefinition::map("m")
            .keyset_limit(0)
            .validate(DELAY)
            .unwrap();
        assert_eq!(unbounded.keyset_limit, None);
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let error = validate_all(
            &[
                CollectionDefinition::value("a"),
                CollectionDefinition::map("a"),
            ],
            DELAY,
        )
        .expect_err("duplicate");
        assert_eq!((error.collection.as_str(), error.field), ("a", "name"));
    }

    #[test]
    fn the_json_form_is_the_spec_config() {
        let definition: CollectionDefinition = serde_json::from_value(serde_json::json!({
            "name": "pending", "kind": "deque", "payload": "message",
            "ttlSeconds": 86400, "capacity": 100, "readCache": false
        }))
        .unwrap();
        assert_eq!(
            definition,
            CollectionDefinition::message_deque("pending")
                .ttl_seconds(86_400)
                .capacity(100)
                .read_cache(ReadCacheOption::Enabled(false))
        );
        assert!(
            serde_json::from_value::<CollectionDefinition>(serde_json::json!({
                "name": "x", "kind": "set", "payload": "json"
            }))
            .is_err()
        );
    }
}
