//! The [`EventHandler`] that runs a JavaScript handler.
//!
//! Every event becomes one call of a JavaScript dispatch function through a napi
//! [`ThreadsafeFunction`]: the call is queued to the Node.js event loop, the function starts the
//! application's `onMessage`/`onExcise`/`onTimer` and returns its promise, and this side awaits
//! that promise. Because the pipeline never starts a key's next event before the previous
//! handler future finished, and that future finishes only when the promise settled, one key's
//! JavaScript handlers never overlap, while handlers of different keys are all pending on the
//! event loop at once.
//!
//! While the promise is pending the attempt's future also serves the context requests the
//! handler makes (see [`crate::context`]) and watches for cancellation: when the pipeline
//! cancels the attempt (timeout, revocation, shutdown) it flags `context.shouldCancel` and asks
//! JavaScript to abort the handler's `AbortSignal`.
//!
//! The dispatch function never throws or rejects: it settles with `undefined` (the handler
//! answered `null`/`undefined`), with `{ response }` (the handler's answer as JSON text) or with
//! `{ error, permanent }` (the handler threw; `permanent` was decided from the thrown value's
//! class by `index.js`).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use napi::Status;
use napi::bindgen_prelude::{FnArgs, Promise};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use parking_lot::RwLock;
use prosody::api::{
    ClassifyError, ErrorClass, EventContext, EventHandler, ExciseMessage, Message, Timer,
};
use serde_json::Value;

use crate::context::Attempt;

/// What kind of event a dispatch call carries (the first argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum EventKind {
    /// `onMessage(context, message, signal)`.
    Message = 0,
    /// `onExcise(context, message, signal)`.
    Excise = 1,
    /// `onTimer(context, timer, signal)`.
    Timer = 2,
}

/// The arguments of one dispatch call: kind, attempt id, key, topic, partition, offset,
/// timestamp (ms since the epoch; a timer's time), payload as JSON text (messages only).
///
/// Plain values rather than one object: napi creates each with one call, and `index.js` builds
/// the message object (and parses the payload with `JSON.parse`) itself, which is far cheaper
/// than building it property by property across the boundary.
pub type DispatchArgs = (u32, u32, String, String, i32, i64, f64, Option<String>);

/// How the JavaScript dispatch function settles when it does not settle with `undefined`.
#[napi(object)]
#[derive(Debug, Default)]
pub struct HandlerReply {
    /// The handler's answer as JSON text.
    pub response: Option<String>,
    /// The message of what the handler threw.
    pub error: Option<String>,
    /// True when what the handler threw is classified permanent.
    pub permanent: Option<bool>,
}

/// The JavaScript dispatch function.
pub type DispatchFn = ThreadsafeFunction<
    FnArgs<DispatchArgs>,
    Promise<Option<HandlerReply>>,
    FnArgs<DispatchArgs>,
    Status,
    false,
>;

/// The JavaScript function that aborts the `AbortSignal` of an attempt id. Weak: a pending
/// abort never keeps the process alive.
pub type AbortFn = ThreadsafeFunction<u32, (), u32, Status, false, true>;

/// A failed JavaScript handler.
#[derive(Debug)]
pub struct JsHandlerError {
    message: String,
    class: ErrorClass,
}

impl JsHandlerError {
    fn new(message: impl Into<String>, class: ErrorClass) -> Self {
        Self {
            message: message.into(),
            class,
        }
    }
}

impl fmt::Display for JsHandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for JsHandlerError {}

impl ClassifyError for JsHandlerError {
    fn error_class(&self) -> ErrorClass {
        self.class
    }
}

/// The threadsafe functions of the current subscription. Cleared on unsubscribe and shutdown so
/// the Node.js process is no longer kept alive by them, even if the pipeline still holds the
/// handler for a moment.
#[derive(Default)]
pub struct Bridge {
    functions: RwLock<Option<(Arc<DispatchFn>, Arc<AbortFn>)>>,
}

impl Bridge {
    /// A bridge to `dispatch` and `abort`.
    #[must_use]
    pub fn new(dispatch: DispatchFn, abort: AbortFn) -> Self {
        Self {
            functions: RwLock::new(Some((Arc::new(dispatch), Arc::new(abort)))),
        }
    }

    /// Releases the JavaScript functions; later events fail transiently.
    pub fn release(&self) {
        self.functions.write().take();
    }
}

/// An [`EventHandler`] that runs the JavaScript handler behind a [`Bridge`].
#[derive(Clone)]
pub struct JsHandler {
    bridge: Arc<Bridge>,
}

impl JsHandler {
    /// A handler calling through `bridge`.
    #[must_use]
    pub fn new(bridge: Arc<Bridge>) -> Self {
        Self { bridge }
    }

    async fn run(
        &self,
        context: &dyn EventContext,
        args: impl FnOnce(u32) -> DispatchArgs,
    ) -> Result<Value, JsHandlerError> {
        let (attempt, mut requests) = Attempt::open();
        let functions = self
            .bridge
            .functions
            .read()
            .as_ref()
            .map(|(dispatch, abort)| (dispatch.clone(), abort.clone()));
        let Some((dispatch, abort)) = functions else {
            return Err(JsHandlerError::new(
                "the JavaScript handler was released (unsubscribed)",
                ErrorClass::Transient,
            ));
        };
        let id = attempt.id();
        let call = async move {
            let promise = dispatch.call_async_catch(FnArgs::from(args(id))).await?;
            promise.await
        };
        tokio::pin!(call);
        let cancelled = context.cancelled();
        tokio::pin!(cancelled);
        let mut cancel_seen = false;
        let mut serving = FuturesUnordered::new();
        let settled = loop {
            tokio::select! {
                biased;
                settled = &mut call => break settled,
                Some(request) = requests.recv() => serving.push(request.serve(context)),
                Some(()) = serving.next(), if !serving.is_empty() => {}
                () = &mut cancelled, if !cancel_seen => {
                    cancel_seen = true;
                    attempt.mark_cancelled();
                    abort.call(id, ThreadsafeFunctionCallMode::NonBlocking);
                }
            }
        };
        // Requests still in flight are dropped with the attempt: JavaScript sees AttemptEnded.
        drop(serving);
        drop(attempt);
        match settled {
            Ok(None) => Ok(Value::Null),
            Ok(Some(reply)) => reply_to_result(reply),
            Err(error) => Err(JsHandlerError::new(
                format!("the JavaScript handler could not be called: {error}"),
                ErrorClass::Transient,
            )),
        }
    }
}

fn reply_to_result(reply: HandlerReply) -> Result<Value, JsHandlerError> {
    if let Some(error) = reply.error {
        let class = if reply.permanent.unwrap_or(false) {
            ErrorClass::Permanent
        } else {
            ErrorClass::Transient
        };
        return Err(JsHandlerError::new(error, class));
    }
    match reply.response {
        None => Ok(Value::Null),
        Some(text) => serde_json::from_str(&text).map_err(|error| {
            JsHandlerError::new(
                format!("the handler's answer is not valid JSON: {error}"),
                ErrorClass::Permanent,
            )
        }),
    }
}

fn payload_text(payload: &Value) -> Option<String> {
    // Serializing a `Value` cannot fail (its map keys are strings).
    serde_json::to_string(payload).ok()
}

#[allow(
    clippy::cast_precision_loss,
    reason = "timestamps in ms are far below 2^53, the exact range of a JS number"
)]
fn millis(ms: i64) -> f64 {
    ms as f64
}

#[async_trait]
impl EventHandler for JsHandler {
    type Error = JsHandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, JsHandlerError> {
        let payload = payload_text(&message.payload);
        self.run(context, |id| {
            (
                EventKind::Message as u32,
                id,
                message.key.as_str().to_owned(),
                message.topic.as_str().to_owned(),
                message.partition.0,
                message.offset.0,
                millis(message.timestamp.as_millis()),
                payload,
            )
        })
        .await
    }

    async fn on_excise(
        &self,
        context: &dyn EventContext,
        message: &ExciseMessage,
    ) -> Result<Value, JsHandlerError> {
        self.run(context, |id| {
            (
                EventKind::Excise as u32,
                id,
                message.key.as_str().to_owned(),
                message.topic.as_str().to_owned(),
                message.partition.0,
                message.offset.0,
                millis(message.timestamp.as_millis()),
                None,
            )
        })
        .await
    }

    async fn on_timer(
        &self,
        context: &dyn EventContext,
        timer: &Timer,
    ) -> Result<(), JsHandlerError> {
        let seconds = i64::try_from(timer.time.as_secs()).unwrap_or(i64::MAX);
        self.run(context, |id| {
            (
                EventKind::Timer as u32,
                id,
                timer.key.as_str().to_owned(),
                String::new(),
                -1,
                -1,
                millis(seconds.saturating_mul(1000)),
                None,
            )
        })
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_map_to_results_and_classes() {
        assert_eq!(
            reply_to_result(HandlerReply {
                response: Some("{\"a\":1}".to_owned()),
                ..HandlerReply::default()
            })
            .ok(),
            Some(serde_json::json!({"a": 1}))
        );
        let permanent = reply_to_result(HandlerReply {
            error: Some("bad".to_owned()),
            permanent: Some(true),
            ..HandlerReply::default()
        });
        assert!(permanent.is_err_and(|error| error.is_permanent()));
        let transient = reply_to_result(HandlerReply {
            error: Some("busy".to_owned()),
            ..HandlerReply::default()
        });
        assert!(transient.is_err_and(|error| !error.is_permanent()));
        assert!(
            reply_to_result(HandlerReply {
                response: Some("{".to_owned()),
                ..HandlerReply::default()
            })
            .is_err_and(|error| error.is_permanent())
        );
    }
}
