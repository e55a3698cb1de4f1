//! The event context as JavaScript sees it.
//!
//! A handler gets `&dyn EventContext` borrowed for the duration of one attempt, while the
//! JavaScript handler runs on the Node.js thread and calls `context.schedule(...)` whenever it
//! likes. Rather than smuggling the borrow out (which would need `unsafe` and outlive-the-attempt
//! checks), every live attempt gets an id and a bounded request channel in a process-wide
//! registry. JavaScript sends a request by id; the attempt's own future (see
//! [`crate::handler`]) receives it and serves it with the borrowed context, concurrently with
//! awaiting the handler's promise. When the attempt ends its registry slot is removed, so a
//! context used afterwards fails with [`ContextError::AttemptEnded`] and changes nothing, as the
//! API contract requires.
//!
//! Timers are served here. Keyed state does not need the channel: the slot also keeps the
//! attempt's owned state binder ([`KeyedStateContext::owned_state`]), so `context.state()`
//! binds synchronously on the Node.js thread and the handle it returns calls the Rust runtime
//! directly (see [`crate::state`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};

use napi_derive::napi;
use parking_lot::Mutex;
use prosody::api::{ContextError, EventContext, KeyedStateContext, TimerTime};
use tokio::sync::{mpsc, oneshot};

use crate::errors::{ErrorKind, classified};
use crate::state::{NativeState, bind, state_error};

/// Requests one attempt may have waiting before JavaScript's next request waits for room.
const REQUEST_QUEUE: usize = 64;

/// One operation on the current key's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextOp {
    /// `context.schedule(time)`.
    Schedule(TimerTime),
    /// `context.clearAndSchedule(time)`.
    ClearAndSchedule(TimerTime),
    /// `context.unschedule(time)`.
    Unschedule(TimerTime),
    /// `context.clearScheduled()`.
    ClearScheduled,
    /// `context.scheduled()`.
    Scheduled,
}

/// A request from JavaScript and where its answer goes.
#[derive(Debug)]
pub struct ContextRequest {
    op: ContextOp,
    reply: oneshot::Sender<Result<Vec<TimerTime>, ContextError>>,
}

impl ContextRequest {
    /// Serves the request with the attempt's context and sends the answer back.
    pub async fn serve(self, context: &dyn EventContext) {
        let result = match self.op {
            ContextOp::Schedule(time) => context.schedule(time).await.map(|()| Vec::new()),
            ContextOp::ClearAndSchedule(time) => {
                context.clear_and_schedule(time).await.map(|()| Vec::new())
            }
            ContextOp::Unschedule(time) => context.unschedule(time).await.map(|()| Vec::new()),
            ContextOp::ClearScheduled => context.clear_scheduled().await.map(|()| Vec::new()),
            ContextOp::Scheduled => context.scheduled().await,
        };
        // The JavaScript side may have stopped waiting; nothing to do then.
        let _ = self.reply.send(result);
    }
}

struct Slot {
    requests: mpsc::Sender<ContextRequest>,
    cancelled: Arc<AtomicBool>,
    done: Option<oneshot::Sender<Completion>>,
    state: Option<Arc<dyn KeyedStateContext>>,
}

/// How JavaScript reported the end of an attempt's handler: `None` when it answered
/// `null`/`undefined`, else the reply (an answer or a classified failure).
pub type Completion = Option<crate::handler::HandlerReply>;

static NEXT_ID: AtomicU32 = AtomicU32::new(1);
/// Live attempts by id. Ids are handed out by this process, never by JavaScript, so a fast
/// unkeyed hasher is safe here; it is locked by every attempt's start and end on the workers
/// and by each completion batch on the Node.js thread.
type Registry = HashMap<u32, Slot, foldhash::fast::FixedState>;

static LIVE: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::default()));

/// A live attempt's registration; dropping it ends the attempt for JavaScript.
#[derive(Debug)]
pub struct Attempt {
    id: u32,
    cancelled: Arc<AtomicBool>,
}

impl Attempt {
    /// Registers a new attempt, with the owned binder of its keyed state (`None` without
    /// collections), and returns it with the receiving end of its request channel and the
    /// receiver of its completion (see [`complete`]).
    #[must_use]
    pub fn open(
        state: Option<Arc<dyn KeyedStateContext>>,
    ) -> (
        Self,
        mpsc::Receiver<ContextRequest>,
        oneshot::Receiver<Completion>,
    ) {
        let (requests, receiver) = mpsc::channel(REQUEST_QUEUE);
        let (done, completion) = oneshot::channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let mut live = LIVE.lock();
        let mut id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // Ids wrap after 2^32 attempts; skip 0 (JavaScript's "no attempt") and ids still live.
        while id == 0 || live.contains_key(&id) {
            id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        }
        live.insert(
            id,
            Slot {
                requests,
                cancelled: cancelled.clone(),
                done: Some(done),
                state,
            },
        );
        (Self { id, cancelled }, receiver, completion)
    }

    /// The id JavaScript names this attempt by.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Records that the attempt was asked to stop (`context.shouldCancel`).
    pub fn mark_cancelled(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        LIVE.lock().remove(&self.id);
    }
}

/// Completes attempts: each `(id, completion)` is delivered to the attempt's waiting future.
/// Unknown ids (attempts that already ended, e.g. after a cancellation) are ignored.
pub fn complete(completions: impl IntoIterator<Item = (u32, Completion)>) {
    // Sent after the lock is released: each send wakes a task, which may wake a parked worker
    // (a system call), and the workers need this lock to start and end their attempts.
    let ready: Vec<_> = {
        let mut live = LIVE.lock();
        completions
            .into_iter()
            .filter_map(|(id, completion)| {
                let done = live.get_mut(&id)?.done.take()?;
                Some((done, completion))
            })
            .collect()
    };
    for (done, completion) in ready {
        let _ = done.send(completion);
    }
}

fn sender_of(id: u32) -> Option<mpsc::Sender<ContextRequest>> {
    LIVE.lock().get(&id).map(|slot| slot.requests.clone())
}

async fn request(id: u32, op: ContextOp) -> napi::Result<Vec<TimerTime>> {
    let ended = || classified(ErrorKind::Context, &ContextError::AttemptEnded);
    let sender = sender_of(id).ok_or_else(ended)?;
    let (reply, answer) = oneshot::channel();
    sender
        .send(ContextRequest { op, reply })
        .await
        .map_err(|_| ended())?;
    answer
        .await
        .map_err(|_| ended())?
        .map_err(|error| classified(ErrorKind::Context, &error))
}

/// `context.shouldCancel` of attempt `id`: true once it was asked to stop, and after it ended.
#[napi]
#[must_use]
pub fn context_should_cancel(id: u32) -> bool {
    LIVE.lock()
        .get(&id)
        .is_none_or(|slot| slot.cancelled.load(Ordering::SeqCst))
}

/// The timer operations of `context`, by code: 0 `schedule`, 1 `clearAndSchedule`,
/// 2 `unschedule`, 3 `clearScheduled`, 4 `scheduled`. `time` is whole seconds since the epoch
/// (negative clamps to 0). Resolves to the scheduled times in seconds for `scheduled`, else to
/// an empty array.
///
/// # Errors
/// A classified `context` error: the store's, or `AttemptEnded` when the attempt is over.
#[napi]
pub async fn context_timers(id: u32, op: u32, time: Option<i64>) -> napi::Result<Vec<i64>> {
    let time = TimerTime::from_secs(time.map_or(0, |secs| secs.max(0).unsigned_abs()));
    let op = match op {
        0 => ContextOp::Schedule(time),
        1 => ContextOp::ClearAndSchedule(time),
        2 => ContextOp::Unschedule(time),
        3 => ContextOp::ClearScheduled,
        4 => ContextOp::Scheduled,
        other => {
            return Err(napi::Error::new(
                napi::Status::InvalidArg,
                format!("unknown timer operation {other}"),
            ));
        }
    };
    let times = request(id, op).await?;
    Ok(times
        .into_iter()
        .map(|time| i64::try_from(time.as_secs()).unwrap_or(i64::MAX))
        .collect())
}

/// `context.state(definition)` of attempt `id`: binds collection `name` as `kind` (0 value,
/// 1 map, 2 deque, 3 message value, 4 message map, 5 message deque).
///
/// # Errors
/// A classified `state` error: unregistered or mismatched (permanent), or the attempt ended.
#[napi]
pub fn context_state(id: u32, kind: u32, name: String) -> napi::Result<NativeState> {
    let binder = match LIVE.lock().get(&id) {
        Some(slot) => slot.state.clone(),
        None => return Err(state_error(&ContextError::AttemptEnded)),
    };
    bind(binder.as_deref(), kind, &name).map_err(|error| state_error(&error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_attempts_report_cancel_and_are_gone() {
        let (attempt, _requests, completion) = Attempt::open(None);
        let id = attempt.id();
        complete([(id, None)]);
        assert_eq!(completion.blocking_recv().ok(), Some(None));
        assert!(!context_should_cancel(id));
        attempt.mark_cancelled();
        assert!(context_should_cancel(id));
        drop(attempt);
        assert!(sender_of(id).is_none());
        assert!(context_should_cancel(id));
    }

    #[test]
    fn ids_are_distinct() {
        let (first, _a, _c) = Attempt::open(None);
        let (second, _b, _d) = Attempt::open(None);
        assert_ne!(first.id(), second.id());
    }
}
