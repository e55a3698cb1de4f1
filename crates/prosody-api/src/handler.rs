//! The handler contract.

use async_trait::async_trait;
use serde_json::Value;

use crate::context::EventContext;
use crate::error::ClassifyError;
use crate::record::{ExciseMessage, Message};
use crate::timer::Timer;

/// An application's event handler. All three methods are required: a handler that cannot
/// excise a key's data or handle its timers is not a complete handler (the spec rejects such a
/// subscription before consuming).
///
/// Events of one key are delivered one at a time, in order (messages, timers and excise records
/// together); different keys run concurrently. An `Err` is routed by its
/// [`ClassifyError::error_class`]: transient errors are retried or deferred, permanent ones go to
/// the failure policy of the mode.
///
/// ```
/// use async_trait::async_trait;
/// use prosody_api::{EventContext, EventHandler, ExciseMessage, HandlerError, Message, Timer};
/// use serde_json::{Value, json};
///
/// struct Echo;
///
/// #[async_trait]
/// impl EventHandler for Echo {
///     type Error = HandlerError;
///
///     async fn on_message(&self, _: &dyn EventContext, message: &Message) -> Result<Value, HandlerError> {
///         Ok(json!({ "seen": message.offset.0 }))
///     }
///
///     async fn on_excise(&self, context: &dyn EventContext, _: &ExciseMessage) -> Result<Value, HandlerError> {
///         context.clear_scheduled().await.map_err(HandlerError::transient)?;
///         Ok(Value::Null)
///     }
///
///     async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait EventHandler: Send + Sync + 'static {
    /// The handler's error; any type that says whether it is transient.
    type Error: std::error::Error + ClassifyError + Send + Sync + 'static;

    /// Handles a message. The returned JSON is the answer to a request (ignored otherwise).
    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, Self::Error>;

    /// Handles an excise record: delete every copy of the key's data. The returned JSON is the
    /// answer to an excise request.
    async fn on_excise(
        &self,
        context: &dyn EventContext,
        message: &ExciseMessage,
    ) -> Result<Value, Self::Error>;

    /// Handles a timer of the key that came due.
    async fn on_timer(&self, context: &dyn EventContext, timer: &Timer) -> Result<(), Self::Error>;
}
