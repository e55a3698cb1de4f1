//! The shapes an option value can take, read from JSON or from environment-variable text.
//!
//! Options come from JavaScript as JSON and from shells as text, and each side has its own
//! habits: `timeoutMs: 30000` versus `PROSODY_TIMEOUT=30s`, `subscribedTopics: ["a", "b"]` versus
//! `PROSODY_SUBSCRIBED_TOPICS=a,b`. This module accepts both habits for one meaning, so the
//! resolver only ever sees typed values. Duration text is parsed by `humantime`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// The unit a bare number means for a duration setting: `...Ms` options count milliseconds,
/// `...S`/`...Seconds` options count seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Millis,
    Seconds,
}

impl Unit {
    fn duration(self, count: u64) -> Duration {
        match self {
            Self::Millis => Duration::from_millis(count),
            Self::Seconds => Duration::from_secs(count),
        }
    }

    /// What a duration setting in this unit accepts, phrased to follow a field name.
    pub(crate) fn expected(self) -> &'static str {
        match self {
            Self::Millis => {
                "must be a duration such as \"30s\" or \"5m\", or an integer number of milliseconds"
            }
            Self::Seconds => {
                "must be a duration such as \"30s\" or \"1h\", or an integer number of seconds"
            }
        }
    }
}

/// Parses duration text: a bare integer in `unit`, or a humantime string such as `1m 30s`.
pub(crate) fn parse_duration(text: &str, unit: Unit) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(count) = text.parse::<u64>() {
        return Ok(unit.duration(count));
    }
    humantime::parse_duration(text).map_err(|_| unit.expected().to_owned())
}

/// Renders a duration the way users write them (`30s`, `1h 30m`).
pub(crate) fn show_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// Splits a comma-separated list, trimming items and dropping empty ones so that a trailing
/// comma or stray spaces are harmless.
pub(crate) fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses a boolean the way shells spell it.
pub(crate) fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("must be true or false".to_owned()),
    }
}

/// Whether `text` is one of the spellings that switch an optional feature off.
pub(crate) fn is_none_word(text: &str) -> bool {
    matches!(
        text.trim().to_ascii_lowercase().as_str(),
        "none" | "null" | "off" | "false" | "disabled"
    )
}

/// A duration read from JSON: an integer in the field's unit or a duration string.
struct DurationVisitor(Unit);

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Unit::Millis => f.write_str(
                "a non-negative integer number of milliseconds or a duration string such as \"30s\"",
            ),
            Unit::Seconds => f.write_str(
                "a non-negative integer number of seconds or a duration string such as \"30s\"",
            ),
        }
    }

    fn visit_u64<E: de::Error>(self, count: u64) -> Result<Duration, E> {
        Ok(self.0.duration(count))
    }

    fn visit_i64<E: de::Error>(self, count: i64) -> Result<Duration, E> {
        u64::try_from(count)
            .map(|count| self.0.duration(count))
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(count), &self))
    }

    fn visit_f64<E: de::Error>(self, count: f64) -> Result<Duration, E> {
        // JavaScript has only doubles; `30000.0` is an integer as far as the user is concerned.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        if count.is_finite() && count >= 0.0 && count.fract() == 0.0 && count < 2f64.powi(64) {
            Ok(self.0.duration(count as u64))
        } else {
            Err(E::invalid_value(de::Unexpected::Float(count), &self))
        }
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        parse_duration(text, self.0).map_err(|_| E::invalid_value(de::Unexpected::Str(text), &self))
    }
}

/// Deserializes an optional millisecond duration (`...Ms` options); JSON `null` means unset.
pub(crate) fn opt_millis<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    opt_duration(d, Unit::Millis)
}

/// Deserializes an optional second duration (`...S`/`...Seconds` options); `null` means unset.
pub(crate) fn opt_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    opt_duration(d, Unit::Seconds)
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D, unit: Unit) -> Result<Option<Duration>, D::Error> {
    struct OptVisitor(Unit);

    impl<'de> Visitor<'de> for OptVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            DurationVisitor(self.0).expecting(f)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(DurationVisitor(self.0)).map(Some)
        }
    }

    d.deserialize_option(OptVisitor(unit))
}

/// Deserializes an optional list given as a comma-separated string or an array of strings;
/// JSON `null` means unset.
pub(crate) fn opt_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    struct ListVisitor;

    impl<'de> Visitor<'de> for ListVisitor {
        type Value = Option<Vec<String>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a comma-separated string or an array of strings")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(Some(split_list(text)))
        }

        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<String>()? {
                let item = item.trim();
                if !item.is_empty() {
                    items.push(item.to_owned());
                }
            }
            Ok(Some(items))
        }
    }

    d.deserialize_option(ListVisitor)
}

/// The `probePort` option: a port, or disabled.
///
/// In JSON, `null` and `"none"` disable the probe server; a number or numeric string is the port.
/// Port 0 asks the operating system for a free port, which tests use to avoid collisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbePort {
    /// No probe server.
    Disabled,
    /// Serve `/readyz` and `/livez` on this port.
    Port(u16),
}

impl From<u16> for ProbePort {
    fn from(port: u16) -> Self {
        Self::Port(port)
    }
}

/// The message for a probe port that is neither a port nor a disabling word.
pub(crate) const PROBE_PORT_EXPECTED: &str =
    "must be a port number from 0 to 65535, or null/\"none\" to disable";

/// Parses `probePort` text: a port number or a disabling word.
pub(crate) fn parse_probe_port(text: &str) -> Result<ProbePort, String> {
    if is_none_word(text) {
        return Ok(ProbePort::Disabled);
    }
    text.trim()
        .parse::<u16>()
        .map(ProbePort::Port)
        .map_err(|_| PROBE_PORT_EXPECTED.to_owned())
}

impl<'de> Deserialize<'de> for ProbePort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PortVisitor;

        impl Visitor<'_> for PortVisitor {
            type Value = ProbePort;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number from 0 to 65535, or null/\"none\" to disable")
            }

            fn visit_unit<E: de::Error>(self) -> Result<ProbePort, E> {
                Ok(ProbePort::Disabled)
            }

            fn visit_none<E: de::Error>(self) -> Result<ProbePort, E> {
                Ok(ProbePort::Disabled)
            }

            fn visit_u64<E: de::Error>(self, port: u64) -> Result<ProbePort, E> {
                u16::try_from(port)
                    .map(ProbePort::Port)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(port), &self))
            }

            fn visit_i64<E: de::Error>(self, port: i64) -> Result<ProbePort, E> {
                u16::try_from(port)
                    .map(ProbePort::Port)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(port), &self))
            }

            fn visit_f64<E: de::Error>(self, port: f64) -> Result<ProbePort, E> {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                if port.fract() == 0.0 && (0.0..=f64::from(u16::MAX)).contains(&port) {
                    Ok(ProbePort::Port(port as u16))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(port), &self))
                }
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ProbePort, E> {
                parse_probe_port(text)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(text), &self))
            }
        }

        d.deserialize_any(PortVisitor)
    }
}

/// Deserializes `probePort` so that an explicit `null` disables instead of meaning "unset".
pub(crate) fn opt_probe_port<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<ProbePort>, D::Error> {
    ProbePort::deserialize(d).map(Some)
}

/// The `stateReadCache` option: the client-wide default cache for published-state reads.
///
/// In JSON: `{ "ttlMs": 5000 }`, a bare duration (`5000`, `"5s"`), `true` (the default TTL), or
/// `false`/`null`/`"none"` to disable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadCache {
    /// Every published read goes to the store.
    Disabled,
    /// Cache the default TTL (5 s).
    Default,
    /// Cache reads for this long.
    Ttl(Duration),
}

/// The message for a `stateReadCache` value of the wrong shape.
pub(crate) const READ_CACHE_EXPECTED: &str =
    "must be a duration such as \"5s\", an integer number of milliseconds, or \"none\" to disable";

/// Parses `PROSODY_STATE_READ_CACHE_TTL` text: a duration or a disabling word.
pub(crate) fn parse_read_cache(text: &str) -> Result<ReadCache, String> {
    if is_none_word(text) {
        return Ok(ReadCache::Disabled);
    }
    parse_duration(text, Unit::Millis)
        .map(ReadCache::Ttl)
        .map_err(|_| READ_CACHE_EXPECTED.to_owned())
}

impl<'de> Deserialize<'de> for ReadCache {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct CacheVisitor;

        impl<'de> Visitor<'de> for CacheVisitor {
            type Value = ReadCache;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "{ \"ttlMs\": <milliseconds> }, a duration, true, or false/null/\"none\" to disable",
                )
            }

            fn visit_unit<E: de::Error>(self) -> Result<ReadCache, E> {
                Ok(ReadCache::Disabled)
            }

            fn visit_none<E: de::Error>(self) -> Result<ReadCache, E> {
                Ok(ReadCache::Disabled)
            }

            fn visit_bool<E: de::Error>(self, enabled: bool) -> Result<ReadCache, E> {
                Ok(if enabled {
                    ReadCache::Default
                } else {
                    ReadCache::Disabled
                })
            }

            fn visit_u64<E: de::Error>(self, ms: u64) -> Result<ReadCache, E> {
                DurationVisitor(Unit::Millis)
                    .visit_u64(ms)
                    .map(ReadCache::Ttl)
            }

            fn visit_i64<E: de::Error>(self, ms: i64) -> Result<ReadCache, E> {
                DurationVisitor(Unit::Millis)
                    .visit_i64(ms)
                    .map(ReadCache::Ttl)
            }

            fn visit_f64<E: de::Error>(self, ms: f64) -> Result<ReadCache, E> {
                DurationVisitor(Unit::Millis)
                    .visit_f64(ms)
                    .map(ReadCache::Ttl)
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ReadCache, E> {
                parse_read_cache(text)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(text), &self))
            }

            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<ReadCache, A::Error> {
                let mut ttl = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "ttlMs" {
                        return Err(de::Error::unknown_field(&key, &["ttlMs"]));
                    }
                    ttl = Some(map.next_value::<Millis>()?.0);
                }
                ttl.map(ReadCache::Ttl)
                    .ok_or_else(|| de::Error::missing_field("ttlMs"))
            }
        }

        /// A required millisecond duration inside the object form.
        struct Millis(Duration);

        impl<'de> Deserialize<'de> for Millis {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(DurationVisitor(Unit::Millis)).map(Millis)
            }
        }

        d.deserialize_any(CacheVisitor)
    }
}

/// Deserializes `stateReadCache` so that an explicit `null` disables instead of meaning "unset".
pub(crate) fn opt_read_cache<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<ReadCache>, D::Error> {
    ReadCache::deserialize(d).map(Some)
}

/// A credential: readable through [`Secret::expose`], never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The credential itself, for handing to the driver that needs it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_text_in_both_units() {
        assert_eq!(
            parse_duration("1500", Unit::Millis),
            Ok(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_duration("30", Unit::Seconds),
            Ok(Duration::from_secs(30))
        );
        assert_eq!(
            parse_duration("5m", Unit::Millis),
            Ok(Duration::from_secs(300))
        );
        assert_eq!(
            parse_duration(" 1h 30m ", Unit::Seconds),
            Ok(Duration::from_secs(5400))
        );
        assert!(parse_duration("soon", Unit::Millis).is_err());
        assert!(parse_duration("-5", Unit::Millis).is_err());
    }

    #[test]
    fn lists_tolerate_spaces_and_trailing_commas() {
        assert_eq!(split_list(" a, b ,,c, "), vec!["a", "b", "c"]);
        assert!(split_list("").is_empty());
    }

    #[test]
    fn booleans_in_shell_spellings() {
        assert_eq!(parse_bool("TRUE"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("maybe").is_err());
    }

    #[test]
    fn secret_debug_is_redacted() {
        let secret = Secret::from("hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn read_cache_shapes() {
        let parse = |json: &str| serde_json::from_str::<ReadCache>(json);
        assert_eq!(parse("false").ok(), Some(ReadCache::Disabled));
        assert_eq!(parse("null").ok(), Some(ReadCache::Disabled));
        assert_eq!(parse("true").ok(), Some(ReadCache::Default));
        assert_eq!(parse("\"none\"").ok(), Some(ReadCache::Disabled));
        assert_eq!(
            parse("{\"ttlMs\": 250}").ok(),
            Some(ReadCache::Ttl(Duration::from_millis(250)))
        );
        assert_eq!(
            parse("\"2s\"").ok(),
            Some(ReadCache::Ttl(Duration::from_secs(2)))
        );
        assert!(parse("{\"ttl\": 250}").is_err());
        assert!(parse("[1]").is_err());
    }
}
