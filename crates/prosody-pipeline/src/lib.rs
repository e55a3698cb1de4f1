//! The Kafka engine of Prosody: producer, consumer, partitions, key queues, offsets, middleware,
//! probes.
//!
//! Modules that talk to librdkafka live under [`kafka`]; the consumer engine under `consumer`
//! knows nothing of librdkafka so its ordering, offset and backpressure logic is unit tested
//! without a broker.

pub mod kafka;
pub mod probes;
