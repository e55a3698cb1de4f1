//! Failure handling and quality of service as a stack of small layers.
//!
//! Every layer is a [`Service`] that wraps an inner one and has one job; it knows nothing of
//! the layers around it. [`stack`] composes them per mode, in one place, and adapts the
//! result to the engine's [`Dispatch`](crate::consumer::Dispatch). Outermost first:
//!
//! | layer | job | modes |
//! |---|---|---|
//! | [`loop_guard`] | skip records our own group produced (`source-system`) | all |
//! | [`allowed_events`] | skip payloads whose `type` no prefix allows | all |
//! | [`failure_policy`] | route what finally failed, and undecodable records: failure topic or log | all |
//! | [`dedup`] | handle a payload `id` once per (key, id, version) | all |
//! | [`retry`] | retry transient failures with backoff | pipeline (forever), low-latency |
//! | [`defer`] | store a transient failure and retry it later by timer, so the partition moves on | pipeline |
//! | [`monopolization`] | reject a key over its share of handler time (then deferred) | pipeline |
//! | [`shutdown`] | no new attempt once cancelled; end an attempt that ignores cancellation | all |
//! | [`scheduled`] | hold a fair-scheduler permit while the attempt runs | all |
//! | [`timeout`] | give the attempt a deadline (`timeoutMs`) past which its context reports cancellation | all |
//! | [`telemetry`] | handler span and lifecycle events | all |
//! | [`HandlerService`](crate::dispatch::HandlerService) | call the application's handler | all |
//!
//! Filters come first because they are pure and cheap and must not touch storage; the failure
//! policy sits outside dedup so a record that failed is never recorded as seen; the scheduler
//! sits inside retry so each retry asks for a permit in the retry class and a key waiting out
//! its backoff holds none.

pub mod allowed_events;
pub mod dedup;
pub mod defer;
pub mod failure_policy;
mod failure_rate;
pub mod loop_guard;
pub mod monopolization;
pub mod retry;
pub mod scheduled;
pub mod shutdown;
pub mod stack;
pub mod telemetry;
pub mod timeout;

use std::fmt;
use std::sync::Arc;

use prosody_api::CoarseInstant;
use serde_json::Value;

use crate::consumer::{CancelWatch, PermitSlot};
use crate::deadline::{Deadline, cancelled_or_past, until_cancelled_or_past};
use crate::event::Event;

pub use stack::{DynService, ModePolicy, StackDispatch, StackSettings};

/// One attempt at one event, as it travels down the stack. It borrows what the dispatch owns
/// (the event, its cancellation, its permit), so it is `Copy`: a layer that changes a field
/// (retry's attempt number, timeout's deadline) passes a modified copy without touching a
/// reference count.
#[derive(Clone, Copy, Debug)]
pub struct Task<'a> {
    /// The event.
    pub event: &'a Event,
    /// Fires when the work must stop: revocation and shutdown. The dispatching runner's view
    /// of its assignment's signal, borrowed like everything the attempt needs from its
    /// dispatch; waits polled by the runner's task need no registration (see
    /// [`crate::consumer::cancel`]). There is one signal per assignment, so its identity tells
    /// a layer keeping per-assignment state (deferral ownership) which assignment an event
    /// belongs to.
    pub cancel: &'a CancelWatch,
    /// Past this the attempt counts as cancelled too (set by the timeout layer). A deadline
    /// rather than a timer per attempt: nothing is registered unless the handler actually
    /// waits for cancellation.
    pub deadline: Option<Deadline<'a>>,
    /// When the attempt was admitted, on the admission's tick-resolution clock, if it recorded
    /// that (the fair scheduler does): the monopolization layer charges the key's run time
    /// from it rather than read the clock again. (The handler's timeout starts at the timeout
    /// layer instead, so the layers above cannot eat into it.) `None` where the attempt starts
    /// later than its task was made (a retry).
    pub started: Option<CoarseInstant>,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// The admission permit of the event's dispatch.
    pub permit: &'a PermitSlot,
}

impl Task<'_> {
    /// True once the work is cancelled or the deadline has passed.
    #[must_use]
    pub fn should_cancel(&self) -> bool {
        cancelled_or_past(self.cancel, self.deadline)
    }

    /// Resolves when the work is cancelled or the deadline passes.
    pub async fn cancelled(&self) {
        until_cancelled_or_past(self.cancel, self.deadline).await;
    }
}

/// Why an attempt or an event did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// A retry may succeed.
    Transient,
    /// A retry fails the same way.
    Permanent,
    /// Revocation or shutdown stopped the work before it was done; the record must stay
    /// uncommitted so its next owner handles it.
    Cancelled,
}

/// A failed attempt: its kind, its reason as text (what logs and the failure topic carry),
/// and the attempt it happened on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The kind, which decides between retry, the failure policy and abandoning.
    pub kind: FailureKind,
    /// Human-readable reason.
    pub reason: String,
    /// The attempt number it happened on (0 for a record never given to the handler).
    pub attempt: u32,
}

impl Failure {
    /// A failure of `kind` on `attempt`.
    pub fn new(kind: FailureKind, reason: impl Into<String>, attempt: u32) -> Self {
        Self {
            kind,
            reason: reason.into(),
            attempt,
        }
    }

    /// The work was cancelled on `attempt`.
    #[must_use]
    pub fn cancelled(attempt: u32) -> Self {
        Self::new(
            FailureKind::Cancelled,
            "cancelled by revocation or shutdown",
            attempt,
        )
    }

    /// True for [`FailureKind::Cancelled`].
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.kind == FailureKind::Cancelled
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FailureKind::Transient => "transient",
            FailureKind::Permanent => "permanent",
            FailureKind::Cancelled => "cancelled",
        };
        write!(
            f,
            "{kind} failure on attempt {}: {}",
            self.attempt, self.reason
        )
    }
}

/// What a service answers: the handler's JSON answer, or why there is none. Records a layer
/// skips (filters, duplicates) answer `Ok(Value::Null)`.
pub type Verdict = Result<Value, Failure>;

/// One layer of the stack, or the handler at its bottom.
///
/// Layers are generic over the service they wrap and [`stack`] composes them statically, so a
/// whole stack is one type and one future per event: only its outside is boxed, once, as a
/// [`DynService`]. (Boxing every layer's future, as a `dyn` stack must, cost an allocation
/// and a virtual call per layer per event.)
pub trait Service: Send + Sync + 'static {
    /// Runs `task` through this layer and the ones below it.
    fn call(&self, task: &Task<'_>) -> impl Future<Output = Verdict> + Send;
}

impl<S: Service> Service for Arc<S> {
    fn call(&self, task: &Task<'_>) -> impl Future<Output = Verdict> + Send {
        (**self).call(task)
    }
}

/// Builds a layer around an inner service: what [`stack`] composes. Each layer module exposes
/// one type implementing it.
pub trait Layer: Send {
    /// The layer around an inner service of type `S`.
    type Wrapped<S: Service>: Service;

    /// Wraps `inner`.
    fn wrap<S: Service>(self, inner: S) -> Self::Wrapped<S>;
}
