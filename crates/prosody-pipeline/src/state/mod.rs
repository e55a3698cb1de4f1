//! Keyed state at run time: collections registered on the client, bound per attempt to the
//! current key, with transactional writes.
//!
//! # How a write flows
//!
//! 1. The client validates its [`CollectionDefinition`]s ([`definition::validate_all`]) and,
//!    before consuming, stores each collection's identity durably ([`registry::register`]):
//!    a name reused with another kind or payload is a permanent error.
//! 2. Each attempt gets an [`AttemptState`] for its key. `context.state(definition)` binds a
//!    handle to it; writes go to the attempt's *stage* for that collection and reads see them
//!    (read-your-writes), falling through to the store.
//! 3. When the attempt succeeds the dispatch turns every stage into absolute store ops and
//!    applies them in one atomic [`StateStore::apply`](prosody_api::storage::StateStore::apply)
//!    batch, before the timers' writes and before the event is reported done. A failed attempt
//!    drops its stages. `commit()` flushes one collection's stage early, `rollback()` drops it,
//!    and a `readUncommitted` collection flushes after every write.
//! 4. The attempt then ends: a handle kept past it fails with a transient error and writes
//!    nothing.
//!
//! Message collections keep a reference to the record ([`message`]) and reload it through a
//! [`MessageLoader`]. Excise: [`AttemptState::clear_all`] (exposed to handlers as
//! `KeyedStateContext::clear_all`) stages a clear of every registered collection of the key.

mod attempt;
pub mod definition;
mod deque;
pub mod journal;
pub mod loader;
mod map;
mod message;
pub mod registry;
mod stage;
mod value;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use prosody_api::context::{DequeState, KeyedStateContext, MapState, ValueState};
use prosody_api::storage::{StateScope, StateStore};
use prosody_api::{ConsumerGroup, ContextError, Key, Message, Subsystem};
use serde_json::Value;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::timers::Timers;

pub use attempt::AttemptState;
pub use definition::{
    Collection, CollectionDefinition, CollectionKind, DefinitionError, Identity, PayloadKind,
    ReadCacheOption,
};
pub use journal::Journal;
pub use loader::MessageLoader;
pub use registry::RegistryError;

use deque::DequeHandle;
use map::MapHandle;
use message::MessageHandle;
use value::ValueHandle;

#[derive(Debug)]
struct RuntimeInner {
    store: Arc<dyn StateStore>,
    group: ConsumerGroup,
    subsystem: Option<Subsystem>,
    collections: HashMap<String, Arc<Collection>>,
    loader: Option<Arc<dyn MessageLoader>>,
    journal: Journal,
}

/// The keyed-state runtime of one subscription: the store, the registered collections and the
/// message loader. Cheap to clone.
#[derive(Clone, Debug)]
pub struct StateRuntime {
    inner: Arc<RuntimeInner>,
}

impl StateRuntime {
    /// A runtime over `store` for `group`'s validated `collections`.
    pub fn new(
        store: Arc<dyn StateStore>,
        group: impl Into<ConsumerGroup>,
        collections: impl IntoIterator<Item = Collection>,
    ) -> Self {
        let group = group.into();
        Self {
            inner: Arc::new(RuntimeInner {
                journal: Journal::new(store.clone(), &group),
                store,
                group,
                subsystem: None,
                collections: collections
                    .into_iter()
                    .map(|collection| (collection.name.clone(), Arc::new(collection)))
                    .collect(),
                loader: None,
            }),
        }
    }

    fn rebuild(self, change: impl FnOnce(&mut RuntimeInner)) -> Self {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| RuntimeInner {
            store: shared.store.clone(),
            group: shared.group.clone(),
            subsystem: shared.subsystem.clone(),
            collections: shared.collections.clone(),
            loader: shared.loader.clone(),
            journal: shared.journal.clone(),
        });
        change(&mut inner);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Message collections reload records through `loader`.
    #[must_use]
    pub fn with_loader(self, loader: Arc<dyn MessageLoader>) -> Self {
        self.rebuild(|inner| inner.loader = Some(loader))
    }

    /// Published collections are stored under `subsystem` (readable by other groups).
    #[must_use]
    pub fn with_subsystem(self, subsystem: Option<Subsystem>) -> Self {
        self.rebuild(|inner| inner.subsystem = subsystem)
    }

    /// Stores the identity of every collection, or fails if one disagrees with the stored one.
    ///
    /// # Errors
    /// See [`registry::register`].
    pub async fn register(&self) -> Result<(), RegistryError> {
        let collections: Vec<Arc<Collection>> = self.collections().collect();
        registry::register(self.inner.store.as_ref(), &self.inner.group, &collections).await
    }

    /// The commit journal of the group (see [`journal`]).
    #[must_use]
    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// Runs the recovery sweep every `delay` until `cancel` fires: commits interrupted after
    /// their state landed get their timer writes applied (see [`journal`]).
    #[must_use = "the sweep stops when its token is cancelled; keep the handle to await it"]
    pub fn spawn_recovery(
        &self,
        timers: Timers,
        delay: Duration,
        cancel: CancellationToken,
        runtime: &Handle,
    ) -> JoinHandle<()> {
        let journal = self.inner.journal.clone();
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                if let Err(error) = journal.sweep(&timers, delay).await {
                    tracing::warn!(%error, "recovery sweep could not read the commit journal");
                }
            }
        })
    }

    /// The state of one attempt on `key`.
    #[must_use]
    pub fn attempt(&self, key: Key) -> AttemptState {
        AttemptState::new(self.clone(), key)
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.inner.store
    }

    /// The registered collection `name`.
    #[must_use]
    pub fn collection(&self, name: &str) -> Option<Arc<Collection>> {
        self.inner.collections.get(name).cloned()
    }

    /// Every registered collection.
    pub fn collections(&self) -> impl Iterator<Item = Arc<Collection>> + '_ {
        self.inner.collections.values().cloned()
    }

    /// Where a collection's data lives: under the subsystem when published (and a subsystem is
    /// configured), else under the group.
    #[must_use]
    pub fn scope(&self, collection: &Collection) -> StateScope {
        match (&self.inner.subsystem, collection.published) {
            (Some(subsystem), true) => {
                StateScope::subsystem(subsystem.clone(), collection.name.clone())
            }
            _ => StateScope::group(self.inner.group.clone(), collection.name.clone()),
        }
    }

    fn loader(&self) -> Result<Arc<dyn MessageLoader>, ContextError> {
        self.inner.loader.clone().ok_or_else(|| {
            ContextError::InvalidRequest(
                "message collections need a message loader, and none is configured".to_owned(),
            )
        })
    }
}

fn identity(kind: CollectionKind, payload: PayloadKind) -> Identity {
    Identity { kind, payload }
}

/// The attempt's binder: what the attempt's context delegates to, and what
/// `KeyedStateContext::owned_state` vends; it fails with `AttemptEnded` once the attempt ended.
impl KeyedStateContext for AttemptState {
    fn value(&self, collection: &str) -> Result<Box<dyn ValueState<Value>>, ContextError> {
        let cell = self.cell(
            collection,
            identity(CollectionKind::Value, PayloadKind::Json),
        )?;
        Ok(Box::new(ValueHandle { cell }))
    }

    fn map(&self, collection: &str) -> Result<Box<dyn MapState<Value>>, ContextError> {
        let cell = self.cell(collection, identity(CollectionKind::Map, PayloadKind::Json))?;
        Ok(Box::new(MapHandle { cell }))
    }

    fn deque(&self, collection: &str) -> Result<Box<dyn DequeState<Value>>, ContextError> {
        let cell = self.cell(
            collection,
            identity(CollectionKind::Deque, PayloadKind::Json),
        )?;
        Ok(Box::new(DequeHandle { cell }))
    }

    fn message_value(
        &self,
        collection: &str,
    ) -> Result<Box<dyn ValueState<Message>>, ContextError> {
        let cell = self.cell(
            collection,
            identity(CollectionKind::Value, PayloadKind::Message),
        )?;
        let loader = cell_loader(&cell)?;
        Ok(Box::new(MessageHandle {
            inner: ValueHandle { cell },
            loader,
        }))
    }

    fn message_map(&self, collection: &str) -> Result<Box<dyn MapState<Message>>, ContextError> {
        let cell = self.cell(
            collection,
            identity(CollectionKind::Map, PayloadKind::Message),
        )?;
        let loader = cell_loader(&cell)?;
        Ok(Box::new(MessageHandle {
            inner: MapHandle { cell },
            loader,
        }))
    }

    fn message_deque(
        &self,
        collection: &str,
    ) -> Result<Box<dyn DequeState<Message>>, ContextError> {
        let cell = self.cell(
            collection,
            identity(CollectionKind::Deque, PayloadKind::Message),
        )?;
        let loader = cell_loader(&cell)?;
        Ok(Box::new(MessageHandle {
            inner: DequeHandle { cell },
            loader,
        }))
    }

    fn clear_all(&self) -> futures::future::BoxFuture<'_, Result<(), ContextError>> {
        Box::pin(AttemptState::clear_all(self))
    }

    fn owned_state(&self) -> Option<Arc<dyn KeyedStateContext>> {
        Some(Arc::new(self.clone()))
    }
}

fn cell_loader(cell: &attempt::Cell) -> Result<Arc<dyn MessageLoader>, ContextError> {
    cell.runtime().loader()
}

/// Marker types naming what a [`Definition`] binds to.
pub mod kinds {
    /// A JSON value.
    #[derive(Debug, Clone, Copy)]
    pub struct Value;
    /// A JSON map.
    #[derive(Debug, Clone, Copy)]
    pub struct Map;
    /// A JSON deque.
    #[derive(Debug, Clone, Copy)]
    pub struct Deque;
    /// A message value.
    #[derive(Debug, Clone, Copy)]
    pub struct MessageValue;
    /// A message map.
    #[derive(Debug, Clone, Copy)]
    pub struct MessageMap;
    /// A message deque.
    #[derive(Debug, Clone, Copy)]
    pub struct MessageDeque;
}

/// How a kind marker binds a collection of a context.
pub trait Bind {
    /// The handle type.
    type Handle;
    /// Binds collection `name` of `context`.
    ///
    /// # Errors
    /// As for [`KeyedStateContext::value`].
    fn bind<C: KeyedStateContext + ?Sized>(
        context: &C,
        name: &str,
    ) -> Result<Self::Handle, ContextError>;
}

macro_rules! bind {
    ($kind:ident, $method:ident, $handle:ty) => {
        impl Bind for kinds::$kind {
            type Handle = $handle;
            fn bind<C: KeyedStateContext + ?Sized>(
                context: &C,
                name: &str,
            ) -> Result<Self::Handle, ContextError> {
                context.$method(name)
            }
        }
    };
}

bind!(Value, value, Box<dyn ValueState<Value>>);
bind!(Map, map, Box<dyn MapState<Value>>);
bind!(Deque, deque, Box<dyn DequeState<Value>>);
bind!(MessageValue, message_value, Box<dyn ValueState<Message>>);
bind!(MessageMap, message_map, Box<dyn MapState<Message>>);
bind!(MessageDeque, message_deque, Box<dyn DequeState<Message>>);

/// A typed collection definition: declare it once (e.g. in a `static`/`LazyLock`), register
/// it on the client and pass it to [`StateContextExt::state`] in handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition<K> {
    config: CollectionDefinition,
    kind: PhantomData<K>,
}

macro_rules! constructor {
    ($name:ident, $kind:ident, $doc:literal) => {
        #[doc = $doc]
        pub fn $name(name: impl Into<String>) -> Definition<kinds::$kind> {
            Definition {
                config: CollectionDefinition::$name(name),
                kind: PhantomData,
            }
        }
    };
}

constructor!(value, Value, "A JSON value collection.");
constructor!(map, Map, "A JSON map collection.");
constructor!(deque, Deque, "A JSON deque collection.");
constructor!(
    message_value,
    MessageValue,
    "A value collection of messages."
);
constructor!(message_map, MessageMap, "A map collection of messages.");
constructor!(
    message_deque,
    MessageDeque,
    "A deque collection of messages."
);

impl<K> Definition<K> {
    fn with(mut self, change: impl FnOnce(CollectionDefinition) -> CollectionDefinition) -> Self {
        self.config = change(self.config);
        self
    }

    /// Sets `ttlSeconds`.
    #[must_use]
    pub fn ttl_seconds(self, secs: u64) -> Self {
        self.with(|config| config.ttl_seconds(secs))
    }

    /// Sets `readUncommitted`.
    #[must_use]
    pub fn read_uncommitted(self, read_uncommitted: bool) -> Self {
        self.with(|config| config.read_uncommitted(read_uncommitted))
    }

    /// Sets `published`.
    #[must_use]
    pub fn published(self, published: bool) -> Self {
        self.with(|config| config.published(published))
    }

    /// Sets `readCache`.
    #[must_use]
    pub fn read_cache(self, cache: ReadCacheOption) -> Self {
        self.with(|config| config.read_cache(cache))
    }

    /// Sets `keysetLimit` (maps).
    #[must_use]
    pub fn keyset_limit(self, limit: u16) -> Self {
        self.with(|config| config.keyset_limit(limit))
    }

    /// Sets `capacity` (deques).
    #[must_use]
    pub fn capacity(self, capacity: u64) -> Self {
        self.with(|config| config.capacity(capacity))
    }

    /// The untyped definition, as registered.
    #[must_use]
    pub fn config(&self) -> &CollectionDefinition {
        &self.config
    }

    /// The durable name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.config.name
    }
}

impl<K> From<Definition<K>> for CollectionDefinition {
    fn from(definition: Definition<K>) -> Self {
        definition.config
    }
}

impl<K> From<&Definition<K>> for CollectionDefinition {
    fn from(definition: &Definition<K>) -> Self {
        definition.config.clone()
    }
}

/// `context.state(&DEFINITION)` for any handler context.
pub trait StateContextExt {
    /// Binds the definition's collection for the current key and attempt.
    ///
    /// # Errors
    /// [`ContextError::Unregistered`] or [`ContextError::Mismatch`] (permanent), or
    /// [`ContextError::AttemptEnded`].
    fn state<K: Bind>(&self, definition: &Definition<K>) -> Result<K::Handle, ContextError>;
}

impl<C: KeyedStateContext + ?Sized> StateContextExt for C {
    fn state<K: Bind>(&self, definition: &Definition<K>) -> Result<K::Handle, ContextError> {
        K::bind(self, definition.name())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use async_trait::async_trait;
    use futures::StreamExt;
    use prosody_api::storage::ScanDirection;
    use prosody_api::{
        ClassifyError, Offset, Partition, StorageError, StorageErrorKind, SystemClock, Topic,
    };
    use serde_json::json;
    use storage_memory::MemoryStateStore;

    use super::*;

    #[derive(Debug)]
    struct Gone;

    #[async_trait]
    impl MessageLoader for Gone {
        async fn load(
            &self,
            topic: &Topic,
            _: Partition,
            _: Offset,
        ) -> Result<Message, StorageError> {
            Err(StorageError::new(
                "state.load_message",
                StorageErrorKind::InvalidRequest,
                format!("{topic}: no longer available in Kafka"),
            ))
        }
    }

    fn runtime(definitions: &[CollectionDefinition]) -> StateRuntime {
        let collections =
            definition::validate_all(definitions, std::time::Duration::from_secs(1)).unwrap();
        StateRuntime::new(
            Arc::new(MemoryStateStore::new(SystemClock)),
            "group",
            collections,
        )
        .with_loader(Arc::new(Gone))
    }

    #[tokio::test]
    async fn map_scans_merge_staged_entries_across_store_chunks() {
        let runtime = runtime(&[CollectionDefinition::map("m").keyset_limit(0)]);
        let seed = runtime.attempt(Key::from("k"));
        let map = seed.map("m").unwrap();
        let mut expected = BTreeMap::new();
        for index in 0..600 {
            let entry = format!("e{index:04}");
            map.set(&entry, json!(index)).await.unwrap();
            expected.insert(entry, json!(index));
        }
        seed.commit().await.unwrap();

        let attempt = runtime.attempt(Key::from("k"));
        let map = attempt.map("m").unwrap();
        // Staged changes on both sides of the 256-entry chunk boundaries.
        for index in (0..600).step_by(7) {
            let entry = format!("e{index:04}");
            assert!(map.delete(&entry).await.unwrap());
            expected.remove(&entry);
        }
        for extra in ["e0256x", "e0511x", "a", "zz"] {
            map.set(extra, json!(extra)).await.unwrap();
            expected.insert(extra.to_owned(), json!(extra));
        }
        let forward: Vec<(String, Value)> = map
            .entries(ScanDirection::Forward)
            .map(Result::unwrap)
            .collect()
            .await;
        assert_eq!(forward, expected.clone().into_iter().collect::<Vec<_>>());
        let backward: Vec<(String, Value)> = map
            .entries(ScanDirection::Backward)
            .map(Result::unwrap)
            .collect()
            .await;
        assert_eq!(backward, expected.into_iter().rev().collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn ended_attempts_reject_handles_and_drop_their_writes() {
        let runtime = runtime(&[CollectionDefinition::value("v")]);
        let attempt = runtime.attempt(Key::from("k"));
        let value = attempt.value("v").unwrap();
        value.set(json!(1)).await.unwrap();
        attempt.end();
        assert!(matches!(
            value.set(json!(2)).await,
            Err(ContextError::AttemptEnded)
        ));
        assert!(matches!(
            attempt.value("v"),
            Err(ContextError::AttemptEnded)
        ));
        let next = runtime.attempt(Key::from("k"));
        assert_eq!(next.value("v").unwrap().get().await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_owned_binder_binds_like_the_attempt_and_ends_with_it() {
        let runtime = runtime(&[CollectionDefinition::value("v")]);
        let attempt = runtime.attempt(Key::from("k"));
        let binder = KeyedStateContext::owned_state(&attempt).unwrap();
        binder.value("v").unwrap().set(json!(1)).await.unwrap();
        assert_eq!(
            attempt.value("v").unwrap().get().await.unwrap(),
            Some(json!(1))
        );
        assert!(binder.deque("v").map(|_| ()).unwrap_err().is_permanent());
        attempt.end();
        assert!(matches!(
            binder.value("v").map(|_| ()),
            Err(ContextError::AttemptEnded)
        ));
    }

    #[tokio::test]
    async fn unregistered_and_mismatched_collections_are_permanent() {
        let runtime = runtime(&[CollectionDefinition::value("v")]);
        let attempt = runtime.attempt(Key::from("k"));
        let unregistered = attempt.map("nope").map(|_| ()).unwrap_err();
        assert!(matches!(unregistered, ContextError::Unregistered(_)));
        let mismatch = attempt.deque("v").map(|_| ()).unwrap_err();
        assert!(mismatch.is_permanent(), "{mismatch}");
    }

    #[tokio::test]
    async fn a_message_whose_record_is_gone_reads_as_a_clear_error() {
        let runtime = runtime(&[CollectionDefinition::message_value("msg")]);
        let attempt = runtime.attempt(Key::from("k"));
        let handle = attempt.message_value("msg").unwrap();
        handle
            .set(Message {
                topic: Topic::from("t"),
                partition: Partition(0),
                offset: Offset(5),
                timestamp: prosody_api::Timestamp::from_millis(0),
                key: Key::from("k"),
                payload: json!({}).into(),
                headers: prosody_api::Headers::new(),
            })
            .await
            .unwrap();
        let error = handle.get().await.unwrap_err();
        assert!(error.to_string().contains("no longer available"), "{error}");
        assert!(error.is_permanent());
    }

    #[tokio::test]
    async fn identity_is_durable_and_checked_on_registration() {
        let store: Arc<dyn prosody_api::storage::StateStore> =
            Arc::new(MemoryStateStore::new(SystemClock));
        let delay = std::time::Duration::from_secs(1);
        let first = definition::validate_all(&[CollectionDefinition::value("x")], delay).unwrap();
        StateRuntime::new(store.clone(), "g", first)
            .register()
            .await
            .unwrap();
        let same = definition::validate_all(&[CollectionDefinition::value("x")], delay).unwrap();
        StateRuntime::new(store.clone(), "g", same)
            .register()
            .await
            .unwrap();
        let other =
            definition::validate_all(&[CollectionDefinition::message_value("x")], delay).unwrap();
        let error = StateRuntime::new(store.clone(), "g", other)
            .register()
            .await
            .unwrap_err();
        assert!(error.is_permanent(), "{error}");
        // Another group has its own registry.
        let elsewhere = definition::validate_all(&[CollectionDefinition::map("x")], delay).unwrap();
        StateRuntime::new(store, "other", elsewhere)
            .register()
            .await
            .unwrap();
    }
}
