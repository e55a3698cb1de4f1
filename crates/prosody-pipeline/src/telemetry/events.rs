//! Lifecycle events (dispatched, succeeded, failed): what the telemetry topic carries, one
//! JSON record per event. [`TelemetrySink`](super::TelemetrySink) sends them.

use serde::Serialize;

use prosody_api::{ConsumerGroup, Key, Topic};

use super::clock::{Moment, WallAnchor};

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
    /// When the stage was reached; written as `timestampMs`, wall-clock milliseconds since the
    /// Unix epoch (see [`EventRecord`]). The sender orders events by it: those of one record may
    /// be queued by different workers.
    #[serde(skip)]
    pub at: Moment,
}

/// A lifecycle event as the topic carries it: its fields and its wall-clock time.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRecord<'a> {
    #[serde(flatten)]
    event: &'a LifecycleEvent,
    timestamp_ms: u64,
}

impl<'a> EventRecord<'a> {
    /// `event`, its moment placed on the wall clock by `anchor`.
    #[must_use]
    pub fn new(event: &'a LifecycleEvent, anchor: &WallAnchor) -> Self {
        Self {
            event,
            timestamp_ms: anchor.wall_ms(event.at),
        }
    }

    /// The record's key: the event's.
    #[must_use]
    pub fn key(&self) -> &Key {
        &self.event.key
    }
}
