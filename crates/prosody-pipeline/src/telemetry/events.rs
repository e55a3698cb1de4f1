//! Lifecycle events (dispatched, succeeded, failed): what the telemetry topic carries, one
//! JSON record per event. [`TelemetrySink`](super::TelemetrySink) sends them.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use prosody_api::{ConsumerGroup, Key, Topic};

/// Where in its life a handler invocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The handler was called.
    Dispatched,
    /// It returned successfully.
    Succeeded,
    /// It returned an error (or panicked).
    Failed,
}

/// One lifecycle event, as it is written to the telemetry topic.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleEvent {
    /// What was handled: `message`, `excise` or `timer`.
    pub event: &'static str,
    /// The stage.
    pub stage: Stage,
    /// The consumer group handling it.
    pub group_id: ConsumerGroup,
    /// Record key (shared with the record: no copy per event).
    pub key: Key,
    /// Record topic.
    pub topic: Topic,
    /// Record partition.
    pub partition: i32,
    /// Record offset.
    pub offset: Option<i64>,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Handler run time in milliseconds (succeeded and failed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// The failure text (failed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the stage was reached, in nanoseconds since the Unix epoch; written as
    /// `timestampMs`, in milliseconds. The sender orders events by it: those of one record may
    /// be queued by different workers.
    #[serde(rename = "timestampMs", serialize_with = "as_millis")]
    pub timestamp_ns: u64,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's serialize_with passes the field by reference"
)]
fn as_millis<S: serde::Serializer>(nanos: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(nanos / 1_000_000)
}

impl LifecycleEvent {
    /// Nanoseconds since the Unix epoch, now.
    #[must_use]
    pub fn now_ns() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            })
    }
}
