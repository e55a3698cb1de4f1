//! The closed sets of choices a setting can take: processing mode, span relation, storage
//! backend.
//!
//! Each parses leniently in spelling (case, `-` and `_` are ignored, so `low-latency`,
//! `LowLatency` and `low_latency` are one value: the Node binding's string enums and shell users
//! spell them differently) but strictly in meaning: anything else is rejected with the list of
//! accepted values.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

/// Lower-cases and drops separators so that every common spelling of a choice compares equal.
fn normalize(text: &str) -> String {
    text.trim()
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | ' '))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The message for a choice outside `accepted`, phrased to follow a field name.
pub(crate) fn one_of(accepted: &[&str]) -> String {
    let quoted: Vec<String> = accepted.iter().map(|a| format!("\"{a}\"")).collect();
    format!("must be one of {}", quoted.join(", "))
}

/// Deserializes a choice from its string form so JSON errors carry the accepted values too.
fn deserialize_choice<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    let text = String::deserialize(deserializer)?;
    text.parse()
        .map_err(|expected: String| serde::de::Error::custom(format!("{expected}, got {text:?}")))
}

/// How failed handlers are treated (FEATURES.md section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Never drops a message: retry, then defer, with backpressure.
    #[default]
    Pipeline,
    /// Retries a few times, then writes the message to the failure topic and moves on.
    LowLatency,
    /// No retries: logs the failure and commits.
    BestEffort,
}

impl Mode {
    const ACCEPTED: &'static [&'static str] = &["pipeline", "low-latency", "best-effort"];
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match normalize(text).as_str() {
            "pipeline" => Ok(Self::Pipeline),
            "lowlatency" => Ok(Self::LowLatency),
            "besteffort" => Ok(Self::BestEffort),
            _ => Err(one_of(Self::ACCEPTED)),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pipeline => "pipeline",
            Self::LowLatency => "low-latency",
            Self::BestEffort => "best-effort",
        })
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_choice(deserializer)
    }
}

/// How a handler's span relates to the span found in the record's trace context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanRelation {
    /// The handler span is a child of the producer's span (one trace).
    Child,
    /// The handler span starts a new trace that links back to the producer's span.
    FollowsFrom,
}

impl SpanRelation {
    const ACCEPTED: &'static [&'static str] = &["child", "follows_from"];
}

impl FromStr for SpanRelation {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match normalize(text).as_str() {
            "child" | "childof" => Ok(Self::Child),
            "followsfrom" => Ok(Self::FollowsFrom),
            _ => Err(one_of(Self::ACCEPTED)),
        }
    }
}

impl fmt::Display for SpanRelation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Child => "child",
            Self::FollowsFrom => "follows_from",
        })
    }
}

impl<'de> Deserialize<'de> for SpanRelation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_choice(deserializer)
    }
}

/// Which store keeps timers, deferred work, dedup records and keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageBackend {
    /// In process memory: lost on exit. Implied by mock mode.
    Memory,
    /// Embedded `RocksDB` in `stateCacheDir`: durable, single node.
    RocksDb,
    /// Shared Cassandra cluster, with a local `RocksDB` cache for keyed state.
    Cassandra,
}

impl StorageBackend {
    const ACCEPTED: &'static [&'static str] = &["memory", "rocksdb", "cassandra"];
}

impl FromStr for StorageBackend {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match normalize(text).as_str() {
            "memory" => Ok(Self::Memory),
            "rocksdb" => Ok(Self::RocksDb),
            "cassandra" => Ok(Self::Cassandra),
            _ => Err(one_of(Self::ACCEPTED)),
        }
    }
}

impl fmt::Display for StorageBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Memory => "memory",
            Self::RocksDb => "rocksdb",
            Self::Cassandra => "cassandra",
        })
    }
}

impl<'de> Deserialize<'de> for StorageBackend {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_choice(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_choice_agree() {
        for text in ["low-latency", "LowLatency", "low_latency", " LOWLATENCY "] {
            assert_eq!(text.parse::<Mode>(), Ok(Mode::LowLatency), "{text}");
        }
        for text in ["follows_from", "followsFrom", "FollowsFrom", "follows-from"] {
            assert_eq!(text.parse::<SpanRelation>(), Ok(SpanRelation::FollowsFrom));
        }
        assert_eq!(
            "RocksDB".parse::<StorageBackend>(),
            Ok(StorageBackend::RocksDb)
        );
    }

    #[test]
    fn unknown_choice_lists_accepted_values() {
        assert_eq!(
            "fast".parse::<Mode>(),
            Err("must be one of \"pipeline\", \"low-latency\", \"best-effort\"".to_owned())
        );
        assert!("parent".parse::<SpanRelation>().is_err());
        assert!(
            "redis"
                .parse::<StorageBackend>()
                .is_err_and(|e| e.contains("\"rocksdb\""))
        );
    }

    #[test]
    fn display_round_trips() {
        for mode in [Mode::Pipeline, Mode::LowLatency, Mode::BestEffort] {
            assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
        }
        for relation in [SpanRelation::Child, SpanRelation::FollowsFrom] {
            assert_eq!(relation.to_string().parse::<SpanRelation>(), Ok(relation));
        }
        for backend in [
            StorageBackend::Memory,
            StorageBackend::RocksDb,
            StorageBackend::Cassandra,
        ] {
            assert_eq!(backend.to_string().parse::<StorageBackend>(), Ok(backend));
        }
    }
}
