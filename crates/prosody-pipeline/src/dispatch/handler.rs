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
use prosody_api::{ClassifyError, EventHandler, TimerKind};
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use super::context::AttemptContext;
use crate::consumer::{Dispatch, Outcome};
use crate::event::Event;
use crate::timers::Timers;

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
///
/// Each attempt gets a fresh [`AttemptContext`]; its staged writes are committed when the
/// attempt succeeds (before the event is reported completed) and dropped when it fails.
pub struct HandlerDispatch<H> {
    handler: Arc<H>,
    retry: RetryPolicy,
    timers: Option<Timers>,
}

impl<H> HandlerDispatch<H> {
    /// Wraps `handler`; its contexts have no timers until [`Self::with_timers`].
    pub fn new(handler: Arc<H>, retry: RetryPolicy) -> Self {
        Self {
            handler,
            retry,
            timers: None,
        }
    }

    /// Gives handlers the timers API of `timers` (the same runtime the engine fires from).
    #[must_use]
    pub fn with_timers(mut self, timers: Timers) -> Self {
        self.timers = Some(timers);
        self
    }

    fn context(&self, event: &Event, cancel: CancellationToken) -> AttemptContext {
        let context = AttemptContext::new(event.key().clone(), cancel);
        match &self.timers {
            Some(timers) => context.with_timers(timers.stage(event)),
            None => context,
        }
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
                Event::Timer(fired) => match fired.kind {
                    TimerKind::Application => self.handler.on_timer(context, &fired.timer).await,
                    // The defer middleware handles its own timers before they get here; without
                    // it there is nothing to retry, and completing removes the stray timer.
                    TimerKind::DeferRetry => {
                        warn!(key = %fired.timer.key, "defer-retry timer without a defer layer");
                        Ok(())
                    }
                },
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
            let context = self.context(&event, cancel.child_token());
            let result = match self.attempt(&event, &context).await {
                // The attempt's writes commit with it, before the event counts as done.
                Attempt::Succeeded => match context.commit().await {
                    Ok(()) => return Outcome::Completed,
                    Err(failure) => Attempt::Failed {
                        permanent: failure.is_permanent(),
                        reason: format!("committing the attempt's writes failed: {failure}"),
                    },
                },
                failed @ Attempt::Failed { .. } => failed,
            };
            context.end();
            match result {
                Attempt::Succeeded => return Outcome::Completed,
                Attempt::Failed {
                    permanent: true,
                    reason,
                } => {
                    error!(key = %event.key(), offset = ?event.offset(), attempt, %reason,
                        "permanent handler failure: record not retried");
                    if let Err(failure) = context.give_up().await {
                        warn!(key = %event.key(), %failure, "removing a given-up timer failed");
                    }
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
