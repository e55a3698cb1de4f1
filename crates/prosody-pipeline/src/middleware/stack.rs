//! The one place where layers are composed, per mode, and the adapter the engine dispatches
//! to.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::{BoxFuture, Either};
use tracing::error;

use super::allowed_events::AllowedEventsLayer;
use super::dedup::DedupLayer;
use super::defer::DeferLayer;
use super::failure_policy::{Destination, FailurePolicyLayer};
use super::loop_guard::LoopGuardLayer;
use super::monopolization::MonopolizationLayer;
use super::retry::{RetryLayer, RetryPolicy};
use super::scheduled::ScheduledLayer;
use super::shutdown::ShutdownLayer;
use super::telemetry::TelemetryLayer;
use super::timeout::TimeoutLayer;
use super::{Layer, Service, Task, Verdict};
use crate::boxing::box_in_place;
use crate::consumer::{Admission, CancelSignal, CancelWatch, Dispatch, Outcome, PermitSlot};
use crate::event::Event;
use crate::monotonic::SystemClock;
use crate::timers::Timers;

/// The failure-handling mode (FEATURES.md section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModePolicy {
    /// Never drops on a transient failure: retries until success (defer and monopolization
    /// slot in here). Permanent failures go to the failure topic when set, else are logged.
    Pipeline,
    /// Retries `max_retries` times after the first attempt, then gives up to the failure
    /// topic (required by the configuration in this mode).
    LowLatency {
        /// Retries after the first attempt.
        max_retries: u32,
    },
    /// No retries: failures are logged and committed.
    BestEffort,
}

/// Everything the stack is built from.
pub struct StackSettings {
    /// The mode.
    pub mode: ModePolicy,
    /// The consumer group (loop prevention, dedup scope, telemetry).
    pub group_id: String,
    /// `allowedEvents` prefixes; empty allows everything.
    pub allowed_events: Vec<String>,
    /// Where given-up records go in pipeline and low-latency modes (best-effort always logs).
    pub failures: Destination,
    /// The timers runtime, so a given-up timer event's timer is removed.
    pub timers: Option<Timers>,
    /// Backoff of in-process retries.
    pub retry: RetryPolicy,
    /// Deduplication.
    pub dedup: DedupLayer,
    /// Pipeline mode only: the defer layer (issue 6), between retry and monopolization.
    pub defer: Option<DeferLayer>,
    /// Pipeline mode only: the monopolization layer (issue 6), between defer and shutdown.
    pub monopolization: Option<MonopolizationLayer>,
    /// The admission the engine acquires from; retries acquire from it too.
    pub admission: Arc<dyn Admission>,
    /// Handler timeout.
    pub timeout: Duration,
    /// The shutdown budget (`shutdownTimeoutMs`).
    pub shutdown_timeout: Duration,
    /// Spans and lifecycle events.
    pub telemetry: TelemetryLayer,
}

/// A layer that the mode or the configuration may leave out: the wrapped service when it is
/// in, the inner one as it is when it is out.
pub enum Optional<W, S> {
    /// The layer is in.
    On(W),
    /// The layer is left out.
    Off(S),
}

/// The chosen service's own future, in an `Either`: polling it is a match on which one, where
/// an `async` wrapper added a state machine of its own to every attempt at every optional layer
/// (entered, polled through, dropped and marked finished each time).
///
/// It pays here because each optional layer's parent is an `async fn` that awaits it at once,
/// so the `Either` is built in the parent's state. A future returned by value through several
/// layers is copied at each: the same change to the filters, dedup, defer and telemetry cost 358
/// instructions per event more than it saved (callgrind, middleware bench: `memcpy` 156 -> 434).
impl<W: Service, S: Service> Service for Optional<W, S> {
    fn call(&self, task: &Task<'_>) -> impl Future<Output = Verdict> + Send {
        match self {
            Self::On(wrapped) => Either::Left(wrapped.call(task)),
            Self::Off(inner) => Either::Right(inner.call(task)),
        }
    }
}

/// A service whose future is boxed on its own, splitting the stack's per-event future in two
/// allocations. glibc serves allocations up to about 1 KiB from a per-thread cache; a larger one
/// takes the slow path, and with the small blocks every event frees it also consolidates the
/// free lists first. The client's pipeline stack's future is ~1.7 KiB: 912 bytes for the
/// event's layers and 832 for the attempt's (measured with `size_of_val` on the throughput
/// bench), so two cached allocations cost far less than one large one. Mind the margin when a
/// layer holds more across its await: at 1,056 bytes the event's half missed the cache on
/// every event. Both halves are built in their allocations ([`box_in_place`]), not copied in.
pub struct Boxed<S>(pub S);

impl<S: Service> Service for Boxed<S> {
    fn call(&self, task: &Task<'_>) -> impl Future<Output = Verdict> + Send {
        box_in_place(|| self.0.call(task))
    }
}

/// Wraps `inner` in `layer` when there is one.
fn optional<L: Layer, S: Service>(layer: Option<L>, inner: S) -> Optional<L::Wrapped<S>, S> {
    match layer {
        Some(layer) => Optional::On(layer.wrap(inner)),
        None => Optional::Off(inner),
    }
}

/// Wraps `handler` in the layers of `settings.mode`, outermost first: loop guard, allowed
/// events, failure policy, dedup, retry, defer, monopolization, shutdown, scheduler, timeout,
/// telemetry. One type for every mode (the layers a mode leaves out are [`Optional`]), boxed
/// once.
#[must_use]
pub fn compose(settings: StackSettings, handler: impl Service) -> Arc<dyn DynService> {
    let StackSettings {
        mode,
        group_id,
        allowed_events,
        failures,
        timers,
        retry,
        dedup,
        defer,
        monopolization,
        admission,
        timeout,
        shutdown_timeout,
        telemetry,
    } = settings;
    let failures = match mode {
        ModePolicy::BestEffort => Destination::Log,
        ModePolicy::Pipeline | ModePolicy::LowLatency { .. } => failures,
    };
    let (retry, defer, monopolization) = match mode {
        ModePolicy::Pipeline => (
            Some(RetryLayer {
                policy: retry,
                max_retries: None,
            }),
            defer,
            monopolization,
        ),
        ModePolicy::LowLatency { max_retries } => (
            Some(RetryLayer {
                policy: retry,
                max_retries: Some(max_retries),
            }),
            None,
            None,
        ),
        ModePolicy::BestEffort => (None, None, None),
    };
    // The attempt is its own allocation (see [`Boxed`]): the layers above it are about the
    // event, these about one attempt at it.
    let attempt = Boxed(
        ShutdownLayer::for_budget(shutdown_timeout).wrap(
            ScheduledLayer { admission }.wrap(
                TimeoutLayer {
                    timeout,
                    clock: Arc::new(SystemClock),
                }
                .wrap(telemetry.wrap(handler)),
            ),
        ),
    );
    let retried = optional(retry, optional(defer, optional(monopolization, attempt)));
    let filtered = LoopGuardLayer { group_id }.wrap(
        AllowedEventsLayer {
            prefixes: allowed_events,
        }
        .wrap(
            FailurePolicyLayer {
                destination: failures,
                timers,
            }
            .wrap(dedup.wrap(retried)),
        ),
    );
    Arc::new(filtered)
}

/// A [`Service`] as a trait object: what a composed stack is to the engine
/// ([`StackDispatch`]). Call it through the object
/// (`(*service).dispatch_boxed(event, cancel, permit)`): an `Arc` of a service is a service of
/// its own, whose `dispatch_boxed` would box a second time.
pub trait DynService: Send + Sync + 'static {
    /// Runs `event` through the service as its first attempt and answers the engine's
    /// [`Outcome`] of the verdict, in one boxed future: the engine's dispatch future itself, so
    /// an event costs one allocation for the stack's future rather than one for it and one
    /// around it. The event, its assignment's cancellation and the permit's slot are borrowed
    /// from the caller (the engine's runner keeps them while the dispatch runs): in the future
    /// the event would take it past the ~1 KiB glibc serves from its per-thread cache (see
    /// [`Boxed`]), boxed on its own it was an allocation per event, and a share of the
    /// cancellation per event moved its reference count between the cores.
    fn dispatch_boxed<'a>(
        &'a self,
        event: &'a Event,
        cancel: &'a CancelWatch,
        permit: &'a PermitSlot,
    ) -> BoxFuture<'a, Outcome>;
}

impl<S: Service> DynService for S {
    fn dispatch_boxed<'a>(
        &'a self,
        event: &'a Event,
        cancel: &'a CancelWatch,
        permit: &'a PermitSlot,
    ) -> BoxFuture<'a, Outcome> {
        box_in_place(move || async move {
            let task = Task {
                event,
                cancel,
                deadline: None,
                started: permit.granted_at(),
                attempt: 1,
                permit,
            };
            let verdict = self.call(&task).await;
            outcome(&task, verdict)
        })
    }
}

/// A verdict as the engine's [`Outcome`]: cancelled work stays uncommitted, everything else is
/// done.
fn outcome(task: &Task<'_>, verdict: Verdict) -> Outcome {
    match verdict {
        Ok(_) => Outcome::Completed,
        Err(failure) if failure.is_cancelled() => Outcome::Abandoned,
        Err(failure) => {
            // The failure policy answers every other failure; reaching here is a bug, and
            // stalling the partition on it would be worse than committing.
            error!(key = %task.event.key(), offset = ?task.event.offset(), %failure,
                "failure escaped the failure policy: committed");
            Outcome::Completed
        }
    }
}

/// The engine's view of a stack: a verdict becomes an [`Outcome`].
pub struct StackDispatch {
    service: Arc<dyn DynService>,
}

impl StackDispatch {
    /// The dispatch of `handler` wrapped in the layers of `settings.mode`.
    #[must_use]
    pub fn new(settings: StackSettings, handler: impl Service) -> Self {
        Self::from_service(compose(settings, handler))
    }

    /// The dispatch of a stack composed elsewhere (tests of one concern, custom stacks). The
    /// stack must answer every failure but cancellation itself, as the failure policy does.
    #[must_use]
    pub fn from_service(service: Arc<dyn DynService>) -> Self {
        Self { service }
    }
}

#[async_trait]
impl Dispatch for StackDispatch {
    async fn dispatch(&self, event: Event, cancel: Arc<CancelSignal>) -> Outcome {
        let cancel = CancelWatch::detached(cancel);
        self.dispatch_admitted(&event, &cancel, &PermitSlot::default())
            .await
    }

    /// Not an `async fn`: the stack's boxed future is returned as the dispatch's own, rather
    /// than boxed again inside another.
    fn dispatch_admitted<'life0, 'life1, 'life2, 'life3, 'async_trait>(
        &'life0 self,
        event: &'life1 Event,
        cancel: &'life2 CancelWatch,
        permit: &'life3 PermitSlot,
    ) -> BoxFuture<'async_trait, Outcome>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        'life3: 'async_trait,
        Self: 'async_trait,
    {
        // Through the trait object: the `Arc` is a service of its own.
        (*self.service).dispatch_boxed(event, cancel, permit)
    }
}

/// Scripted services and events for the layers' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use parking_lot::Mutex;
    use prosody_api::{ExciseMessage, Headers, Key, Message, Offset, Partition, Timestamp, Topic};
    use serde_json::Value;
    use tokio::sync::watch;

    use crate::consumer::{CancelSignal, CancelWatch};
    use crate::event::{Event, RejectedRecord};
    use crate::middleware::{Failure, FailureKind, Service, Task, Verdict};

    #[derive(Clone, Copy)]
    enum Script {
        Succeed,
        FailFirst(u32, FailureKind),
        Hang,
        UntilCancelled(FailureKind),
    }

    /// A bottom service that records its calls and answers by script.
    pub(crate) struct Calls {
        script: Script,
        attempts: Mutex<Vec<u32>>,
        cancelled_seen: AtomicUsize,
        count: watch::Sender<usize>,
    }

    impl Calls {
        fn with(script: Script) -> Arc<Self> {
            Arc::new(Self {
                script,
                attempts: Mutex::new(Vec::new()),
                cancelled_seen: AtomicUsize::new(0),
                count: watch::channel(0).0,
            })
        }

        pub(crate) fn succeeding() -> Arc<Self> {
            Self::with(Script::Succeed)
        }

        pub(crate) fn failing(kind: FailureKind) -> Arc<Self> {
            Self::with(Script::FailFirst(u32::MAX, kind))
        }

        pub(crate) fn failing_first(times: u32, kind: FailureKind) -> Arc<Self> {
            Self::with(Script::FailFirst(times, kind))
        }

        /// Never answers, ignoring cancellation.
        pub(crate) fn hanging() -> Arc<Self> {
            Self::with(Script::Hang)
        }

        /// Waits for cancellation, then fails with `kind`.
        pub(crate) fn until_cancelled(kind: FailureKind) -> Arc<Self> {
            Self::with(Script::UntilCancelled(kind))
        }

        pub(crate) fn count(&self) -> usize {
            *self.count.borrow()
        }

        pub(crate) fn attempts(&self) -> Vec<u32> {
            self.attempts.lock().clone()
        }

        pub(crate) fn cancelled_seen(&self) -> usize {
            self.cancelled_seen.load(Ordering::SeqCst)
        }

        pub(crate) async fn wait_for(&self, calls: usize) {
            let mut count = self.count.subscribe();
            let _ = count.wait_for(|count| *count >= calls).await;
        }
    }

    impl Service for Calls {
        async fn call(&self, task: &Task<'_>) -> Verdict {
            let call = {
                let mut attempts = self.attempts.lock();
                attempts.push(task.attempt);
                u32::try_from(attempts.len()).unwrap_or(u32::MAX)
            };
            self.count.send_modify(|count| *count += 1);
            match self.script {
                Script::FailFirst(times, kind) if call <= times => Err(Failure::new(
                    kind,
                    format!("scripted failure {call}"),
                    task.attempt,
                )),
                Script::Succeed | Script::FailFirst(..) => Ok(Value::Null),
                Script::Hang => std::future::pending().await,
                Script::UntilCancelled(kind) => {
                    task.cancelled().await;
                    self.cancelled_seen.fetch_add(1, Ordering::SeqCst);
                    Err(Failure::new(kind, "cancelled", task.attempt))
                }
            }
        }
    }

    pub(crate) fn message_with(key: &str, payload: Value, headers: Headers) -> Event {
        Event::Message(Message {
            topic: Topic::from("t"),
            partition: Partition(0),
            offset: Offset(7),
            timestamp: Timestamp::from_millis(0),
            key: Key::from(key),
            payload: payload.into(),
            headers,
        })
    }

    pub(crate) fn message(key: &str, payload: Value) -> Event {
        message_with(key, payload, Headers::new())
    }

    pub(crate) fn excise(key: &str) -> Event {
        Event::Excise(ExciseMessage {
            topic: Topic::from("t"),
            partition: Partition(0),
            offset: Offset(8),
            timestamp: Timestamp::from_millis(0),
            key: Key::from(key),
            headers: Headers::new(),
        })
    }

    pub(crate) fn rejected(key: &str) -> Event {
        Event::Rejected(Box::new(RejectedRecord {
            topic: Topic::from("t"),
            partition: Partition(0),
            offset: Offset(9),
            key: Key::from(key),
            raw_key: Some(key.as_bytes().to_vec()),
            raw_value: Some(b"{not json".to_vec()),
            headers: Headers::new(),
            reason: "the value is not JSON".to_owned(),
        }))
    }

    /// A first attempt at `event`. What a dispatch would own is leaked: a test's few tasks
    /// live as long as the test anyway, and a `'static` task can move into spawned work.
    pub(crate) fn task(event: Event) -> Task<'static> {
        Task {
            event: Box::leak(Box::new(event)),
            cancel: leak(CancelWatch::detached(Arc::new(CancelSignal::new()))),
            deadline: None,
            started: None,
            attempt: 1,
            permit: Box::leak(Box::default()),
        }
    }

    /// `value`, leaked for a task's `'static` borrow.
    pub(crate) fn leak<T>(value: T) -> &'static T {
        Box::leak(Box::new(value))
    }
}
