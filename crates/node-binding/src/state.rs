//! Keyed-state handles for JavaScript.
//!
//! `context.state(definition)` binds a collection synchronously on the Node.js thread through
//! the attempt's owned binder ([`prosody::api::KeyedStateContext::owned_state`], kept in the
//! attempt's registry slot, see [`crate::context`]). The handle it returns, [`NativeState`],
//! owns the Rust handle, so every operation is one napi call straight to the Rust runtime, not a
//! round trip through the attempt's future. The Rust handle ends with its attempt: a handle the
//! handler kept fails with a transient state error and changes nothing.
//!
//! Items cross as JSON text: JSON items as themselves; message items as the reference
//! `[topic, partition, offset]` going in (message collections store a reference and reload the
//! record) and `[topic, partition, offset, timestampMs, key, payload]` coming out.
//!
//! Scans ([`NativeCursor`]) run in a task that owns the handle and its stream and serves one
//! chunk per request, so nothing is read before JavaScript asks and dropping the cursor (an
//! early `break`) ends the task and the stream.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use napi_derive::napi;
use parking_lot::Mutex;
use prosody::api::storage::ScanDirection;
use prosody::api::{
    ContextError, DequeState, Headers, Key, KeyedStateContext, MapState, Message, Offset,
    Partition, StagedCollection, Timestamp, Topic, ValueState,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::errors::{ErrorKind, classified};

/// A state error for JavaScript: `TransientStateError` or `PermanentStateError` by class.
#[must_use]
pub fn state_error(error: &ContextError) -> napi::Error {
    classified(ErrorKind::State, error)
}

fn invalid(message: impl Into<String>) -> ContextError {
    ContextError::InvalidRequest(message.into())
}

/// How an item type crosses the boundary.
trait Item: Send + Sized + 'static {
    /// The item from the JSON text JavaScript sent.
    fn decode(text: &str) -> Result<Self, ContextError>;
    /// Appends the item's JSON text.
    fn encode(&self, out: &mut String) -> Result<(), ContextError>;
}

fn append_json(
    value: &(impl serde::Serialize + ?Sized),
    out: &mut String,
) -> Result<(), ContextError> {
    let text = serde_json::to_string(value)
        .map_err(|error| invalid(format!("an item cannot be encoded as JSON: {error}")))?;
    out.push_str(&text);
    Ok(())
}

impl Item for Value {
    fn decode(text: &str) -> Result<Self, ContextError> {
        serde_json::from_str(text)
            .map_err(|error| invalid(format!("an item is not valid JSON: {error}")))
    }

    fn encode(&self, out: &mut String) -> Result<(), ContextError> {
        append_json(self, out)
    }
}

impl Item for Message {
    fn decode(text: &str) -> Result<Self, ContextError> {
        let (topic, partition, offset): (String, i32, i64) =
            serde_json::from_str(text).map_err(|_| {
                invalid(
                    "a message collection stores messages given to the handler (with topic, \
                     partition and offset)",
                )
            })?;
        // Only the reference is stored; the record is reloaded from Kafka on read.
        Ok(Message {
            topic: Topic::from(topic),
            partition: Partition(partition),
            offset: Offset(offset),
            timestamp: Timestamp::from_millis(0),
            key: Key::from(""),
            payload: Value::Null.into(),
            headers: Headers::new(),
        })
    }

    fn encode(&self, out: &mut String) -> Result<(), ContextError> {
        append_json(
            &(
                self.topic.as_str(),
                self.partition.0,
                self.offset.0,
                self.timestamp.as_millis(),
                self.key.as_str(),
                &self.payload,
            ),
            out,
        )
    }
}

fn encode_opt<T: Item>(item: Option<T>) -> Result<Option<String>, ContextError> {
    item.map(|item| {
        let mut out = String::new();
        item.encode(&mut out).map(|()| out)
    })
    .transpose()
}

/// One bound handle of each collection shape.
enum Handle {
    Value(Arc<dyn ValueState<Value>>),
    Map(Arc<dyn MapState<Value>>),
    Deque(Arc<dyn DequeState<Value>>),
    MessageValue(Arc<dyn ValueState<Message>>),
    MessageMap(Arc<dyn MapState<Message>>),
    MessageDeque(Arc<dyn DequeState<Message>>),
}

/// Binds collection `name` as kind `kind`: 0 value, 1 map, 2 deque, 3-5 their message forms.
///
/// # Errors
/// `Unregistered`/`Mismatch` (permanent) or `AttemptEnded`.
pub fn bind(
    binder: Option<&dyn KeyedStateContext>,
    kind: u32,
    name: &str,
) -> Result<NativeState, ContextError> {
    // Without keyed state (no collections registered) every name is unregistered.
    let binder = binder.ok_or_else(|| ContextError::Unregistered(name.to_owned()))?;
    let handle = match kind {
        0 => Handle::Value(binder.value(name)?.into()),
        1 => Handle::Map(binder.map(name)?.into()),
        2 => Handle::Deque(binder.deque(name)?.into()),
        3 => Handle::MessageValue(binder.message_value(name)?.into()),
        4 => Handle::MessageMap(binder.message_map(name)?.into()),
        5 => Handle::MessageDeque(binder.message_deque(name)?.into()),
        other => return Err(invalid(format!("unknown collection kind code {other}"))),
    };
    Ok(NativeState { handle })
}

/// A collection handle of one attempt. Methods that do not apply to the handle's kind reject.
#[napi]
pub struct NativeState {
    handle: Handle,
}

fn wrong_kind(operation: &str) -> ContextError {
    invalid(format!(
        "`{operation}` does not apply to this collection kind"
    ))
}

fn entry_of<'a>(entry: Option<&'a str>, operation: &str) -> Result<&'a str, ContextError> {
    entry.ok_or_else(|| invalid(format!("`{operation}` of a map needs an entry key")))
}

impl NativeState {
    fn staged(&self) -> &dyn StagedCollection {
        match &self.handle {
            Handle::Value(h) => h.as_ref(),
            Handle::Map(h) => h.as_ref(),
            Handle::Deque(h) => h.as_ref(),
            Handle::MessageValue(h) => h.as_ref(),
            Handle::MessageMap(h) => h.as_ref(),
            Handle::MessageDeque(h) => h.as_ref(),
        }
    }

    async fn get_inner(&self, entry: Option<String>) -> Result<Option<String>, ContextError> {
        let entry = entry.as_deref();
        match &self.handle {
            Handle::Value(h) => encode_opt(h.get().await?),
            Handle::MessageValue(h) => encode_opt(h.get().await?),
            Handle::Map(h) => encode_opt(h.get(entry_of(entry, "get")?).await?),
            Handle::MessageMap(h) => encode_opt(h.get(entry_of(entry, "get")?).await?),
            _ => Err(wrong_kind("get")),
        }
    }

    async fn set_inner(&self, entry: Option<String>, item: String) -> Result<(), ContextError> {
        let entry = entry.as_deref();
        match &self.handle {
            Handle::Value(h) => h.set(Item::decode(&item)?).await,
            Handle::MessageValue(h) => h.set(Item::decode(&item)?).await,
            Handle::Map(h) => h.set(entry_of(entry, "set")?, Item::decode(&item)?).await,
            Handle::MessageMap(h) => h.set(entry_of(entry, "set")?, Item::decode(&item)?).await,
            _ => Err(wrong_kind("set")),
        }
    }

    async fn get_many_inner(&self, entries: Vec<String>) -> Result<String, ContextError> {
        fn list<T: Item>(items: Vec<Option<T>>) -> Result<String, ContextError> {
            let mut out = String::from("[");
            for (index, item) in items.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                match item {
                    Some(item) => item.encode(&mut out)?,
                    None => out.push_str("null"),
                }
            }
            out.push(']');
            Ok(out)
        }
        match &self.handle {
            Handle::Map(h) => list(h.get_many(&entries).await?),
            Handle::MessageMap(h) => list(h.get_many(&entries).await?),
            _ => Err(wrong_kind("getMany")),
        }
    }

    async fn has_inner(&self, entry: String) -> Result<bool, ContextError> {
        match &self.handle {
            Handle::Map(h) => h.has(&entry).await,
            Handle::MessageMap(h) => h.has(&entry).await,
            _ => Err(wrong_kind("has")),
        }
    }

    async fn delete_inner(&self, entry: String) -> Result<bool, ContextError> {
        match &self.handle {
            Handle::Map(h) => h.delete(&entry).await,
            Handle::MessageMap(h) => h.delete(&entry).await,
            _ => Err(wrong_kind("delete")),
        }
    }

    async fn clear_inner(&self) -> Result<(), ContextError> {
        match &self.handle {
            Handle::Value(h) => h.clear().await,
            Handle::Map(h) => h.clear().await,
            Handle::Deque(h) => h.clear().await,
            Handle::MessageValue(h) => h.clear().await,
            Handle::MessageMap(h) => h.clear().await,
            Handle::MessageDeque(h) => h.clear().await,
        }
    }

    async fn insert_inner(&self, back: bool, item: String) -> Result<(), ContextError> {
        match (&self.handle, back) {
            (Handle::Deque(h), true) => h.push(Item::decode(&item)?).await,
            (Handle::Deque(h), false) => h.unshift(Item::decode(&item)?).await,
            (Handle::MessageDeque(h), true) => h.push(Item::decode(&item)?).await,
            (Handle::MessageDeque(h), false) => h.unshift(Item::decode(&item)?).await,
            _ => Err(wrong_kind(if back { "push" } else { "unshift" })),
        }
    }

    async fn remove_inner(&self, back: bool) -> Result<Option<String>, ContextError> {
        match (&self.handle, back) {
            (Handle::Deque(h), true) => encode_opt(h.pop().await?),
            (Handle::Deque(h), false) => encode_opt(h.shift().await?),
            (Handle::MessageDeque(h), true) => encode_opt(h.pop().await?),
            (Handle::MessageDeque(h), false) => encode_opt(h.shift().await?),
            _ => Err(wrong_kind(if back { "pop" } else { "shift" })),
        }
    }

    async fn at_inner(&self, index: f64) -> Result<Option<String>, ContextError> {
        if !index.is_finite() || index.fract() != 0.0 || index.abs() > 9_007_199_254_740_991.0 {
            return Err(invalid(format!(
                "a deque index must be an integer, not {index}"
            )));
        }
        #[allow(
            clippy::cast_possible_truncation,
            reason = "checked above: a safe integer"
        )]
        let index = index as i64;
        match &self.handle {
            Handle::Deque(h) => encode_opt(h.at(index).await?),
            Handle::MessageDeque(h) => encode_opt(h.at(index).await?),
            _ => Err(wrong_kind("at")),
        }
    }

    async fn length_inner(&self) -> Result<u64, ContextError> {
        match &self.handle {
            Handle::Deque(h) => h.length().await,
            Handle::MessageDeque(h) => h.length().await,
            _ => Err(wrong_kind("length")),
        }
    }

    async fn is_empty_inner(&self) -> Result<bool, ContextError> {
        match &self.handle {
            Handle::Deque(h) => h.is_empty().await,
            Handle::MessageDeque(h) => h.is_empty().await,
            _ => Err(wrong_kind("isEmpty")),
        }
    }
}

#[napi]
impl NativeState {
    /// `get()` of a value, `get(entry)` of a map: the item's JSON text, or null when absent.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn get(&self, entry: Option<String>) -> napi::Result<Option<String>> {
        self.get_inner(entry).await.map_err(|e| state_error(&e))
    }

    /// `set(item)` of a value, `set(entry, item)` of a map; `item` is JSON text.
    ///
    /// # Errors
    /// A classified `state` error (null items are rejected: null means absence).
    #[napi]
    pub async fn set(&self, entry: Option<String>, item: String) -> napi::Result<()> {
        self.set_inner(entry, item)
            .await
            .map_err(|e| state_error(&e))
    }

    /// `getMany(entries)` of a map: a JSON array, null where an entry is absent.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn get_many(&self, entries: Vec<String>) -> napi::Result<String> {
        self.get_many_inner(entries)
            .await
            .map_err(|e| state_error(&e))
    }

    /// `has(entry)` of a map.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn has(&self, entry: String) -> napi::Result<bool> {
        self.has_inner(entry).await.map_err(|e| state_error(&e))
    }

    /// `delete(entry)` of a map: true when the entry was present.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn delete(&self, entry: String) -> napi::Result<bool> {
        self.delete_inner(entry).await.map_err(|e| state_error(&e))
    }

    /// `clear()` of every kind.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn clear(&self) -> napi::Result<()> {
        self.clear_inner().await.map_err(|e| state_error(&e))
    }

    /// `push(item)` (`back`) or `unshift(item)` of a deque; `item` is JSON text.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn insert(&self, back: bool, item: String) -> napi::Result<()> {
        self.insert_inner(back, item)
            .await
            .map_err(|e| state_error(&e))
    }

    /// `pop()` (`back`) or `shift()` of a deque: the item's JSON text, or null when empty.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn remove(&self, back: bool) -> napi::Result<Option<String>> {
        self.remove_inner(back).await.map_err(|e| state_error(&e))
    }

    /// `at(index)` of a deque (negative counts from the back).
    ///
    /// # Errors
    /// A classified `state` error (a non-integer index included).
    #[napi]
    pub async fn at(&self, index: f64) -> napi::Result<Option<String>> {
        self.at_inner(index).await.map_err(|e| state_error(&e))
    }

    /// `length()` of a deque.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn length(&self) -> napi::Result<i64> {
        let length = self.length_inner().await.map_err(|e| state_error(&e))?;
        Ok(i64::try_from(length).unwrap_or(i64::MAX))
    }

    /// `isEmpty()` of a deque.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn is_empty(&self) -> napi::Result<bool> {
        self.is_empty_inner().await.map_err(|e| state_error(&e))
    }

    /// `commit()`: makes the collection's pending writes durable now.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn commit(&self) -> napi::Result<()> {
        self.staged().commit().await.map_err(|e| state_error(&e))
    }

    /// `rollback()`: drops the collection's pending writes since its last commit.
    ///
    /// # Errors
    /// A classified `state` error.
    #[napi]
    pub async fn rollback(&self) -> napi::Result<()> {
        self.staged().rollback().await.map_err(|e| state_error(&e))
    }

    /// A lazy scan: `what` is 0 entries, 1 keys, 2 values (deques: values only); `direction`
    /// is `"forward"` or `"backward"`.
    ///
    /// # Errors
    /// A classified `state` error for an unknown direction or a scan the kind lacks.
    #[napi]
    pub fn scan(&self, what: u32, direction: String) -> napi::Result<NativeCursor> {
        let direction = match direction.as_str() {
            "forward" => ScanDirection::Forward,
            "backward" => ScanDirection::Backward,
            other => {
                return Err(state_error(&invalid(format!(
                    "a scan direction is \"forward\" or \"backward\", not {other:?}"
                ))));
            }
        };
        let scan = match (&self.handle, what) {
            (Handle::Map(h), 0) => Scan::MapEntries(h.clone()),
            (Handle::Map(h), 1) => Scan::MapKeys(h.clone()),
            (Handle::Map(h), 2) => Scan::MapValues(h.clone()),
            (Handle::MessageMap(h), 0) => Scan::MessageMapEntries(h.clone()),
            (Handle::MessageMap(h), 1) => Scan::MessageMapKeys(h.clone()),
            (Handle::MessageMap(h), 2) => Scan::MessageMapValues(h.clone()),
            (Handle::Deque(h), 2) => Scan::DequeValues(h.clone()),
            (Handle::MessageDeque(h), 2) => Scan::MessageDequeValues(h.clone()),
            _ => return Err(state_error(&wrong_kind("this scan"))),
        };
        Ok(NativeCursor {
            state: Mutex::new(Cursor::Idle(scan, direction)),
        })
    }
}

/// What a scan reads, with the handle it owns.
enum Scan {
    MapEntries(Arc<dyn MapState<Value>>),
    MapKeys(Arc<dyn MapState<Value>>),
    MapValues(Arc<dyn MapState<Value>>),
    MessageMapEntries(Arc<dyn MapState<Message>>),
    MessageMapKeys(Arc<dyn MapState<Message>>),
    MessageMapValues(Arc<dyn MapState<Message>>),
    DequeValues(Arc<dyn DequeState<Value>>),
    MessageDequeValues(Arc<dyn DequeState<Message>>),
}

/// A request for the next chunk of at most `.0` items, answered with the chunk's JSON array
/// text, or `None` once the scan is exhausted.
type ChunkRequest = (usize, oneshot::Sender<Result<Option<String>, ContextError>>);

/// A map entry as `[key, item]`.
struct Entry<T>((String, T));

impl<T: Item> Item for Entry<T> {
    fn decode(_: &str) -> Result<Self, ContextError> {
        Err(invalid("entries are not decoded"))
    }

    fn encode(&self, out: &mut String) -> Result<(), ContextError> {
        let (key, item) = &self.0;
        append_json(key, out)?;
        out.push(',');
        item.encode(out)?;
        Ok(())
    }
}

impl Item for String {
    fn decode(text: &str) -> Result<Self, ContextError> {
        Ok(text.to_owned())
    }

    fn encode(&self, out: &mut String) -> Result<(), ContextError> {
        append_json(self, out)
    }
}

/// Serves chunk requests from `stream` until the cursor is dropped.
async fn serve<T: Item>(
    stream: impl Stream<Item = Result<T, ContextError>>,
    wrap: bool,
    mut requests: mpsc::Receiver<ChunkRequest>,
) {
    let stream = stream.fuse();
    futures::pin_mut!(stream);
    let mut finished = false;
    while let Some((max, reply)) = requests.recv().await {
        let answer = chunk(&mut stream, max.max(1), wrap, &mut finished).await;
        if reply.send(answer).is_err() {
            return;
        }
    }
}

async fn chunk<T: Item>(
    stream: &mut (impl Stream<Item = Result<T, ContextError>> + Unpin),
    max: usize,
    wrap: bool,
    finished: &mut bool,
) -> Result<Option<String>, ContextError> {
    if *finished {
        return Ok(None);
    }
    let mut out = String::from("[");
    let mut count = 0;
    while count < max {
        match stream.next().await {
            None => {
                *finished = true;
                break;
            }
            Some(Err(error)) => {
                *finished = true;
                return Err(error);
            }
            Some(Ok(item)) => {
                if count > 0 {
                    out.push(',');
                }
                if wrap {
                    out.push('[');
                }
                item.encode(&mut out)?;
                if wrap {
                    out.push(']');
                }
                count += 1;
            }
        }
    }
    if count == 0 {
        return Ok(None);
    }
    out.push(']');
    Ok(Some(out))
}

fn start(scan: Scan, direction: ScanDirection) -> mpsc::Sender<ChunkRequest> {
    let (sender, requests) = mpsc::channel(1);
    let values = |item: Result<(String, _), ContextError>| item.map(|(_, value)| value);
    match scan {
        Scan::MapEntries(h) => tokio::spawn(async move {
            serve(h.entries(direction).map(|r| r.map(Entry)), true, requests).await;
        }),
        Scan::MapKeys(h) => tokio::spawn(async move {
            serve(h.keys(direction), false, requests).await;
        }),
        Scan::MapValues(h) => tokio::spawn(async move {
            serve::<Value>(h.entries(direction).map(values), false, requests).await;
        }),
        Scan::MessageMapEntries(h) => tokio::spawn(async move {
            serve(h.entries(direction).map(|r| r.map(Entry)), true, requests).await;
        }),
        Scan::MessageMapKeys(h) => tokio::spawn(async move {
            serve(h.keys(direction), false, requests).await;
        }),
        Scan::MessageMapValues(h) => tokio::spawn(async move {
            serve::<Message>(
                h.entries(direction).map(|r| r.map(|(_, m)| m)),
                false,
                requests,
            )
            .await;
        }),
        Scan::DequeValues(h) => tokio::spawn(async move {
            serve(h.values(direction), false, requests).await;
        }),
        Scan::MessageDequeValues(h) => tokio::spawn(async move {
            serve(h.values(direction), false, requests).await;
        }),
    };
    sender
}

enum Cursor {
    /// Not read yet: the scan starts on the first `next`.
    Idle(Scan, ScanDirection),
    /// Reading: chunk requests go to the scan's task.
    Running(mpsc::Sender<ChunkRequest>),
    /// Closed by `close()` or exhausted.
    Closed,
}

/// A lazy, chunked scan of a collection. Dropping or closing it stops the scan.
#[napi]
pub struct NativeCursor {
    state: Mutex<Cursor>,
}

#[napi]
impl NativeCursor {
    /// The next chunk of at most `max` items as JSON array text (`[key, item]` pairs for map
    /// entries), or null when the scan is over.
    ///
    /// # Errors
    /// A classified `state` error (the store's, or the attempt ended).
    #[napi]
    pub async fn next(&self, max: u32) -> napi::Result<Option<String>> {
        let sender = {
            let mut state = self.state.lock();
            match std::mem::replace(&mut *state, Cursor::Closed) {
                Cursor::Idle(scan, direction) => {
                    let sender = start(scan, direction);
                    *state = Cursor::Running(sender.clone());
                    sender
                }
                Cursor::Running(sender) => {
                    *state = Cursor::Running(sender.clone());
                    sender
                }
                Cursor::Closed => return Ok(None),
            }
        };
        let (reply, answer) = oneshot::channel();
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        if sender.send((max, reply)).await.is_err() {
            return Ok(None);
        }
        let chunk = answer
            .await
            .map_err(|_| state_error(&ContextError::AttemptEnded))?
            .map_err(|e| state_error(&e))?;
        if chunk.is_none() {
            *self.state.lock() = Cursor::Closed;
        }
        Ok(chunk)
    }

    /// Stops the scan (an early `break` of a `for await` loop).
    #[napi]
    pub fn close(&self) {
        *self.state.lock() = Cursor::Closed;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use futures::stream;
    use prosody::api::ClassifyError;
    use serde_json::json;

    use super::*;

    #[test]
    fn message_items_go_in_as_references_and_come_out_whole() {
        let message = Message::decode("[\"orders\", 3, 42]").unwrap();
        assert_eq!(message.topic.as_str(), "orders");
        assert_eq!(message.partition, Partition(3));
        assert_eq!(message.offset, Offset(42));
        assert!(Message::decode("null").is_err_and(|error| !error.is_permanent()));
        let mut out = String::new();
        Message {
            key: Key::from("k"),
            payload: json!({"a": 1}).into(),
            timestamp: Timestamp::from_millis(7),
            ..message
        }
        .encode(&mut out)
        .unwrap();
        assert_eq!(out, r#"["orders",3,42,7,"k",{"a":1}]"#);
    }

    #[test]
    fn json_items_must_be_json() {
        assert_eq!(Value::decode("{\"a\":[1]}").unwrap(), json!({"a": [1]}));
        assert!(Value::decode("{").is_err_and(|error| !error.is_permanent()));
    }

    #[test]
    fn without_keyed_state_every_name_is_unregistered() {
        let error = bind(None, 0, "count").err().unwrap();
        assert!(matches!(error, ContextError::Unregistered(name) if name == "count"));
    }

    #[tokio::test]
    async fn chunks_split_a_stream_and_end_once() {
        let items = (0..5).map(|n| Ok(Entry((format!("k{n}"), json!(n)))));
        let mut scan = stream::iter(items);
        let mut finished = false;
        let first = chunk(&mut scan, 2, true, &mut finished).await.unwrap();
        assert_eq!(first.as_deref(), Some(r#"[["k0",0],["k1",1]]"#));
        let second = chunk(&mut scan, 10, true, &mut finished).await.unwrap();
        assert_eq!(second.as_deref(), Some(r#"[["k2",2],["k3",3],["k4",4]]"#));
        assert!(finished);
        assert_eq!(
            chunk(&mut scan, 10, true, &mut finished).await.unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn a_failing_scan_reports_its_error_then_ends() {
        let items: Vec<Result<Value, ContextError>> =
            vec![Ok(json!(1)), Err(ContextError::AttemptEnded)];
        let mut scan = stream::iter(items);
        let mut finished = false;
        let error = chunk(&mut scan, 10, false, &mut finished)
            .await
            .unwrap_err();
        assert!(matches!(error, ContextError::AttemptEnded));
        assert_eq!(
            chunk(&mut scan, 10, false, &mut finished).await.unwrap(),
            None
        );
    }
}
