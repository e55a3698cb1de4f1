//! Message collections: the handle stores a reference (topic, partition, offset) in a JSON
//! collection and reloads the record through a [`MessageLoader`] on read.

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use prosody_api::context::{DequeState, MapState, StagedCollection, ValueState};
use prosody_api::storage::ScanDirection;
use prosody_api::{ContextError, Message, Offset, Partition, Topic};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::deque::DequeHandle;
use super::loader::MessageLoader;
use super::map::MapHandle;
use super::value::ValueHandle;

/// What a message collection stores for each message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct MessageRef {
    topic: Topic,
    partition: i32,
    offset: i64,
}

fn to_ref(message: &Message) -> Value {
    serde_json::json!({
        "topic": message.topic.as_str(),
        "partition": message.partition.0,
        "offset": message.offset.0,
    })
}

async fn load(loader: &Arc<dyn MessageLoader>, stored: Value) -> Result<Message, ContextError> {
    let reference: MessageRef = serde_json::from_value(stored).map_err(|error| {
        ContextError::InvalidRequest(format!("a stored message reference is malformed: {error}"))
    })?;
    Ok(loader
        .load(
            &reference.topic,
            Partition(reference.partition),
            Offset(reference.offset),
        )
        .await?)
}

async fn load_opt(
    loader: &Arc<dyn MessageLoader>,
    stored: Option<Value>,
) -> Result<Option<Message>, ContextError> {
    match stored {
        Some(stored) => load(loader, stored).await.map(Some),
        None => Ok(None),
    }
}

/// A message handle over the JSON handle `H`.
#[derive(Debug)]
pub(crate) struct MessageHandle<H> {
    pub(crate) inner: H,
    pub(crate) loader: Arc<dyn MessageLoader>,
}

#[async_trait]
impl<H: StagedCollection> StagedCollection for MessageHandle<H> {
    async fn commit(&self) -> Result<(), ContextError> {
        self.inner.commit().await
    }

    async fn rollback(&self) -> Result<(), ContextError> {
        self.inner.rollback().await
    }
}

#[async_trait]
impl ValueState<Message> for MessageHandle<ValueHandle> {
    async fn get(&self) -> Result<Option<Message>, ContextError> {
        load_opt(&self.loader, self.inner.get().await?).await
    }

    async fn set(&self, message: Message) -> Result<(), ContextError> {
        self.inner.set(to_ref(&message)).await
    }

    async fn clear(&self) -> Result<(), ContextError> {
        self.inner.clear().await
    }
}

#[async_trait]
impl MapState<Message> for MessageHandle<MapHandle> {
    async fn get(&self, entry: &str) -> Result<Option<Message>, ContextError> {
        load_opt(&self.loader, self.inner.get(entry).await?).await
    }

    async fn get_many(&self, entries: &[String]) -> Result<Vec<Option<Message>>, ContextError> {
        let mut messages = Vec::with_capacity(entries.len());
        for stored in self.inner.get_many(entries).await? {
            messages.push(load_opt(&self.loader, stored).await?);
        }
        Ok(messages)
    }

    async fn has(&self, entry: &str) -> Result<bool, ContextError> {
        self.inner.has(entry).await
    }

    async fn set(&self, entry: &str, message: Message) -> Result<(), ContextError> {
        self.inner.set(entry, to_ref(&message)).await
    }

    async fn delete(&self, entry: &str) -> Result<bool, ContextError> {
        self.inner.delete(entry).await
    }

    async fn clear(&self) -> Result<(), ContextError> {
        self.inner.clear().await
    }

    fn entries(
        &self,
        direction: ScanDirection,
    ) -> BoxStream<'_, Result<(String, Message), ContextError>> {
        self.inner
            .entries(direction)
            .then(move |entry| async move {
                let (key, stored) = entry?;
                Ok((key, load(&self.loader, stored).await?))
            })
            .boxed()
    }

    fn keys(&self, direction: ScanDirection) -> BoxStream<'_, Result<String, ContextError>> {
        // No reload: the keys are in the store.
        self.inner.keys(direction)
    }
}

#[async_trait]
impl DequeState<Message> for MessageHandle<DequeHandle> {
    async fn push(&self, message: Message) -> Result<(), ContextError> {
        self.inner.push(to_ref(&message)).await
    }

    async fn unshift(&self, message: Message) -> Result<(), ContextError> {
        self.inner.unshift(to_ref(&message)).await
    }

    async fn pop(&self) -> Result<Option<Message>, ContextError> {
        load_opt(&self.loader, self.inner.pop().await?).await
    }

    async fn shift(&self) -> Result<Option<Message>, ContextError> {
        load_opt(&self.loader, self.inner.shift().await?).await
    }

    async fn at(&self, index: i64) -> Result<Option<Message>, ContextError> {
        load_opt(&self.loader, self.inner.at(index).await?).await
    }

    async fn length(&self) -> Result<u64, ContextError> {
        self.inner.length().await
    }

    async fn clear(&self) -> Result<(), ContextError> {
        self.inner.clear().await
    }

    fn values(&self, direction: ScanDirection) -> BoxStream<'_, Result<Message, ContextError>> {
        self.inner
            .values(direction)
            .then(move |stored| async move { load(&self.loader, stored?).await })
            .boxed()
    }
}
