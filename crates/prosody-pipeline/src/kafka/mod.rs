//! Everything that talks to librdkafka (through `rdkafka`) apart from the poll loop.

pub mod admin;
pub mod best_effort;
mod classify;
pub mod decode;
pub mod headers;
pub mod loader;
pub mod mock;
pub mod producer;

pub use admin::{AdminClient, AdminError};
pub use best_effort::{BestEffortProducer, BestEffortSettings, DeliveryFailures, NotQueued};
pub use decode::{Captured, DecodeError, DecodeLimits, DecodeProblem, capture, decode, reject};
pub use headers::{HeaderInjector, OutgoingHeaders, TraceContext};
pub use mock::{MockError, MockKafka};
pub use producer::{Delivery, Producer, ProducerConfig, ProducerError, RawRecord, SendOptions};
