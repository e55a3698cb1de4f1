//! The context a handler receives for one attempt.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use prosody_api::context::{DequeState, MapState, ValueState};
use prosody_api::{
    Cancellation, ContextError, EventContext, Key, KeyedStateContext, Message, TimerContext,
    TimerTime,
};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The context of one attempt of one event: its key, its cancellation, and (as their issues
/// land) its timers and keyed state. Every operation after [`AttemptContext::end`] fails with
/// [`ContextError::AttemptEnded`] and changes nothing.
#[derive(Debug)]
pub struct AttemptContext {
    key: Key,
    cancel: CancellationToken,
    deadline: Option<Instant>,
    attempt: u32,
    ended: AtomicBool,
}

impl AttemptContext {
    /// A context for an attempt on `key`, cancelled through `cancel`.
    #[must_use]
    pub fn new(key: Key, cancel: CancellationToken) -> Self {
        Self::for_attempt(key, cancel, 1)
    }

    /// A context for attempt number `attempt` (from 1) on `key`.
    #[must_use]
    pub fn for_attempt(key: Key, cancel: CancellationToken, attempt: u32) -> Self {
        Self {
            key,
            cancel,
            deadline: None,
            attempt,
            ended: AtomicBool::new(false),
        }
    }

    /// The context reports cancellation from `deadline` on too (the handler timeout).
    #[must_use]
    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// The attempt number, from 1.
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Ends the attempt: the context is unusable from now on.
    pub fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    fn live(&self) -> Result<(), ContextError> {
        if self.ended.load(Ordering::SeqCst) {
            Err(ContextError::AttemptEnded)
        } else {
            Ok(())
        }
    }

    fn timers_unavailable(&self) -> Result<(), ContextError> {
        self.live()?;
        Err(ContextError::InvalidRequest(
            "durable timers are not available in this version of the pipeline".to_owned(),
        ))
    }
}

#[async_trait]
impl TimerContext for AttemptContext {
    async fn schedule(&self, _: TimerTime) -> Result<(), ContextError> {
        self.timers_unavailable()
    }

    async fn clear_and_schedule(&self, _: TimerTime) -> Result<(), ContextError> {
        self.timers_unavailable()
    }

    async fn unschedule(&self, _: TimerTime) -> Result<(), ContextError> {
        self.timers_unavailable()
    }

    async fn clear_scheduled(&self) -> Result<(), ContextError> {
        self.timers_unavailable()
    }

    async fn scheduled(&self) -> Result<Vec<TimerTime>, ContextError> {
        self.timers_unavailable().map(|()| Vec::new())
    }
}

#[async_trait]
impl Cancellation for AttemptContext {
    fn should_cancel(&self) -> bool {
        self.cancel.is_cancelled()
            || self
                .deadline
                .is_some_and(|deadline| Instant::now() >= deadline)
    }

    async fn cancelled(&self) {
        match self.deadline {
            Some(deadline) => tokio::select! {
                () = self.cancel.cancelled() => {}
                () = tokio::time::sleep_until(deadline) => {}
            },
            None => self.cancel.cancelled().await,
        }
    }
}

impl KeyedStateContext for AttemptContext {
    fn value(&self, collection: &str) -> Result<Box<dyn ValueState<Value> + '_>, ContextError> {
        self.live()?;
        Err(ContextError::Unregistered(collection.to_owned()))
    }

    fn map(&self, collection: &str) -> Result<Box<dyn MapState<Value> + '_>, ContextError> {
        self.live()?;
        Err(ContextError::Unregistered(collection.to_owned()))
    }

    fn deque(&self, collection: &str) -> Result<Box<dyn DequeState<Value> + '_>, ContextError> {
        self.live()?;
        Err(ContextError::Unregistered(collection.to_owned()))
    }

    fn message_value(
        &self,
        collection: &str,
    ) -> Result<Box<dyn ValueState<Message> + '_>, ContextError> {
        self.live()?;
        Err(ContextError::Unregistered(collection.to_owned()))
    }

    fn message_map(
        &self,
        collection: &str,
    ) -> Result<Box<dyn MapState<Message> + '_>, ContextError> {
        self.live()?;
        Err(ContextError::Unregistered(collection.to_owned()))
    }

    fn message_deque(
        &self,
        collection: &str,
    ) -> Result<Box<dyn DequeState<Message> + '_>, ContextError> {
        self.live()?;
        Err(ContextError::Unregistered(collection.to_owned()))
    }
}

impl EventContext for AttemptContext {
    fn key(&self) -> &Key {
        &self.key
    }
}
