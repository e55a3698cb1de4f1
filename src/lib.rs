//! Prosody: a Kafka consumer and producer framework that handles each message key in order while
//! running different keys in parallel.
//!
//! This facade crate ties configuration, storage backends and the pipeline together.

pub use prosody_api as api;
pub use prosody_pipeline as pipeline;

pub mod config;

pub use config::{ClientOptions, Config, ConfigError};
