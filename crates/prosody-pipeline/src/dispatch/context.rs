//! The context a handler receives for one attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use futures::future::BoxFuture;
use prosody_api::context::{DequeState, MapState, ValueState};
use prosody_api::{
    Cancellation, ContextError, EventContext, Key, KeyedStateContext, Message, StorageError,
    TimerContext, TimerKind, TimerTime,
};
use serde_json::Value;

use crate::consumer::CancelWatch;
use crate::deadline::{Deadline, cancelled_or_past, until_cancelled_or_past};
use crate::state::AttemptState;
use crate::timers::{StagedTimers, TimerWrite};

/// The context of one attempt of one event: its key, its cancellation, its timers and its
/// keyed state. Every operation after [`AttemptContext::end`] fails with
/// [`ContextError::AttemptEnded`] and changes nothing, state handles included.
///
/// Writes are staged in the context, not stored. Whoever runs the attempt decides their fate
/// once it has ended: [`AttemptContext::commit`] after a success (before reporting the event
/// completed, so the writes are durable before its offset can commit),
/// [`AttemptContext::give_up`] when the event is completed without success, and nothing (drop
/// the context) when the attempt failed and will be retried.
///
/// It borrows the event's key and the dispatch's view of its cancellation, for the attempt is
/// over before the dispatch ends: taking shares of them would move the signal's reference count
/// between the cores handling a partition's events, twice per event.
#[derive(Debug)]
pub struct AttemptContext<'a> {
    key: &'a Key,
    cancel: &'a CancelWatch,
    deadline: Option<Deadline<'a>>,
    attempt: u32,
    ended: AtomicBool,
    timers: Option<StagedTimers<'a>>,
    state: Option<AttemptState>,
}

impl<'a> AttemptContext<'a> {
    /// A context for an attempt on `key`, cancelled through `cancel`, without timers (their
    /// calls fail with an invalid-request error).
    #[must_use]
    pub fn new(key: &'a Key, cancel: &'a CancelWatch) -> Self {
        Self::for_attempt(key, cancel, 1)
    }

    /// A context for attempt number `attempt` (from 1) on `key`.
    #[must_use]
    pub fn for_attempt(key: &'a Key, cancel: &'a CancelWatch, attempt: u32) -> Self {
        Self {
            key,
            cancel,
            deadline: None,
            attempt,
            ended: AtomicBool::new(false),
            timers: None,
            state: None,
        }
    }

    /// The context reports cancellation from `deadline` on too (the handler timeout).
    #[must_use]
    pub fn with_deadline(mut self, deadline: Option<Deadline<'a>>) -> Self {
        self.deadline = deadline;
        self
    }

    /// The attempt number, from 1.
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Gives the context the timers API, staged in `timers` (from
    /// [`crate::timers::Timers::stage`] for the attempt's event).
    #[must_use]
    pub fn with_timers(mut self, timers: StagedTimers<'a>) -> Self {
        self.timers = Some(timers);
        self
    }

    /// Gives the context keyed state, staged in `state` (from
    /// [`crate::state::StateRuntime::attempt`] for the attempt's key).
    #[must_use]
    pub fn with_state(mut self, state: AttemptState) -> Self {
        self.state = Some(state);
        self
    }

    /// Ends the attempt: the context and every state handle it vended are unusable from now on.
    pub fn end(&self) {
        // A flag that only ever goes up, read by the context's own calls: release and acquire
        // order it with what the attempt did, and on x86 neither is a locked instruction (a
        // sequentially consistent store is, once per event).
        self.ended.store(true, Ordering::Release);
        if let Some(state) = &self.state {
            state.end();
        }
    }

    /// True when committing the attempt would only end it: it has no keyed state, and its
    /// timers (if any) staged no write and have no fired timer to remove. Most attempts of a
    /// handler that uses neither are like that, and skip the commit's boxed future. Asked by the
    /// context's owner once the handler is done, so the staged writes are read without a lock.
    #[must_use]
    pub fn writes_nothing(&mut self) -> bool {
        self.state.is_none() && self.timers.as_mut().is_none_or(StagedTimers::is_empty)
    }

    /// Ends the attempt and applies its staged writes (for a timer event, removing the fired
    /// timer first). Call it when the attempt succeeded, before reporting the event done.
    ///
    /// # Errors
    /// The store's error: treat it as a transient failure of the attempt (every write is
    /// idempotent, so retrying the event is safe).
    pub async fn commit(&self) -> Result<(), StorageError> {
        self.end();
        // State in one atomic batch; with timer writes too, that batch journals them so the
        // two land together (see `crate::state::journal`).
        match (&self.state, &self.timers) {
            (Some(state), Some(timers)) => state.commit_with(timers).await,
            (Some(state), None) => state.commit().await,
            (None, Some(timers)) => timers.commit().await,
            (None, None) => Ok(()),
        }
    }

    /// Ends the attempt, drops its staged writes and, for a timer event, removes the fired
    /// timer. Call it when the event is completed without success (a permanent failure).
    ///
    /// # Errors
    /// The store's error; the fired timer may then fire again.
    pub async fn give_up(&self) -> Result<(), StorageError> {
        self.end();
        match &self.timers {
            Some(timers) => timers.give_up().await,
            None => Ok(()),
        }
    }

    /// Stages a timer write of any kind. The timers API of [`TimerContext`] writes
    /// application timers; middleware (defer) writes its own kind through this.
    ///
    /// # Errors
    /// [`ContextError::AttemptEnded`], an invalid time, or no timers configured.
    pub fn stage_timer(&self, write: TimerWrite) -> Result<(), ContextError> {
        Ok(self.timers()?.stage(write)?)
    }

    /// The key's scheduled times of `kind`, as the attempt's commit would leave them.
    ///
    /// # Errors
    /// [`ContextError::AttemptEnded`], no timers configured, or the store's error.
    pub async fn scheduled_of(&self, kind: TimerKind) -> Result<Vec<TimerTime>, ContextError> {
        Ok(self.timers()?.scheduled(kind).await?)
    }

    fn live(&self) -> Result<(), ContextError> {
        if self.ended.load(Ordering::Acquire) {
            Err(ContextError::AttemptEnded)
        } else {
            Ok(())
        }
    }

    /// The attempt's keyed state, for a handle on `collection`. With no collection
    /// registered at all, `collection` is as unregistered as with others registered: a
    /// permanent error, since retrying the event cannot make it exist.
    fn state(&self, collection: &str) -> Result<&AttemptState, ContextError> {
        self.live()?;
        self.state
            .as_ref()
            .ok_or_else(|| ContextError::Unregistered(collection.to_owned()))
    }

    fn timers(&self) -> Result<&StagedTimers<'a>, ContextError> {
        self.live()?;
        self.timers.as_ref().ok_or_else(|| {
            ContextError::InvalidRequest(
                "durable timers are not configured for this dispatch".to_owned(),
            )
        })
    }
}

const APPLICATION: TimerKind = TimerKind::Application;

#[async_trait]
impl TimerContext for AttemptContext<'_> {
    async fn schedule(&self, time: TimerTime) -> Result<(), ContextError> {
        self.stage_timer(TimerWrite::Schedule(APPLICATION, time))
    }

    async fn clear_and_schedule(&self, time: TimerTime) -> Result<(), ContextError> {
        self.stage_timer(TimerWrite::ClearAndSchedule(APPLICATION, time))
    }

    async fn unschedule(&self, time: TimerTime) -> Result<(), ContextError> {
        self.stage_timer(TimerWrite::Unschedule(APPLICATION, time))
    }

    async fn clear_scheduled(&self) -> Result<(), ContextError> {
        self.stage_timer(TimerWrite::Clear(APPLICATION))
    }

    async fn scheduled(&self) -> Result<Vec<TimerTime>, ContextError> {
        self.scheduled_of(APPLICATION).await
    }
}

#[async_trait]
impl Cancellation for AttemptContext<'_> {
    fn should_cancel(&self) -> bool {
        cancelled_or_past(self.cancel, self.deadline)
    }

    async fn cancelled(&self) {
        until_cancelled_or_past(self.cancel, self.deadline).await;
    }
}

impl KeyedStateContext for AttemptContext<'_> {
    fn value(&self, collection: &str) -> Result<Box<dyn ValueState<Value>>, ContextError> {
        self.state(collection)?.value(collection)
    }

    fn map(&self, collection: &str) -> Result<Box<dyn MapState<Value>>, ContextError> {
        self.state(collection)?.map(collection)
    }

    fn deque(&self, collection: &str) -> Result<Box<dyn DequeState<Value>>, ContextError> {
        self.state(collection)?.deque(collection)
    }

    fn message_value(
        &self,
        collection: &str,
    ) -> Result<Box<dyn ValueState<Message>>, ContextError> {
        self.state(collection)?.message_value(collection)
    }

    fn message_map(&self, collection: &str) -> Result<Box<dyn MapState<Message>>, ContextError> {
        self.state(collection)?.message_map(collection)
    }

    fn message_deque(
        &self,
        collection: &str,
    ) -> Result<Box<dyn DequeState<Message>>, ContextError> {
        self.state(collection)?.message_deque(collection)
    }

    fn clear_all(&self) -> BoxFuture<'_, Result<(), ContextError>> {
        Box::pin(async move {
            match &self.state {
                Some(state) => state.clear_all().await,
                // No collections: nothing to clear.
                None => self.live(),
            }
        })
    }

    fn owned_state(&self) -> Option<Arc<dyn KeyedStateContext>> {
        self.state
            .clone()
            .map(|state| Arc::new(state) as Arc<dyn KeyedStateContext>)
    }
}

impl EventContext for AttemptContext<'_> {
    fn key(&self) -> &Key {
        self.key
    }
}

#[cfg(test)]
mod tests {
    use prosody_api::{ClassifyError, ErrorClass, Partition, SlabSize, SystemClock, Timer, Topic};
    use serde_json::json;
    use storage_memory::MemoryTimerStore;

    use super::*;
    use crate::event::{Event, FiredTimer};
    use crate::middleware::stack::testing::message;
    use crate::timers::{TimerSettings, Timers};

    #[tokio::test]
    async fn only_an_attempt_with_a_timer_write_or_a_fired_timer_has_anything_to_commit() {
        let timers = Timers::new(
            Arc::new(MemoryTimerStore::new(SlabSize::DEFAULT)),
            "g",
            Arc::new(SystemClock),
            TimerSettings::default(),
        );
        let (key, cancel) = (Key::from("k"), CancelWatch::detached(Arc::default()));
        let message = message("k", json!({}));
        let mut on_message = AttemptContext::new(&key, &cancel).with_timers(timers.stage(&message));
        assert!(on_message.writes_nothing());
        on_message
            .schedule(TimerTime::from_secs(4_000_000_000))
            .await
            .expect("staged");
        assert!(!on_message.writes_nothing(), "a staged write is committed");
        let fired = Event::Timer(FiredTimer {
            topic: Topic::from("t"),
            partition: Partition(0),
            kind: TimerKind::Application,
            timer: Timer {
                key: Key::from("k"),
                time: TimerTime::from_secs(4_000_000_000),
            },
        });
        let mut on_timer = AttemptContext::new(&key, &cancel).with_timers(timers.stage(&fired));
        assert!(
            !on_timer.writes_nothing(),
            "the fired timer is removed by the commit"
        );
    }

    #[test]
    fn a_collection_without_any_registered_is_unregistered_and_permanent() {
        let (key, cancel) = (Key::from("k"), CancelWatch::detached(Arc::default()));
        let context = AttemptContext::new(&key, &cancel);
        let Err(error) = context.map("orders") else {
            panic!("a handle on a collection that is not registered");
        };
        assert!(
            matches!(&error, ContextError::Unregistered(name) if name == "orders"),
            "{error:?}"
        );
        assert_eq!(error.error_class(), ErrorClass::Permanent);
    }
}
