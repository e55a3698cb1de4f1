//! The Kafka engine: producer, consumer, partitions, key queues, offsets and middleware.
