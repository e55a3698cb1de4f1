//! Checks on single values whose rules come from outside Prosody: Kafka topic names, broker
//! and Cassandra addresses, CQL identifiers, JavaScript's safe-integer range.
//!
//! Each returns the "must be ..." phrase on failure so the resolver can attach the field name.

use std::time::Duration;

/// Largest integer JavaScript represents exactly; sizes travel through the Node binding as
/// numbers, so a larger one would already have been rounded.
pub(crate) const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Cassandra rejects TTLs above 20 years.
pub(crate) const MAX_CASSANDRA_TTL: Duration = Duration::from_secs(630_720_000);

/// Kafka's limit on topic-name length.
const MAX_TOPIC_LEN: usize = 249;

/// What a topic name must look like.
pub(crate) const TOPIC_EXPECTED: &str =
    "must be a topic name of 1 to 249 characters from [a-zA-Z0-9._-], other than \".\" and \"..\"";

/// Whether `name` is a topic name Kafka would accept.
pub(crate) fn is_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOPIC_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks a subscription list: plain topic names, or `^`-prefixed regular expressions.
pub(crate) fn subscription(topics: &[String]) -> Result<(), String> {
    for topic in topics {
        if topic.starts_with('^') {
            // librdkafka compiles subscriptions itself, later and on another thread; a pattern
            // that does not compile here would fail there with a far less helpful message.
            if let Err(error) = regex::Regex::new(topic) {
                return Err(format!(
                    "must be topic names or regular expressions starting with '^'; {topic:?} is not a valid regular expression ({})",
                    error
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or("syntax error")
                        .trim()
                ));
            }
        } else if !is_topic_name(topic) {
            return Err(format!(
                "must be topic names or regular expressions starting with '^'; {topic:?} is not a topic name (1 to 249 characters from [a-zA-Z0-9._-])"
            ));
        }
    }
    Ok(())
}

/// What an address list must look like.
const ADDRESSES_EXPECTED: &str =
    "must be a comma-separated list of host:port addresses with ports from 1 to 65535";

/// Checks `host:port` addresses. The port may be omitted (the client's default applies), a
/// `scheme://` prefix is allowed for Kafka listeners, and IPv6 hosts go in brackets.
pub(crate) fn addresses(entries: &[String]) -> Result<(), String> {
    if entries.iter().all(|entry| is_address(entry)) {
        Ok(())
    } else {
        Err(ADDRESSES_EXPECTED.to_owned())
    }
}

fn is_address(entry: &str) -> bool {
    let host_port = entry.rsplit_once("://").map_or(entry, |(_, rest)| rest);
    if host_port.is_empty() || host_port.chars().any(char::is_whitespace) {
        return false;
    }
    match host_port.rsplit_once(':') {
        // A colon inside an unbracketed host is a bare IPv6 address without a port.
        Some((host, _)) if host.contains(':') && !host.ends_with(']') => true,
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|port| port != 0),
        None => true,
    }
}

/// What a keyspace name must look like.
pub(crate) const KEYSPACE_EXPECTED: &str = "must be 1 to 48 letters, digits or underscores";

/// Whether `name` is a keyspace name Cassandra accepts unquoted.
pub(crate) fn is_keyspace(name: &str) -> bool {
    (1..=48).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `value` lies in (0, 1].
pub(crate) fn is_fraction(value: f64) -> bool {
    value > 0.0 && value <= 1.0
}

/// Whether `duration` is whole seconds between 1 s and `max`.
pub(crate) fn is_whole_seconds(duration: Duration, max: Duration) -> bool {
    duration.subsec_nanos() == 0 && duration >= Duration::from_secs(1) && duration <= max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert!(is_topic_name("orders.v1_a-b"));
        assert!(!is_topic_name(""));
        assert!(!is_topic_name(".."));
        assert!(!is_topic_name("has space"));
        assert!(!is_topic_name(&"x".repeat(250)));
    }

    #[test]
    fn subscriptions_check_regexes() {
        assert!(subscription(&["a".to_owned(), "^orders\\..*".to_owned()]).is_ok());
        let error = subscription(&["^orders(".to_owned()]).unwrap_err();
        assert!(error.contains("\"^orders(\""), "{error}");
        assert!(subscription(&["bad topic".to_owned()]).is_err());
    }

    #[test]
    fn address_shapes() {
        for ok in [
            "localhost:9092",
            "kafka",
            "PLAINTEXT://broker-1:9092",
            "[::1]:9042",
            "::1",
            "10.0.0.1:9042",
        ] {
            assert!(is_address(ok), "{ok}");
        }
        for bad in [
            "",
            "host:",
            "host:0",
            "host:99999",
            ":9092",
            "a b:1",
            "host:port",
        ] {
            assert!(!is_address(bad), "{bad}");
        }
    }

    #[test]
    fn keyspaces() {
        assert!(is_keyspace("prosody_test1"));
        assert!(!is_keyspace("bad-name"));
        assert!(!is_keyspace(""));
        assert!(!is_keyspace(&"k".repeat(49)));
    }
}
