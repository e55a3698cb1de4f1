//! The innermost dispatch: calls the application's handler, retrying transient failures.
//!
//! This is the pipeline mode's core guarantee (never drop a record on a transient failure);
//! the failure-handling middleware (modes, failure topic, defer) wraps or replaces it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::FutureExt;
use prosody_api::{ClassifyError, EventHandler};
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use super::context::AttemptContext;
use crate::consumer::{Dispatch, Outcome};
use crate::event::Event;

/// Delays between attempts: exponential from `base` to `max_delay`, with jitter.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    pub base: Duration,
    /// Upper bound of any delay.
    pub max_delay: Duration,
}

impl RetryPolicy {
    fn delays(&self) -> impl Iterator<Item = Duration> {
        ExponentialBuilder::default()
            .with_min_delay(self.base)
            .with_max_delay(self.max_delay)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// Dispatches events to an [`EventHandler`]: transient failures (and panics, which are bugs in
/// the handler but must not lose the record) are retried with backoff until they succeed;
/// permanent failures are logged and the record is considered done.
pub struct HandlerDispatch<H> {
    handler: Arc<H>,
    retry: RetryPolicy,
}

impl<H> HandlerDispatch<H> {
    /// Wraps `handler`.
    pub fn new(handler: Arc<H>, retry: RetryPolicy) -> Self {
        Self { handler, retry }
    }
}

enum Attempt {
    Succeeded,
    Failed { permanent: bool, reason: String },
}

impl<H: EventHandler> HandlerDispatch<H> {
    async fn attempt(&self, event: &Event, context: &AttemptContext) -> Attempt {
        let call = async {
            match event {
                Event::Message(message) => {
                    self.handler.on_message(context, message).await.map(drop)
                }
                Event::Excise(excise) => self.handler.on_excise(context, excise).await.map(drop),
            }
        };
        match AssertUnwindSafe(call).catch_unwind().await {
            Ok(Ok(())) => Attempt::Succeeded,
            Ok(Err(failure)) => Attempt::Failed {
                permanent: failure.is_permanent(),
                reason: failure.to_string(),
            },
            Err(_) => Attempt::Failed {
                permanent: false,
                reason: "handler panicked".to_owned(),
            },
        }
    }
}

#[async_trait]
impl<H: EventHandler> Dispatch for HandlerDispatch<H> {
    async fn dispatch(&self, event: Event, cancel: CancellationToken) -> Outcome {
        let mut delays = self.retry.delays();
        for attempt in 1_u64.. {
            let context = AttemptContext::new(event.key().clone(), cancel.child_token());
            let result = self.attempt(&event, &context).await;
            context.end();
            match result {
                Attempt::Succeeded => return Outcome::Completed,
                Attempt::Failed {
                    permanent: true,
                    reason,
                } => {
                    error!(key = %event.key(), offset = ?event.offset(), attempt, %reason,
                        "permanent handler failure: record not retried");
                    return Outcome::Completed;
                }
                Attempt::Failed { reason, .. } => {
                    let delay = delays.next().unwrap_or(self.retry.max_delay);
                    warn!(key = %event.key(), offset = ?event.offset(), attempt, %reason,
                        retry_in = ?delay, "transient handler failure: retrying");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = cancel.cancelled() => return Outcome::Abandoned,
                    }
                }
            }
        }
        Outcome::Abandoned
    }
}
