//! The event context as JavaScript sees it.
//!
//! A handler gets `&dyn EventContext` borrowed for the duration of one attempt, while the
//! JavaScript handler runs on the Node.js thread and calls `context.schedule(...)` whenever it
//! likes. Rather than smuggling the borrow out (which would need `unsafe` and outlive-the-attempt
//! checks), every live attempt gets an id and an inbox in a process-wide registry. JavaScript
//! puts a request in the inbox by id; the attempt's own future (see [`crate::handler`]) takes
//! it and serves it with the borrowed context, concurrently with awaiting the handler's
//! promise, whose settlement arrives through the same inbox. When the attempt ends its registry
//! slot is removed, so a context used afterwards fails with [`ContextError::AttemptEnded`] and
//! changes nothing, as the API contract requires.
//!
//! An attempt watches for its cancellation (timeout, revocation, shutdown) only once it has
//! lasted a while. Arming the watch (a timer for the deadline; the partition's cancellation
//! needs no registration from the key runner's task, see `prosody_pipeline::consumer::cancel`)
//! and dropping it cost about 1,300 instructions when it also registered on a tokio-util token,
//! of the ~20,000 the Rust side spent on a JavaScript event, and most JavaScript handlers settle
//! within a round trip of a millisecond or two. So one process-wide ticker, running while
//! attempts are live, counts their age every [`WATCH_AFTER`] and nudges those live for a whole
//! period through their inbox; the nudged attempt then arms the watch, which fires at once if
//! the deadline already passed. A handler therefore sees its `AbortSignal` at most two periods
//! after the cancellation. The ticker is a thread that parks while no attempt is live; if it cannot be
//! started, attempts watch from the start.
//!
//! Timers are served here. Keyed state does not need the inbox: the slot also keeps the
//! attempt's owned state binder ([`KeyedStateContext::owned_state`]), so `context.state()`
//! binds synchronously on the Node.js thread and the handle it returns calls the Rust runtime
//! directly (see [`crate::state`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::task::Poll;
use std::thread::Thread;
use std::time::Duration;

use futures::task::AtomicWaker;
use napi_derive::napi;
use parking_lot::Mutex;
use prosody::api::{ContextError, EventContext, KeyedStateContext, TimerTime};
use tokio::sync::oneshot;

use crate::errors::{ErrorKind, classified};
use crate::state::{NativeState, bind, state_error};

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
    shared: Arc<Shared>,
    state: Option<Arc<dyn KeyedStateContext>>,
}

/// What an attempt shares with JavaScript's side: one allocation per attempt. (A request
/// channel, a completion channel and a cancellation flag were four, two of them over glibc's
/// 1 KiB fast-path limit: tokio's channel allocates a block of 32 slots.)
#[derive(Debug, Default)]
struct Shared {
    cancelled: AtomicBool,
    /// Ticks of the watch ticker seen while live (saturating at [`NUDGE_AT`]).
    age: AtomicU8,
    inbox: Mutex<Inbox>,
    /// Set by every delivery, cleared when the attempt's future sees it.
    arrived: AtomicBool,
    /// The attempt's future while it waits for a delivery: a slot written with atomics rather
    /// than a `Notify`, whose waiter list is locked to register, to notify and to unregister
    /// (three locks per event on the worker; the Node.js benchmark's rate did not move
    /// measurably either way).
    waiter: AtomicWaker,
}

/// What JavaScript sent an attempt since its future last looked.
#[derive(Debug, Default)]
struct Inbox {
    requests: Vec<ContextRequest>,
    completion: Option<Completion>,
    /// The attempt has lasted long enough to watch for its cancellation.
    nudged: bool,
}

impl Shared {
    /// Clears the arrival flag and tells whether it was set. Only the attempt's future clears
    /// it, so a load and a store do, without a locked swap: a delivery that sets it again in
    /// between put its content in the inbox before, where the `take` after this finds it, and
    /// one that comes after that `take` sets the flag after this cleared it.
    fn take_arrived(&self) -> bool {
        let arrived = self.arrived.load(Ordering::Acquire);
        if arrived {
            self.arrived.store(false, Ordering::Release);
        }
        arrived
    }

    fn deliver(&self, put: impl FnOnce(&mut Inbox)) {
        put(&mut self.inbox.lock());
        // Flagged before the wake: a future that registered after the flag was last cleared
        // sees either the flag or the wake.
        self.arrived.store(true, Ordering::Release);
        self.waiter.wake();
    }
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
    shared: Arc<Shared>,
}

/// What an attempt's future finds in its inbox (see [`Attempt::take`]).
pub struct Arrived {
    /// Context requests to serve.
    pub requests: Vec<ContextRequest>,
    /// The handler's settlement, once JavaScript reported it.
    pub completion: Option<Completion>,
    /// True once (then false) when the attempt should start watching for its cancellation.
    pub watch_cancellation: bool,
}

impl Attempt {
    /// Registers a new attempt, with the owned binder of its keyed state (`None` without
    /// collections).
    #[must_use]
    pub fn open(state: Option<Arc<dyn KeyedStateContext>>) -> Self {
        let shared = Arc::new(Shared::default());
        let id = {
            let mut live = LIVE.lock();
            let mut id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            // Ids wrap after 2^32 attempts; skip 0 (JavaScript's "no attempt") and ids still
            // live.
            while id == 0 || live.contains_key(&id) {
                id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            }
            live.insert(
                id,
                Slot {
                    shared: shared.clone(),
                    state,
                },
            );
            id
        };
        // After the insertion: a ticker that found the registry empty and parked did so before
        // it (under the lock), so this sees it parked and unparks it.
        if !ensure_ticking() {
            shared.deliver(|inbox| inbox.nudged = true);
        }
        Self { id, shared }
    }

    /// The id JavaScript names this attempt by.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Records that the attempt was asked to stop (`context.shouldCancel`).
    pub fn mark_cancelled(&self) {
        self.shared.cancelled.store(true, Ordering::SeqCst);
    }

    /// Resolves once something was delivered to the inbox since an arrival last resolved
    /// (at once if that happened before it is awaited): await this, then
    /// [`take`](Self::take), and nothing delivered is missed. What was delivered before a
    /// `take` that took it may still resolve the next arrival, whose `take` then finds nothing.
    ///
    /// Only an arrival that finds nothing registers its waker: registering is two locked
    /// instructions, and the arrival that follows a wake finds the flag at once.
    pub fn arrival(&self) -> impl Future<Output = ()> + '_ {
        let shared = &*self.shared;
        std::future::poll_fn(move |context| {
            if shared.take_arrived() {
                return Poll::Ready(());
            }
            shared.waiter.register(context.waker());
            // Checked again after registering: a delivery flagged in between woke no one.
            if shared.take_arrived() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Takes what arrived: requests in the order JavaScript made them, and the completion
    /// (the first one reported).
    #[must_use]
    pub fn take(&self) -> Arrived {
        let mut inbox = self.shared.inbox.lock();
        Arrived {
            requests: std::mem::take(&mut inbox.requests),
            completion: inbox.completion.take(),
            watch_cancellation: std::mem::take(&mut inbox.nudged),
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        LIVE.lock().remove(&self.id);
    }
}

/// The period of the watch ticker: an attempt live for a whole period is nudged to watch for
/// its cancellation (see the module documentation).
pub const WATCH_AFTER: Duration = Duration::from_millis(20);

/// The age, in ticks, at which an attempt is nudged: the first tick may come right after it
/// opened, the second is a whole period later.
const NUDGE_AT: u8 = 2;

/// The watch ticker's thread, started with the first attempt; `None` when it could not be.
static TICKER: OnceLock<Option<Thread>> = OnceLock::new();

/// Set by the ticker, under the registry's lock, when it found no live attempt and parks.
static TICKER_PARKED: AtomicBool = AtomicBool::new(false);

/// Has the ticker run while attempts are live (call after registering one). False when there
/// is no ticker, and the attempt must watch for its cancellation from the start.
fn ensure_ticking() -> bool {
    let Some(ticker) = TICKER.get_or_init(start_ticker) else {
        return false;
    };
    if TICKER_PARKED.load(Ordering::Acquire) && TICKER_PARKED.swap(false, Ordering::AcqRel) {
        ticker.unpark();
    }
    true
}

/// A thread of its own rather than a task: the ticker serves every runtime's attempts and must
/// outlive any one of them.
fn start_ticker() -> Option<Thread> {
    std::thread::Builder::new()
        .name("prosody-watch".to_owned())
        .spawn(tick)
        .map(|handle| handle.thread().clone())
        .ok()
}

/// Ages the live attempts every [`WATCH_AFTER`] and nudges those that reach [`NUDGE_AT`];
/// parks while none is live (deciding that under the registry's lock, so an attempt
/// registered after the decision sees the ticker parked and unparks it).
fn tick() {
    loop {
        std::thread::sleep(WATCH_AFTER);
        let nudged: Vec<Arc<Shared>> = {
            let live = LIVE.lock();
            if live.is_empty() {
                TICKER_PARKED.store(true, Ordering::Release);
                drop(live);
                while TICKER_PARKED.load(Ordering::Acquire) {
                    std::thread::park();
                }
                continue;
            }
            live.values()
                .filter(|slot| {
                    let age = slot.shared.age.load(Ordering::Relaxed);
                    if age < NUDGE_AT {
                        slot.shared.age.store(age + 1, Ordering::Relaxed);
                    }
                    age + 1 == NUDGE_AT
                })
                .map(|slot| slot.shared.clone())
                .collect()
        };
        for shared in nudged {
            shared.deliver(|inbox| inbox.nudged = true);
        }
    }
}

/// Completes attempts: each `(id, completion)` is delivered to the attempt's waiting future.
/// Unknown ids (attempts that already ended, e.g. after a cancellation) are ignored.
pub fn complete(completions: impl IntoIterator<Item = (u32, Completion)>) {
    // Delivered after the lock is released: each wakes a task, which may wake a parked worker
    // (a system call), and the workers need this lock to start and end their attempts.
    let ready: Vec<_> = {
        let live = LIVE.lock();
        completions
            .into_iter()
            .filter_map(|(id, completion)| Some((live.get(&id)?.shared.clone(), completion)))
            .collect()
    };
    for (shared, completion) in ready {
        shared.deliver(|inbox| {
            inbox.completion.get_or_insert(completion);
        });
    }
}

fn shared_of(id: u32) -> Option<Arc<Shared>> {
    LIVE.lock().get(&id).map(|slot| slot.shared.clone())
}

async fn request(id: u32, op: ContextOp) -> napi::Result<Vec<TimerTime>> {
    let ended = || classified(ErrorKind::Context, &ContextError::AttemptEnded);
    let shared = shared_of(id).ok_or_else(ended)?;
    let (reply, answer) = oneshot::channel();
    // A request that arrives as the attempt ends is dropped with its inbox, and with it
    // `reply`: the answer below is then AttemptEnded.
    shared.deliver(|inbox| inbox.requests.push(ContextRequest { op, reply }));
    drop(shared);
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
        .is_none_or(|slot| slot.shared.cancelled.load(Ordering::SeqCst))
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
        let attempt = Attempt::open(None);
        let id = attempt.id();
        assert!(attempt.take().completion.is_none());
        complete([(id, None)]);
        complete([(id, Some(crate::handler::HandlerReply::default()))]);
        assert_eq!(
            attempt.take().completion,
            Some(None),
            "the first report wins"
        );
        assert_eq!(attempt.take().completion, None, "taken once");
        assert!(!context_should_cancel(id));
        attempt.mark_cancelled();
        assert!(context_should_cancel(id));
        drop(attempt);
        assert!(shared_of(id).is_none());
        assert!(context_should_cancel(id));
    }

    #[tokio::test]
    async fn arrivals_wake_the_attempt_whether_it_waits_already_or_not() {
        let attempt = Attempt::open(None);
        complete([(attempt.id(), None)]);
        // Reported before anyone waited: the kept permit resolves the wait at once.
        attempt.arrival().await;
        assert_eq!(attempt.take().completion, Some(None));
        let id = attempt.id();
        let (waiting_tx, waiting) = oneshot::channel();
        let attempt_task = tokio::spawn(async move {
            let _ = waiting_tx.send(());
            let mut arrived = attempt.take().requests.len();
            while arrived == 0 {
                attempt.arrival().await;
                arrived = attempt.take().requests.len();
            }
            arrived
        });
        waiting.await.expect("the attempt task waits");
        let asked = tokio::spawn(request(id, ContextOp::ClearScheduled));
        assert_eq!(
            attempt_task.await.ok(),
            Some(1),
            "the request woke the attempt"
        );
        assert!(
            asked.await.is_ok_and(|answer| answer.is_err()),
            "a request dropped unserved answers AttemptEnded"
        );
    }

    /// Completions from a thread outside the runtime, as the Node.js thread's are, arriving
    /// while thousands of attempts start waiting on two workers: each must reach its attempt
    /// (a delivery that neither flags nor wakes fails this within its timeout). The narrower
    /// race, a delivery between an arrival's check and its registration, is ruled out by the
    /// order `arrival` keeps (register, then check); this test rarely hits that window.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_completion_is_lost_when_it_races_with_the_wait() {
        const ATTEMPTS: usize = 2_000;
        let attempts: Vec<Attempt> = (0..ATTEMPTS).map(|_| Attempt::open(None)).collect();
        let ids: Vec<u32> = attempts.iter().map(Attempt::id).collect();
        let waiting: Vec<_> = attempts
            .into_iter()
            .map(|attempt| {
                tokio::spawn(async move {
                    loop {
                        if let Some(completion) = attempt.take().completion {
                            return completion;
                        }
                        attempt.arrival().await;
                    }
                })
            })
            .collect();
        let completer = std::thread::spawn(move || {
            // In small batches, as JavaScript reports them, spread over the time the attempts'
            // tasks take to start waiting so that many completions land while one is between
            // its `take` and its wait.
            for batch in ids.chunks(3) {
                complete(batch.iter().map(|&id| (id, None)));
                let spread = std::time::Instant::now();
                while spread.elapsed() < Duration::from_micros(5) {
                    std::hint::spin_loop();
                }
            }
        });
        for attempt in waiting {
            let completion = tokio::time::timeout(Duration::from_secs(10), attempt)
                .await
                .expect("every attempt sees its completion")
                .expect("the attempt's task ran");
            assert_eq!(completion, None);
        }
        completer.join().expect("the completer ran");
    }

    #[tokio::test]
    async fn a_live_attempt_is_nudged_to_watch_after_a_whole_period() {
        let opened = std::time::Instant::now();
        let attempt = Attempt::open(None);
        assert!(!attempt.take().watch_cancellation, "not at once");
        let nudge = async {
            loop {
                if attempt.take().watch_cancellation {
                    return;
                }
                attempt.arrival().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), nudge)
            .await
            .expect("nudged");
        assert!(opened.elapsed() >= WATCH_AFTER, "not before a whole period");
        assert!(!attempt.take().watch_cancellation, "nudged once");
        drop(attempt);
        // A later attempt is nudged too, also after the ticker may have parked.
        let later = Attempt::open(None);
        let arrival = later.arrival();
        tokio::time::timeout(Duration::from_secs(10), arrival)
            .await
            .expect("nudged");
        assert!(later.take().watch_cancellation);
    }

    #[test]
    fn ids_are_distinct() {
        let first = Attempt::open(None);
        let second = Attempt::open(None);
        assert_ne!(first.id(), second.id());
    }
}
