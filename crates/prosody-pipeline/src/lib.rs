//! The Kafka engine of Prosody: producer, consumer, partitions, key queues, offsets, middleware,
//! probes.
//!
//! The consumer engine ([`consumer::Engine`]) knows nothing of librdkafka, so its ordering,
//! offset and backpressure rules are unit tested without a broker; the poll loop and the
//! producer, admin and mock-cluster wrappers are the parts that talk to librdkafka.

pub mod boxing;
pub mod consumer;
pub mod deadline;
pub mod dispatch;
pub mod event;
pub mod hashing;
pub mod kafka;
pub mod middleware;
pub mod monotonic;
pub mod probes;
pub mod scheduler;
pub mod state;
pub mod tag_shards;
pub mod telemetry;
pub mod thread_shard;
pub mod timers;

pub use event::{Event, FiredTimer};
