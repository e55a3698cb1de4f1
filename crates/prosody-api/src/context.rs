//! What a handler can do during one event: schedule timers for its key, read and write its
//! key's state, and notice cancellation. These are traits the pipeline implements; handlers
//! receive them as `&dyn EventContext`.
//!
//! Contexts and the state handles they vend are valid only for the event attempt they were
//! given to. Handles own what they need (`'static`), so a binding can hand them to another
//! runtime (JS) and a handler can move them into a task; the pipeline therefore makes every
//! operation after the attempt fail with [`ContextError::AttemptEnded`] without changing
//! anything.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde_json::Value;

use crate::error::ContextError;
use crate::key::Key;
use crate::record::Message;
use crate::storage::ScanDirection;
use crate::timer::TimerTime;

/// The timers API for the current key. Times have one-second precision; scheduling a second
/// that is already scheduled changes nothing. Only application timers are visible here.
#[async_trait]
pub trait TimerContext: Send + Sync {
    /// Schedules a timer at `time` (upsert).
    async fn schedule(&self, time: TimerTime) -> Result<(), ContextError>;

    /// Replaces every timer of the key with one at `time`. Use it instead of `schedule` when a
    /// retried event must not add a second timer.
    async fn clear_and_schedule(&self, time: TimerTime) -> Result<(), ContextError>;

    /// Removes the timer at `time`, if any.
    async fn unschedule(&self, time: TimerTime) -> Result<(), ContextError>;

    /// Removes every timer of the key.
    async fn clear_scheduled(&self) -> Result<(), ContextError>;

    /// The key's scheduled times, ascending.
    async fn scheduled(&self) -> Result<Vec<TimerTime>, ContextError>;
}

/// Cancellation of the current attempt (timeout, partition revocation, shutdown).
#[async_trait]
pub trait Cancellation: Send + Sync {
    /// True once the attempt has been asked to stop.
    fn should_cancel(&self) -> bool;

    /// Completes when the attempt is asked to stop (immediately if it already was).
    async fn cancelled(&self);
}

/// Explicit transaction control of one collection handle. By default a handler's writes commit
/// when it succeeds and are discarded when it fails.
#[async_trait]
pub trait StagedCollection: Send + Sync {
    /// Makes this collection's pending writes durable now; a later failure keeps them.
    async fn commit(&self) -> Result<(), ContextError>;

    /// Drops this collection's pending writes since its last commit.
    async fn rollback(&self) -> Result<(), ContextError>;
}

/// A value collection of the current key. Reads see the handler's own pending writes.
#[async_trait]
pub trait ValueState<T>: StagedCollection {
    /// The value, or `None`.
    async fn get(&self) -> Result<Option<T>, ContextError>;
    /// Sets the value.
    async fn set(&self, value: T) -> Result<(), ContextError>;
    /// Removes the value.
    async fn clear(&self) -> Result<(), ContextError>;
}

/// A string-keyed ordered map of the current key.
#[async_trait]
pub trait MapState<V>: StagedCollection {
    /// The entry's value, or `None`.
    async fn get(&self, entry: &str) -> Result<Option<V>, ContextError>;
    /// The values of several entries, in the order asked.
    async fn get_many(&self, entries: &[String]) -> Result<Vec<Option<V>>, ContextError>;
    /// True when the entry is present.
    async fn has(&self, entry: &str) -> Result<bool, ContextError>;
    /// Sets an entry.
    async fn set(&self, entry: &str, value: V) -> Result<(), ContextError>;
    /// Removes an entry; true when it was present.
    async fn delete(&self, entry: &str) -> Result<bool, ContextError>;
    /// Removes every entry.
    async fn clear(&self) -> Result<(), ContextError>;
    /// Entries in key order, fetched lazily in chunks; dropping the stream early is safe.
    fn entries(&self, direction: ScanDirection)
    -> BoxStream<'_, Result<(String, V), ContextError>>;
    /// Entry keys in key order, fetched lazily in chunks; dropping the stream early is safe.
    fn keys(&self, direction: ScanDirection) -> BoxStream<'_, Result<String, ContextError>>
    where
        V: 'static,
    {
        use futures::StreamExt;
        self.entries(direction)
            .map(|entry| entry.map(|(key, _)| key))
            .boxed()
    }
    /// Entry values in key order, fetched lazily in chunks; dropping the stream early is safe.
    fn values(&self, direction: ScanDirection) -> BoxStream<'_, Result<V, ContextError>>
    where
        V: Send + 'static,
    {
        use futures::StreamExt;
        self.entries(direction)
            .map(|entry| entry.map(|(_, value)| value))
            .boxed()
    }
}

/// A double-ended queue of the current key, bounded by its collection's capacity.
#[async_trait]
pub trait DequeState<T>: StagedCollection {
    /// Appends at the back; with a capacity, a full deque drops its front (oldest) item.
    async fn push(&self, item: T) -> Result<(), ContextError>;
    /// Prepends at the front.
    async fn unshift(&self, item: T) -> Result<(), ContextError>;
    /// Removes and returns the back item.
    async fn pop(&self) -> Result<Option<T>, ContextError>;
    /// Removes and returns the front item.
    async fn shift(&self) -> Result<Option<T>, ContextError>;
    /// The item at `index` from the front (negative counts from the back).
    async fn at(&self, index: i64) -> Result<Option<T>, ContextError>;
    /// Number of items.
    async fn length(&self) -> Result<u64, ContextError>;
    /// True when there are no items.
    async fn is_empty(&self) -> Result<bool, ContextError> {
        Ok(self.length().await? == 0)
    }
    /// Removes every item.
    async fn clear(&self) -> Result<(), ContextError>;
    /// Items front to back (or back to front), fetched lazily in chunks.
    fn values(&self, direction: ScanDirection) -> BoxStream<'_, Result<T, ContextError>>;
}

/// Access to the current key's registered collections by name. JSON collections hold
/// [`Value`]s; message collections hold the [`Message`] the handler received (stored as a
/// reference and reloaded from Kafka). Typed wrappers (serde) can be layered on top.
pub trait KeyedStateContext: Send + Sync {
    /// A JSON value collection.
    ///
    /// # Errors
    /// [`ContextError::Unregistered`] or [`ContextError::Mismatch`] (both permanent), or
    /// [`ContextError::AttemptEnded`]; the same for every method of this trait.
    fn value(&self, collection: &str) -> Result<Box<dyn ValueState<Value>>, ContextError>;
    /// A JSON map collection.
    ///
    /// # Errors
    /// As for [`KeyedStateContext::value`].
    fn map(&self, collection: &str) -> Result<Box<dyn MapState<Value>>, ContextError>;
    /// A JSON deque collection.
    ///
    /// # Errors
    /// As for [`KeyedStateContext::value`].
    fn deque(&self, collection: &str) -> Result<Box<dyn DequeState<Value>>, ContextError>;
    /// A message value collection.
    ///
    /// # Errors
    /// As for [`KeyedStateContext::value`].
    fn message_value(&self, collection: &str)
    -> Result<Box<dyn ValueState<Message>>, ContextError>;
    /// A message map collection.
    ///
    /// # Errors
    /// As for [`KeyedStateContext::value`].
    fn message_map(&self, collection: &str) -> Result<Box<dyn MapState<Message>>, ContextError>;
    /// A message deque collection.
    ///
    /// # Errors
    /// As for [`KeyedStateContext::value`].
    fn message_deque(&self, collection: &str)
    -> Result<Box<dyn DequeState<Message>>, ContextError>;
    /// Clears every registered collection of the current key, as one pending write of each
    /// (committed with the attempt): what `on_excise` calls to remove the key's state.
    ///
    /// # Errors
    /// [`ContextError::AttemptEnded`], or a store error writing a `readUncommitted` collection.
    fn clear_all(&self) -> BoxFuture<'_, Result<(), ContextError>>;
    /// An owned binder of this attempt's collections: it binds exactly as `self` does and ends
    /// with the attempt. For a binding whose handler runs on another thread than the one that
    /// holds the borrowed context (Node.js), so `context.state()` can bind synchronously there.
    /// `None` when the context has no keyed state (no collections are registered).
    fn owned_state(&self) -> Option<Arc<dyn KeyedStateContext>> {
        None
    }
}

/// Everything a handler gets for one event of one key.
pub trait EventContext: TimerContext + KeyedStateContext + Cancellation {
    /// The key of the event; timers and state calls act on it.
    fn key(&self) -> &Key;
}
