//! From events to the application's [`prosody_api::EventHandler`]: the per-attempt context and
//! the service at the bottom of the middleware stack that calls the handler.

pub mod context;
pub mod handler;

pub use context::AttemptContext;
pub use handler::HandlerService;
