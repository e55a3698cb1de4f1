//! Prosody: a Kafka consumer and producer framework that handles each message key in order while
//! running different keys in parallel.
//!
//! This facade crate ties configuration, storage backends and the pipeline together:
//! [`ProsodyClient`] is the entry point, configured by [`ClientOptions`] (with `PROSODY_*`
//! environment fallback) and driven by an [`api::EventHandler`].

pub use prosody_api as api;
pub use prosody_pipeline as pipeline;

pub mod backend;
pub mod client;
pub mod config;
pub mod error;

pub use client::{ConsumerState, ProsodyClient};
pub use config::{ClientOptions, Config, ConfigError};
pub use error::ClientError;
pub use prosody_pipeline::kafka::{AdminClient, AdminError, Delivery, SendOptions};
