//! Shared helpers of the integration suites: where the real services are, and unique names so
//! suites can run in parallel against one broker and one Cassandra node.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Bootstrap servers of the real Kafka broker started by `scripts/services up`.
///
/// Panics with instructions when the variable is missing: an integration test must never pass
/// without the service it tests.
pub fn bootstrap_servers() -> String {
    required_env("PROSODY_BOOTSTRAP_SERVERS", "kafka")
}

/// Contact points of the real Cassandra node started by `scripts/services up`.
pub fn cassandra_nodes() -> Vec<String> {
    required_env("PROSODY_CASSANDRA_NODES", "cassandra")
        .split(',')
        .map(|node| node.trim().to_owned())
        .filter(|node| !node.is_empty())
        .collect()
}

fn required_env(name: &str, service: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => panic!(
            "{name} is not set: this integration test needs a real {service}. Run \
             `scripts/services up` and export the lines it prints, or run `scripts/test`."
        ),
    }
}

/// A name unique to this process and call, safe as a Kafka topic, group id or CQL identifier.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!(
        "{prefix}_{}_{:x}_{}",
        std::process::id(),
        nanos % 0xffff_ffff,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

pub mod harness;
pub mod kafka_read;
pub mod scripted;
