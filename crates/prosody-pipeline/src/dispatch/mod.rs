//! From events to the application's [`prosody_api::EventHandler`]: the per-attempt context and
//! the adapter the engine dispatches to.

pub mod context;
pub mod handler;

pub use context::AttemptContext;
pub use handler::{HandlerDispatch, RetryPolicy};
