//! The bottom of the middleware stack: one attempt of the application's [`EventHandler`].
//!
//! It calls the handler, classifies the outcome and settles the attempt's staged writes: a
//! success commits them (before the event can be reported done, so they are durable before
//! its offset commits), a failure drops them. Retrying, giving up and everything else belong
//! to the layers above (see [`crate::middleware`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use prosody_api::{ClassifyError, EventHandler, TimerKind};
use serde_json::Value;
use tracing::warn;

use super::context::AttemptContext;
use crate::event::Event;
use crate::middleware::{Failure, FailureKind, Service, Task, Verdict};
use crate::state::StateRuntime;
use crate::timers::Timers;

/// Calls an [`EventHandler`] once per task. A handler error keeps its class; a panic is a
/// bug in the handler but must not lose the record, so it counts as a transient failure.
pub struct HandlerService<H> {
    handler: Arc<H>,
    timers: Option<Timers>,
    state: Option<StateRuntime>,
}

impl<H> HandlerService<H> {
    /// Wraps `handler`; its contexts have no timers until [`Self::with_timers`].
    pub fn new(handler: Arc<H>) -> Self {
        Self {
            handler,
            timers: None,
            state: None,
        }
    }

    /// Gives handlers the timers API of `timers` (the same runtime the engine fires from).
    #[must_use]
    pub fn with_timers(mut self, timers: Timers) -> Self {
        self.timers = Some(timers);
        self
    }

    /// Gives handlers keyed state: the collections of `state`, bound to each event's key.
    #[must_use]
    pub fn with_state(mut self, state: StateRuntime) -> Self {
        self.state = Some(state);
        self
    }

    fn context<'t>(&'t self, task: &Task<'t>) -> AttemptContext<'t> {
        let context = AttemptContext::for_attempt(task.event.key(), task.cancel, task.attempt)
            .with_deadline(task.deadline);
        let context = match &self.timers {
            Some(timers) => context.with_timers(timers.stage(task.event)),
            None => context,
        };
        match &self.state {
            Some(state) => context.with_state(state.attempt(task.event.key().clone())),
            None => context,
        }
    }
}

impl<H: EventHandler> HandlerService<H> {
    async fn run(&self, event: &Event, context: &AttemptContext<'_>) -> Result<Value, Failure> {
        let failed = |kind, reason: String| Failure::new(kind, reason, context.attempt());
        let call = async {
            match event {
                Event::Message(message) => self.handler.on_message(context, message).await,
                Event::Excise(excise) => self.handler.on_excise(context, excise).await,
                Event::Timer(fired) => match fired.kind {
                    TimerKind::Application => self
                        .handler
                        .on_timer(context, &fired.timer)
                        .await
                        .map(|()| Value::Null),
                    // The defer middleware handles its own timers before they get here; without
                    // it there is nothing to retry, and completing removes the stray timer.
                    TimerKind::DeferRetry => {
                        warn!(key = %fired.timer.key, "defer-retry timer without a defer layer");
                        Ok(Value::Null)
                    }
                },
                Event::Rejected(rejected) => {
                    return Err(failed(FailureKind::Permanent, rejected.reason.clone()));
                }
            }
            .map_err(|error| {
                let kind = if error.is_permanent() {
                    FailureKind::Permanent
                } else {
                    FailureKind::Transient
                };
                failed(kind, error.to_string())
            })
        };
        match AssertUnwindSafe(call).catch_unwind().await {
            Ok(verdict) => verdict,
            Err(_) => Err(failed(
                FailureKind::Transient,
                "handler panicked".to_owned(),
            )),
        }
    }
}

impl<H: EventHandler> Service for HandlerService<H> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        // A commit of this key that this process left half done (state landed, timers not)
        // is finished first, so the attempt never sees half a commit.
        if let (Some(state), Some(timers)) = (&self.state, &self.timers)
            && state.journal().has_unfinished()
        {
            let (topic, partition) = task.event.source();
            if let Err(error) = Box::pin(state.journal().finish_known(
                timers,
                topic,
                partition,
                task.event.key(),
            ))
            .await
            {
                return Err(Failure::new(
                    FailureKind::Transient,
                    format!("finishing an interrupted commit failed: {error}"),
                    task.attempt,
                ));
            }
        }
        let mut context = self.context(task);
        let answer = self.run(task.event, &context).await;
        // A failed attempt's writes are dropped with the context (ending it first, so a state
        // handle the handler leaked cannot write); a successful one's are committed. The
        // handler is done with the context, so it is ours alone again: its writes are read
        // without their lock.
        context.end();
        let Ok(answer) = answer else {
            return answer;
        };
        if context.writes_nothing() {
            return Ok(answer);
        }
        // Boxed, like the other store writes of the stack: inline, the commit's state made this
        // service's future ~800 bytes, and with the layers above, every event's future outgrew
        // glibc's per-thread cache (see `crate::middleware::defer`).
        match Box::pin(context.commit()).await {
            Ok(()) => Ok(answer),
            Err(error) => {
                let kind = if error.is_permanent() {
                    FailureKind::Permanent
                } else {
                    FailureKind::Transient
                };
                Err(Failure::new(
                    kind,
                    format!("committing the attempt's writes failed: {error}"),
                    task.attempt,
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::stack::testing::{message, task};
    use async_trait::async_trait;
    use prosody_api::{EventContext, ExciseMessage, HandlerError, Message, Timer};
    use serde_json::json;

    struct Scripted;

    #[async_trait]
    impl EventHandler for Scripted {
        type Error = HandlerError;

        async fn on_message(
            &self,
            context: &dyn EventContext,
            message: &Message,
        ) -> Result<Value, HandlerError> {
            assert!(!context.should_cancel());
            match message.payload["do"].as_str() {
                Some("permanent") => Err(HandlerError::permanent("bad input")),
                Some("transient") => Err(HandlerError::transient("busy")),
                Some("panic") => panic!("handler bug"),
                _ => Ok(json!({"answer": 42})),
            }
        }

        async fn on_excise(
            &self,
            _: &dyn EventContext,
            _: &ExciseMessage,
        ) -> Result<Value, HandlerError> {
            Ok(Value::Null)
        }

        async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn classifies_errors_and_panics_and_keeps_the_answer() {
        let service = HandlerService::new(Arc::new(Scripted));
        let attempt = |action: &str| {
            let mut attempt = task(message("k", json!({ "do": action })));
            attempt.attempt = 3;
            attempt
        };
        let run = |action: &str| {
            let attempt = attempt(action);
            let service = &service;
            async move { service.call(&attempt).await }
        };
        assert_eq!(run("answer").await, Ok(json!({"answer": 42})));
        let permanent = run("permanent").await.expect_err("fails");
        assert_eq!(
            (permanent.kind, permanent.attempt, permanent.reason.as_str()),
            (
                FailureKind::Permanent,
                3,
                "permanent handler error: bad input"
            )
        );
        let transient = run("transient").await.expect_err("fails");
        assert_eq!(transient.kind, FailureKind::Transient);
        let panicked = run("panic").await.expect_err("fails");
        assert_eq!(
            (panicked.kind, panicked.reason.as_str()),
            (FailureKind::Transient, "handler panicked")
        );
    }
}
