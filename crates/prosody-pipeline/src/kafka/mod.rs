//! Everything that talks to librdkafka (through `rdkafka`).
