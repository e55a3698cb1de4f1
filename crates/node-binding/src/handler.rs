//! The [`EventHandler`] that runs a JavaScript handler.
//!
//! Events reach JavaScript in batches. An attempt registers itself (see [`crate::context`]),
//! appends its event, already encoded as a JSON array, to the bridge's pending batch and, if no
//! delivery is scheduled yet, schedules one napi [`ThreadsafeFunction`] call for when its tokio
//! worker runs out of ready tasks (see [`Bridge::enqueue`]). That call runs on
//! the Node.js thread, takes the whole pending batch in one string and hands it to the
//! JavaScript `deliver(batch)` function, which parses it with one `JSON.parse` (payloads
//! included) and starts the application's `onMessage`/`onExcise`/`onTimer` for each event.
//! When a handler's promise settles, `index.js` reports it, again batched, through
//! `completeEvents`, which wakes the attempt's future. Per event this costs no napi call at all
//! on the hot path, only a share of one call per batch in each direction.
//!
//! The pipeline never starts a key's next event before the previous handler future finished, and
//! that future finishes only when the JavaScript promise settled, so one key's JavaScript handlers
//! never overlap while handlers of different keys are all pending on the event loop at once.
//!
//! While waiting, the attempt's future also serves the context requests the handler makes (see
//! [`crate::context`]) and, once the attempt has lasted long enough to be nudged (see
//! [`crate::context::WATCH_AFTER`]), watches for cancellation: when the pipeline cancels the
//! attempt (timeout, revocation, shutdown) it flags `context.shouldCancel` and asks JavaScript,
//! through a second (weak) threadsafe function, to abort the handler's `AbortSignal`.

use std::cell::RefCell;
use std::fmt;
use std::mem;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use napi::Status;
use napi::bindgen_prelude::Uint32Array;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use parking_lot::{Mutex, RwLock};
use prosody::api::{
    ClassifyError, ErrorClass, EventContext, EventHandler, ExciseMessage, Key, Message, Offset,
    Partition, Timer, Timestamp, Topic,
};
use serde_json::Value;

use crate::context::{Attempt, complete};
use crate::encode::{ArrayWriter, write_array};

/// What kind of event a batch entry carries (its first element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    /// `onMessage(context, message, signal)`.
    Message = 0,
    /// `onExcise(context, message, signal)`.
    Excise = 1,
    /// `onTimer(context, timer, signal)`.
    Timer = 2,
}

/// How a handler ended when it did not simply answer `null`/`undefined`.
#[napi(object)]
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HandlerReply {
    /// The handler's answer as JSON text.
    pub response: Option<String>,
    /// The message of what the handler threw.
    pub error: Option<String>,
    /// True when what the handler threw is classified permanent.
    pub permanent: Option<bool>,
}

/// The JavaScript `deliver(batch)` function; the batch text is taken on the Node.js thread.
pub type DeliverFn = ThreadsafeFunction<(), (), String, Status, false>;

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

/// Events waiting for the next delivery, and whether one is scheduled.
///
/// The events are kept as the text JavaScript receives: each is appended to one JSON array as
/// it is queued, so a delivery hands over a single buffer. Keeping one `String` per event
/// instead meant one allocation on a tokio worker and one free on the Node.js thread per event,
/// and glibc frees across threads under the owning arena's lock, which the workers contended
/// for (its lock waits were ~8% of the Node profile).
#[derive(Default)]
pub struct Batch {
    ids: Vec<u32>,
    text: String,
    scheduled: bool,
}

impl Batch {
    /// Appends the JSON array `event` of attempt `id`.
    fn push(&mut self, id: u32, event: &str) {
        self.text.push(if self.ids.is_empty() { '[' } else { ',' });
        self.text.push_str(event);
        self.ids.push(id);
    }

    /// Takes every waiting event as one JSON array text; the next event schedules a delivery.
    pub fn take(&mut self) -> String {
        self.scheduled = false;
        if self.ids.is_empty() {
            return "[]".to_owned();
        }
        self.ids.clear();
        self.text.push(']');
        // The next batch gets a buffer of this one's size, allocated here on the Node.js thread
        // that also frees it once JavaScript has the text: the workers only write into it.
        let next = String::with_capacity(self.text.len());
        mem::replace(&mut self.text, next)
    }

    /// Events waiting.
    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Forgets the waiting events and returns their attempt ids.
    fn drain_ids(&mut self) -> Vec<u32> {
        self.text.clear();
        mem::take(&mut self.ids)
    }
}

thread_local! {
    /// Where a worker encodes an event before appending it to the batch, so the batch lock is
    /// held only for a copy and no buffer is allocated per event.
    static ENCODED: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Encodes an event, the JSON array `elements` writes, with the thread's scratch buffer and
/// hands the text to `queue`. A message's payload goes in as the text it arrived as: it is
/// never parsed in Rust nor encoded again, only once by `JSON.parse` in JavaScript.
fn with_encoded<R>(
    elements: impl FnOnce(&mut ArrayWriter<'_>),
    queue: impl FnOnce(&str) -> R,
) -> R {
    ENCODED.with_borrow_mut(|buffer| {
        write_array(buffer, elements);
        queue(buffer)
    })
}

/// The JavaScript side of the current subscription. Released on unsubscribe and shutdown so the
/// Node.js process is no longer kept alive by it, even if the pipeline still holds the handler.
///
/// Each event reads only an atomic flag and the batch's lock on its way to JavaScript: the
/// delivery function is locked and shared only to schedule a delivery, and the abort function
/// (weak, so it keeps nothing alive) is not released at all, so attempts still running when the
/// bridge is released can abort their handlers' signals, and none takes a share of it.
pub struct Bridge {
    batch: Arc<Mutex<Batch>>,
    deliver: Mutex<Option<Arc<DeliverFn>>>,
    abort: AbortFn,
    released: AtomicBool,
}

impl Bridge {
    /// A bridge delivering `batch` through `deliver` and aborting through `abort`.
    #[must_use]
    pub fn new(batch: Arc<Mutex<Batch>>, deliver: DeliverFn, abort: AbortFn) -> Self {
        Self {
            batch,
            deliver: Mutex::new(Some(Arc::new(deliver))),
            abort,
            released: AtomicBool::new(false),
        }
    }

    /// Releases the JavaScript functions; events not yet delivered fail transiently.
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.deliver.lock().take();
        fail_pending(&self.batch);
    }

    /// Queues `event` (JSON array text) of attempt `id` for delivery; false when the bridge was
    /// released.
    fn enqueue(&self, id: u32, event: &str) -> bool {
        if self.released.load(Ordering::Acquire) {
            return false;
        }
        {
            let mut batch = self.batch.lock();
            batch.push(id, event);
            if batch.scheduled {
                return true;
            }
            batch.scheduled = true;
        }
        let Some(deliver) = self.deliver.lock().clone() else {
            // Released since the check: the queued events (this one too) fail as the release
            // failed the others.
            fail_pending(&self.batch);
            return true;
        };
        // Deliver once this worker has run out of ready tasks rather than at once: completions
        // arrive from JavaScript in batches and wake many attempts together, and each of them
        // queues its key's next event here. Calling JavaScript at the first one would hand it
        // a batch of one or two and start a ping-pong of tiny batches, each paying a wakeup of
        // the Node.js thread and of a worker (8 events per round trip measured, against ~70 with
        // one yield; a busy worker yields more, see `coalesce`). `yield_now` parks the flush until
        // the worker is idle (or its next maintenance tick, after at most 61 tasks), so it adds no
        // timer and no delay when there is nothing else to run.
        if tokio::runtime::Handle::try_current().is_ok() {
            let batch = self.batch.clone();
            tokio::spawn(async move {
                coalesce(&batch).await;
                deliver_now(&deliver, &batch);
            });
        } else {
            deliver_now(&deliver, &self.batch);
        }
        true
    }
}

/// Most scheduler yields a delivery waits for while its batch keeps growing.
const COALESCING_YIELDS: u32 = 3;

/// A yield that took longer than this found other tasks ready: the worker is busy.
const BUSY_YIELD: Duration = Duration::from_micros(50);

/// Waits until the worker has run out of other ready tasks once (see [`Bridge::enqueue`]), and
/// again, up to [`COALESCING_YIELDS`] times, while the worker is busy and the batch grew
/// meanwhile: a worker busy waking the attempts of one completion report after another keeps
/// filling the batch, and each delivery costs it a wakeup of the Node.js thread (~15 us here, the
/// eventfd write of the threadsafe function), so the batch waits for the burst to end. A worker
/// that is not busy delivers after one yield as before: there, waiting only adds latency, and
/// with few handlers in flight latency is what bounds the rate.
async fn coalesce(batch: &Mutex<Batch>) {
    let mut queued = batch.lock().len();
    for _ in 0..COALESCING_YIELDS {
        let started = Instant::now();
        tokio::task::yield_now().await;
        let now = batch.lock().len();
        if now <= queued || started.elapsed() < BUSY_YIELD {
            return;
        }
        queued = now;
    }
}

/// Fails every event queued in `batch` and not delivered yet, as a released bridge does.
fn fail_pending(batch: &Mutex<Batch>) {
    let pending = batch.lock().drain_ids();
    complete(pending.into_iter().map(|id| (id, Some(released()))));
}

fn deliver_now(deliver: &DeliverFn, batch: &Mutex<Batch>) {
    if deliver.call((), ThreadsafeFunctionCallMode::NonBlocking) != Status::Ok {
        fail_pending(batch);
    }
}

fn released() -> HandlerReply {
    HandlerReply {
        error: Some("the JavaScript handler was released (unsubscribed or shut down)".to_owned()),
        ..HandlerReply::default()
    }
}

/// The runtime the attempts' futures run on, where [`complete_events`] hands its work. Each
/// subscription sets it (napi-rs may build a new runtime for a new Node.js environment).
static ATTEMPTS_RUNTIME: RwLock<Option<tokio::runtime::Handle>> = RwLock::new(None);

/// Makes the current tokio runtime the one settled handlers are completed on.
pub fn complete_on_current_runtime() {
    *ATTEMPTS_RUNTIME.write() = tokio::runtime::Handle::try_current().ok();
}

/// Reports settled handlers: `ok` lists attempts that answered `null`/`undefined`; `others` is
/// the JSON text of `[[id, response | null, error | null, permanent], ...]` for the rest.
///
/// Completing an attempt wakes its future, and a wake from outside the runtime pushes the task
/// through the runtime's shared queue and often unparks the worker (a system call): done here,
/// per event, that was about a quarter of the Node.js thread's busy time. So the Node.js thread
/// only copies the ids and hands the batch to the runtime in one task, whose wakes of the
/// attempts then go to its worker's own queue (process CPU per record in the Node.js benchmark
/// 6.0-6.5 -> 5.7-5.9 us).
///
/// # Errors
/// When `others` is not the expected JSON.
#[napi]
pub fn complete_events(ok: Uint32Array, others: Option<String>) -> napi::Result<()> {
    let replies: Vec<(u32, Option<String>, Option<String>, bool)> = match others {
        Some(others) => serde_json::from_str(&others)
            .map_err(|error| napi::Error::new(Status::InvalidArg, error.to_string()))?,
        None => Vec::new(),
    };
    let ok = ok.to_vec();
    // One pass over the registry for the whole report.
    let settle = move || {
        let answered = replies.into_iter().map(|(id, response, error, permanent)| {
            (
                id,
                Some(HandlerReply {
                    response,
                    error,
                    permanent: Some(permanent),
                }),
            )
        });
        complete(ok.into_iter().map(|id| (id, None)).chain(answered));
    };
    match ATTEMPTS_RUNTIME.read().as_ref() {
        Some(runtime) => drop(runtime.spawn(async move { settle() })),
        None => settle(),
    }
    Ok(())
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

    /// Runs the event `event` writes (given the attempt id) in JavaScript and waits for its
    /// promise.
    async fn run(
        &self,
        context: &dyn EventContext,
        event: impl FnOnce(&mut ArrayWriter<'_>, u32),
    ) -> Result<Value, JsHandlerError> {
        let attempt = Attempt::open(context.owned_state());
        let id = attempt.id();
        let abort = &self.bridge.abort;
        let queued = with_encoded(
            |array| event(array, id),
            |text| self.bridge.enqueue(id, text),
        );
        if !queued {
            return Err(JsHandlerError::new(
                "the JavaScript handler was released (unsubscribed or shut down)",
                ErrorClass::Transient,
            ));
        }
        // Armed once the attempt is nudged (see `crate::context`): most settle before that.
        let mut cancelled = None;
        let mut cancel_seen = false;
        // Created on the first context request: most handlers make none, and an empty
        // `FuturesUnordered` still costs two allocations per event.
        let mut serving = None;
        let settled = loop {
            // The inbox is read only after an arrival: nothing is in it before JavaScript has
            // the event, and each delivery flags the arrival after filling it.
            tokio::select! {
                biased;
                () = attempt.arrival() => {
                    let arrived = attempt.take();
                    if arrived.watch_cancellation && cancelled.is_none() {
                        cancelled = Some(context.cancelled());
                    }
                    for request in arrived.requests {
                        serving
                            .get_or_insert_with(FuturesUnordered::new)
                            .push(request.serve(context));
                    }
                    if let Some(settled) = arrived.completion {
                        break settled;
                    }
                }
                Some(()) = async {
                    match serving.as_mut() {
                        Some(serving) => serving.next().await,
                        None => None,
                    }
                }, if serving.as_ref().is_some_and(|serving: &FuturesUnordered<_>| !serving.is_empty()) => {}
                () = async {
                    match cancelled.as_mut() {
                        Some(cancelled) => cancelled.await,
                        None => std::future::pending().await,
                    }
                }, if cancelled.is_some() && !cancel_seen => {
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
            None => Ok(Value::Null),
            Some(reply) => reply_to_result(reply),
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

/// Where a record came from: key, topic, partition, offset and timestamp.
type RecordPlace<'a> = (&'a Key, &'a Topic, Partition, Offset, Timestamp);

/// The [`RecordPlace`] of a message or an excise (two types with the same fields).
macro_rules! place {
    ($record:expr) => {
        (
            &$record.key,
            &$record.topic,
            $record.partition,
            $record.offset,
            $record.timestamp,
        )
    };
}

/// Writes the elements a message and an excise share: kind, attempt id, then the record's
/// key, topic, partition, offset and timestamp (milliseconds).
fn write_record(array: &mut ArrayWriter<'_>, kind: EventKind, id: u32, place: RecordPlace<'_>) {
    let (key, topic, partition, offset, timestamp) = place;
    array.integer(kind as u8);
    array.integer(id);
    array.string(key.as_str());
    array.string(topic.as_str());
    array.integer(partition.0);
    array.integer(offset.0);
    array.integer(timestamp.as_millis());
}

#[async_trait]
impl EventHandler for JsHandler {
    type Error = JsHandlerError;

    async fn on_message(
        &self,
        context: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, JsHandlerError> {
        self.run(context, |array, id| {
            write_record(array, EventKind::Message, id, place!(message));
            array.json(message.payload.json());
        })
        .await
    }

    async fn on_excise(
        &self,
        context: &dyn EventContext,
        message: &ExciseMessage,
    ) -> Result<Value, JsHandlerError> {
        self.run(context, |array, id| {
            write_record(array, EventKind::Excise, id, place!(message));
        })
        .await
    }

    async fn on_timer(
        &self,
        context: &dyn EventContext,
        timer: &Timer,
    ) -> Result<(), JsHandlerError> {
        let millis = timer.time.as_secs().saturating_mul(1000);
        self.run(context, |array, id| {
            array.integer(EventKind::Timer as u8);
            array.integer(id);
            array.string(timer.key.as_str());
            array.integer(millis);
        })
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_json_arrays() {
        let mut batch = Batch::default();
        assert_eq!(batch.take(), "[]");
        batch.push(1, "[0,1]");
        batch.push(2, "[0,2]");
        batch.scheduled = true;
        assert_eq!(batch.take(), "[[0,1],[0,2]]");
        assert!(!batch.scheduled);
        batch.push(3, "[0,3]");
        assert_eq!(batch.take(), "[[0,3]]");
        batch.push(4, "[0,4]");
        assert_eq!(batch.drain_ids(), vec![4]);
        assert_eq!(batch.take(), "[]");
    }

    /// A batch holding one event, behind `Arc` so a second task can fill it.
    fn batch_of_one() -> Arc<Mutex<Batch>> {
        let batch = Arc::new(Mutex::new(Batch::default()));
        batch.lock().push(0, "[0,0]");
        batch
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_idle_worker_delivers_after_one_yield() {
        let batch = batch_of_one();
        coalesce(&batch).await;
        assert_eq!(batch.lock().len(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_busy_worker_filling_the_batch_delivers_when_the_burst_ends() {
        let batch = batch_of_one();
        // Another task that queues an event and then keeps the worker busy past `BUSY_YIELD`
        // each time it runs, for a burst of five events.
        let filler = tokio::spawn({
            let batch = batch.clone();
            async move {
                for id in 1..=5 {
                    batch.lock().push(id, "[0,0]");
                    let busy = Instant::now();
                    while busy.elapsed() < BUSY_YIELD * 2 {
                        std::hint::spin_loop();
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
        coalesce(&batch).await;
        let coalesced = batch.lock().len();
        // One yield would deliver two events; the worker stayed busy and the batch kept growing,
        // so the delivery waited for more, up to its limit.
        assert!(coalesced > 2, "{coalesced} events: waited past one yield");
        assert_eq!(coalesced, 1 + COALESCING_YIELDS as usize);
        filler.await.expect("the filler ran");
    }

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
