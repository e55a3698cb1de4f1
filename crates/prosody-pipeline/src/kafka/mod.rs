//! Everything that talks to librdkafka (through `rdkafka`) apart from the poll loop.

pub mod decode;
