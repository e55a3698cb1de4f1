//! The consumer engine: assigned partitions, the runners that serve their active keys (at most
//! `maxConcurrency` per partition, taking keys in turn; see [`super::partition`]), the global
//! concurrency limit, and the drain on revocation. It knows nothing of librdkafka: records arrive through
//! [`Engine::offer`], pausing goes out through [`FlowControl`], and handling through
//! [`Dispatch`], so the whole engine runs in unit tests without a broker.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use parking_lot::Mutex;
use prosody_api::{Key, Offset};
use tokio::runtime::Handle;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, error, warn};

use super::admission::{Admission, PermitSlot, SemaphoreAdmission, TaskClass, settle};
use super::cancel::{CancelSignal, CancelWatch};
use super::partition::{Next, Offer, PartitionWork};
use super::topic_partition::TopicPartition;
use super::work::{Keyed, Work};
use crate::event::{Event, FiredTimer};
use crate::hashing::KeyMap;
use crate::probes::{HealthRegistry, PartitionHealth};
use crate::timers::{TimerSink, Timers};

/// How a dispatch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The event is done (handled, or given up by the failure policy): its offset may commit.
    Completed,
    /// The dispatch stopped because it was cancelled (revocation, shutdown) before the event
    /// was done: its offset stays uncommitted so the next owner handles it.
    Abandoned,
}

/// Handles one event to an [`Outcome`]. The engine calls it for one event of a key at a time,
/// in order, and commits the event's offset once it returns [`Outcome::Completed`].
///
/// Implementations own the failure policy (retry, defer, failure topic). They must not panic;
/// the engine logs a panic as a bug and treats the event as done rather than stalling the
/// partition forever.
#[async_trait]
pub trait Dispatch: Send + Sync + 'static {
    /// Handles `event`. `cancel` fires when the work must stop (revocation, shutdown).
    async fn dispatch(&self, event: Event, cancel: Arc<CancelSignal>) -> Outcome;

    /// Handles `event` under the admission permit the engine acquired for it, in `permit`.
    /// The engine calls this one; a dispatch that retries overrides it to give the permit
    /// back while it waits (see [`super::admission`]). The default leaves the permit where it
    /// is, so it is held for the whole dispatch.
    ///
    /// Everything is borrowed: the engine's runner keeps the event, its view of the
    /// partition's cancellation (the runner's task enlisted, see [`CancelSignal::enlist`]) and
    /// the permit's slot while the dispatch runs, so the dispatch needs no allocation for the
    /// event and no share of what the partition's events have in common.
    async fn dispatch_admitted(
        &self,
        event: &Event,
        cancel: &CancelWatch,
        _permit: &PermitSlot,
    ) -> Outcome {
        self.dispatch(event.clone(), cancel.signal().clone()).await
    }
}

/// Pauses and resumes fetching of a partition (librdkafka in production).
pub trait FlowControl: Send + Sync + 'static {
    /// Stops fetching `partition` until resumed.
    fn pause(&self, partition: &TopicPartition);
    /// Resumes fetching `partition`.
    fn resume(&self, partition: &TopicPartition);
}

/// Limits of the engine.
#[derive(Clone, Debug)]
pub struct EngineLimits {
    /// Handlers running at once across all partitions (>= 1).
    pub max_concurrency: usize,
    /// Events queued or running per partition before it is paused (>= 1).
    pub max_uncommitted: usize,
    /// How long a revocation or shutdown waits for running handlers. Their cancellation fires
    /// at four fifths of it so cooperative handlers can still finish in time.
    pub shutdown_timeout: Duration,
}

/// One assignment of a partition. Each has its own lock, so partitions never wait on each
/// other, and a key's runner holds its slot: it reaches its partition's work without a lookup,
/// and a runner that outlives a revocation only ever sees its own (revoked) assignment.
struct Slot {
    partition: TopicPartition,
    /// Cancellation of every handler of this assignment (fired on revocation and shutdown).
    /// Fixed for the assignment: each runner enlists once and lends its view to every
    /// dispatch, and its identity tells one assignment from another (see `middleware::defer`).
    cancel: Arc<CancelSignal>,
    work: Mutex<PartitionWork<Work>>,
    health: PartitionHealth,
    drained: Notify,
    /// Where parked runners wait: one permit per key handed to them (see
    /// [`PartitionWork::take_ready`]). Closed when the assignment ends, which ends them.
    wake: Semaphore,
}

impl Slot {
    /// Stops serving the assignment: nothing more is dispatched and parked runners end (busy
    /// ones end after their event, as `take_ready` and `after_event` say stop from now on).
    /// True when nothing is running any more.
    fn retire(&self, work: &mut PartitionWork<Work>) -> bool {
        let drained = work.revoke();
        self.wake.close();
        drained
    }
}

/// Called with the partitions of each revocation once their handlers have drained: what a
/// process caches for the keys it owns (the keyed-state cache) must be dropped there, since
/// the next owner may change the data.
pub type RevocationHook = Arc<dyn Fn(&[TopicPartition]) + Send + Sync>;

struct Inner {
    slots: Mutex<KeyMap<TopicPartition, Arc<Slot>>>,
    revocation_hooks: Mutex<Vec<RevocationHook>>,
    generation: Mutex<u64>,
    dispatch: Arc<dyn Dispatch>,
    flow: Arc<dyn FlowControl>,
    admission: Arc<dyn Admission>,
    limits: EngineLimits,
    health: HealthRegistry,
    runtime: Handle,
    timers: Option<Timers>,
}

/// The consumer engine. Cheap to clone; clones share the same state.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// An engine that spawns its key runners on `runtime` and reports assignment, work and
    /// progress of its partitions to `health` (which the probes and the client read).
    /// Admission is first come, first served over `limits.max_concurrency` permits.
    #[must_use]
    pub fn new(
        limits: EngineLimits,
        dispatch: Arc<dyn Dispatch>,
        flow: Arc<dyn FlowControl>,
        health: HealthRegistry,
        runtime: Handle,
    ) -> Self {
        let admission = Arc::new(SemaphoreAdmission::new(limits.max_concurrency));
        Self::with_admission(limits, dispatch, admission, flow, health, runtime, None)
    }

    /// As [`Engine::new`], with durable timers: each assigned partition gets a timer manager
    /// of `timers` that fires due timers into the partition's key queues, and a revocation
    /// stops it before draining. `dispatch` must stage its contexts' timers through the same
    /// `timers` so fired timers are removed when their events complete.
    #[must_use]
    pub fn with_timers(
        limits: EngineLimits,
        dispatch: Arc<dyn Dispatch>,
        flow: Arc<dyn FlowControl>,
        health: HealthRegistry,
        runtime: Handle,
        timers: Timers,
    ) -> Self {
        let admission = Arc::new(SemaphoreAdmission::new(limits.max_concurrency));
        Self::with_admission(
            limits,
            dispatch,
            admission,
            flow,
            health,
            runtime,
            Some(timers),
        )
    }

    /// The general constructor: `admission` (the fair scheduler) bounds concurrency instead
    /// of a plain semaphore of `limits.max_concurrency` permits, and `timers`, when given,
    /// work as for [`Engine::with_timers`].
    #[must_use]
    pub fn with_admission(
        limits: EngineLimits,
        dispatch: Arc<dyn Dispatch>,
        admission: Arc<dyn Admission>,
        flow: Arc<dyn FlowControl>,
        health: HealthRegistry,
        runtime: Handle,
        timers: Option<Timers>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                slots: Mutex::new(KeyMap::default()),
                revocation_hooks: Mutex::new(Vec::new()),
                generation: Mutex::new(0),
                dispatch,
                flow,
                admission,
                limits,
                health,
                runtime,
                timers,
            }),
        }
    }

    /// Registers `hook` to run after each revocation has drained (see [`RevocationHook`]).
    pub fn on_revoked(&self, hook: RevocationHook) {
        self.inner.revocation_hooks.lock().push(hook);
    }

    /// The timers runtime, when the engine has one.
    #[must_use]
    pub fn timers(&self) -> Option<&Timers> {
        self.inner.timers.as_ref()
    }

    /// Starts tracking newly assigned partitions. A partition already tracked keeps its work.
    pub fn assign(&self, partitions: impl IntoIterator<Item = TopicPartition>) {
        let mut started = Vec::new();
        let mut slots = self.inner.slots.lock();
        for partition in partitions {
            if slots.contains_key(&partition) {
                continue;
            }
            let generation = {
                let mut generation = self.inner.generation.lock();
                *generation += 1;
                *generation
            };
            debug!(%partition, generation, "partition assigned");
            let work = PartitionWork::new(
                generation,
                self.inner.limits.max_uncommitted,
                self.inner.limits.max_concurrency,
            );
            let health = self
                .inner
                .health
                .partition_assigned(partition.topic.as_str(), partition.partition.0);
            started.push((partition.clone(), generation));
            slots.insert(
                partition.clone(),
                Arc::new(Slot {
                    partition,
                    cancel: Arc::new(CancelSignal::new()),
                    work: Mutex::new(work),
                    health,
                    drained: Notify::new(),
                    wake: Semaphore::new(0),
                }),
            );
        }
        drop(slots);
        if let Some(timers) = &self.inner.timers {
            for (partition, generation) in started {
                let sink = Arc::new(EngineTimerSink {
                    engine: Arc::downgrade(&self.inner),
                    partition: partition.clone(),
                    generation,
                });
                timers.start(&partition, sink, &self.inner.runtime);
            }
        }
    }

    /// Queues a due timer of `partition` behind its key's other events. Timers bypass the
    /// backlog bound (their manager bounds how many are in flight) but count in the backlog
    /// while queued or running. False when the assignment of `generation` is gone.
    fn offer_timer(&self, partition: &TopicPartition, generation: u64, fired: FiredTimer) -> bool {
        let Some(slot) = self.slot(partition) else {
            return false;
        };
        let offer = {
            let mut work = slot.work.lock();
            if work.generation() != generation {
                return false;
            }
            let offer = work.offer_timer(Work::Event(Event::Timer(fired)));
            if matches!(
                offer,
                Offer::StartRunner(_) | Offer::WakeRunner | Offer::Queued
            ) {
                slot.health.work_pending();
            }
            offer
        };
        match offer {
            Offer::StartRunner(key) => {
                self.spawn_runner(slot, key);
                true
            }
            Offer::WakeRunner => {
                slot.wake.add_permits(1);
                true
            }
            Offer::Queued => true,
            Offer::Held | Offer::Duplicate | Offer::Revoked => false,
        }
    }

    /// Offers an event or record received from `partition`. Those of unassigned partitions
    /// are dropped (they stay uncommitted, so nothing is lost).
    pub fn offer(&self, partition: &TopicPartition, work: impl Into<Work>) {
        self.offer_batch(partition, &mut vec![work.into()]);
    }

    /// Offers several records of one partition, in offset order, under one lock; the runners
    /// they start are spawned together, so a batch costs one wakeup of the runtime, and parked
    /// runners are woken together.
    /// The batch is drained, not taken: a reader fills the same buffer again.
    pub fn offer_batch(&self, partition: &TopicPartition, batch: &mut Vec<Work>) {
        let Some(slot) = self.slot(partition) else {
            warn!(%partition, records = batch.len(), "records of an unassigned partition dropped");
            batch.clear();
            return;
        };
        let mut start = Vec::new();
        let mut wake = 0;
        {
            let mut work = slot.work.lock();
            for item in batch.drain(..) {
                match work.offer(item) {
                    Offer::StartRunner(key) => start.push(key),
                    Offer::WakeRunner => wake += 1,
                    Offer::Duplicate => debug!(%partition, "redelivered record dropped"),
                    Offer::Queued | Offer::Held | Offer::Revoked => {}
                }
                if work.take_pause() {
                    // Under the lock: a runner's resume must not overtake this pause, or the
                    // partition would stay paused while the engine believes it runs.
                    debug!(%partition, "backlog full: pausing");
                    self.inner.flow.pause(partition);
                }
            }
            if !work.is_idle() {
                slot.health.work_pending();
            }
        }
        if wake > 0 {
            slot.wake.add_permits(wake);
        }
        if start.is_empty() {
            return;
        }
        let engine = self.clone();
        let spawn_runners = move || {
            for key in start {
                engine.spawn_runner(slot.clone(), key);
            }
        };
        // On a worker (a partition reader) the runners go to its local queue at once. From
        // another thread one task spawns them all on a worker's local queue, which needs no
        // cross-thread wakeup per runner.
        if Handle::try_current().is_ok() {
            spawn_runners();
        } else {
            self.inner.runtime.spawn(async move { spawn_runners() });
        }
    }

    /// How many more records `partition` accepts before its backlog is full (0 when paused or
    /// unassigned): the partition's reader reads no more than this from its queue.
    #[must_use]
    pub fn room(&self, partition: &TopicPartition) -> usize {
        self.slot(partition)
            .map_or(0, |slot| slot.work.lock().room())
    }

    /// Marks a record that cannot become an event (it failed to decode) as done, so it does
    /// not block the partition's offsets. The caller has already reported it.
    pub fn skip(&self, partition: &TopicPartition, offset: Offset) {
        // A skipped record passes through the same tracker as any other so the watermark
        // stays exact; it never occupies a key queue.
        if let Some(slot) = self.slot(partition) {
            slot.work.lock().skip(offset);
        }
    }

    /// Revokes partitions: stops dispatching them, waits up to the shutdown timeout for their
    /// running handlers (cancelling them at four fifths of it), forgets them, and returns the
    /// offsets to commit for them.
    pub async fn revoke(&self, partitions: &[TopicPartition]) -> Vec<(TopicPartition, Offset)> {
        // Timers first: nothing new may fire while the partition drains, and what did not
        // finish stays stored for the next owner.
        if let Some(timers) = &self.inner.timers {
            for partition in partitions {
                timers.stop(partition);
            }
        }
        let mut waits = Vec::new();
        for partition in partitions {
            if let Some(slot) = self.slot(partition) {
                let drained = slot.retire(&mut slot.work.lock());
                if !drained {
                    waits.push(slot);
                }
            }
        }
        if !waits.is_empty() {
            let budget = self.inner.limits.shutdown_timeout;
            let cancel_at = budget.saturating_sub(budget / 5);
            let drained =
                futures::future::join_all(waits.iter().map(|slot| slot.drained.notified()));
            tokio::pin!(drained);
            if tokio::time::timeout(cancel_at, &mut drained).await.is_err() {
                warn!(
                    ?partitions,
                    "handlers still running near the shutdown deadline: cancelling"
                );
                for slot in &waits {
                    slot.cancel.cancel();
                }
                if tokio::time::timeout(budget.saturating_sub(cancel_at), &mut drained)
                    .await
                    .is_err()
                {
                    error!(
                        ?partitions,
                        "handlers ignored cancellation past the shutdown timeout; their records \
                         stay uncommitted and will be handled again by the next owner"
                    );
                }
            }
        }
        let offsets = self.forget(partitions, |slot, _| slot.cancel.cancel());
        let hooks = self.inner.revocation_hooks.lock().clone();
        for hook in hooks {
            hook(partitions);
        }
        offsets
    }

    /// Gives up `partitions` without waiting, for a consumer closed without its poll loop
    /// (whose runtime may be gone): returns the offsets done so far, drops what is queued
    /// (uncommitted, so the next owner handles it), leaves running handlers to end on their own
    /// and ends parked runners.
    #[must_use]
    pub fn abandon(&self, partitions: &[TopicPartition]) -> Vec<(TopicPartition, Offset)> {
        self.forget(partitions, |slot, work| {
            slot.retire(work);
        })
    }

    /// Forgets the assignments of `partitions`, running `end` on each under its lock, and
    /// returns their committable offsets.
    fn forget(
        &self,
        partitions: &[TopicPartition],
        end: impl Fn(&Slot, &mut PartitionWork<Work>),
    ) -> Vec<(TopicPartition, Offset)> {
        let removed: Vec<Arc<Slot>> = {
            let mut slots = self.inner.slots.lock();
            partitions
                .iter()
                .filter_map(|partition| slots.remove(partition))
                .collect()
        };
        removed
            .iter()
            .filter_map(|slot| {
                let mut work = slot.work.lock();
                end(slot, &mut work);
                let partition = &slot.partition;
                self.inner
                    .health
                    .partition_revoked(partition.topic.as_str(), partition.partition.0);
                Some((partition.clone(), work.committable()?))
            })
            .collect()
    }

    /// The partitions currently assigned.
    #[must_use]
    pub fn assigned(&self) -> Vec<TopicPartition> {
        self.inner.slots.lock().keys().cloned().collect()
    }

    /// The committable position of every assigned partition that received records.
    #[must_use]
    pub fn committable(&self) -> Vec<(TopicPartition, Offset)> {
        self.inner
            .slots
            .lock()
            .iter()
            .filter_map(|(partition, slot)| {
                Some((partition.clone(), slot.work.lock().committable()?))
            })
            .collect()
    }

    /// Number of assigned partitions.
    #[must_use]
    pub fn assigned_partition_count(&self) -> usize {
        self.inner.health.assigned_partition_count()
    }

    /// True when some partition has work and made no progress for `threshold`.
    #[must_use]
    pub fn is_stalled(&self, threshold: Duration) -> bool {
        let health = &self.inner.health;
        health.is_stalled(threshold, health.now())
    }

    /// Counts for observability and tests: (queued + running, running, held) summed over
    /// partitions.
    #[must_use]
    pub fn load(&self) -> Load {
        let slots = self.inner.slots.lock();
        slots.values().fold(Load::default(), |load, slot| {
            let work = slot.work.lock();
            Load {
                backlog: load.backlog + work.backlog(),
                running: load.running + work.running(),
                held: load.held + work.held(),
                paused: load.paused + usize::from(work.is_paused()),
            }
        })
    }

    /// The current assignment of `partition`.
    fn slot(&self, partition: &TopicPartition) -> Option<Arc<Slot>> {
        self.inner.slots.lock().get(partition).cloned()
    }

    fn spawn_runner(&self, slot: Arc<Slot>, key: Key) {
        let engine = self.clone();
        let run = async move { engine.run_key(slot, key).await };
        // Inside the runtime, spawn locally; from a foreign thread, through the handle.
        if Handle::try_current().is_ok() {
            tokio::spawn(run);
        } else {
            self.inner.runtime.spawn(run);
        }
    }

    /// Serves keys of the partition, starting with `key`: their events one at a time, a key at
    /// a time, as [`PartitionWork::after_event`] directs, parking while no key waits for a
    /// runner, until the assignment ends.
    async fn run_key(self, slot: Arc<Slot>, mut key: Key) {
        let partition = &slot.partition;
        // Enlisted once: the dispatches' waits for cancellation cost no registration each.
        let cancel = slot.cancel.enlist().await;
        // One slot for all of the runner's events, refilled per event (see `PermitSlot::hold`).
        let mut permit = PermitSlot::default();
        // The permit of the event just finished when the runner goes straight on to another:
        // renewed rather than given back and asked for again (see `Admission::renew`).
        let mut renewal = None;
        loop {
            // A key's first attempt is normal work; retries ask again inside the dispatch.
            let admission = &*self.inner.admission;
            let request = match renewal.take() {
                Some(held) => admission.renew(held, &key, TaskClass::Normal),
                None => admission.request(&key, TaskClass::Normal),
            };
            permit.hold(settle(admission, request, &key, TaskClass::Normal).await);
            let taken = {
                let mut work = slot.work.lock();
                match work.next_for(&key) {
                    Some(next) => Ok(next),
                    // Revoked, or (never expected) a key with nothing queued: settle it like
                    // the end of an event, so a key waiting for a runner is not stranded.
                    None => Err(work.after_event(&key)),
                }
            };
            let event = match taken {
                Ok(taken) => taken,
                Err(next) => {
                    drop(permit.take_owned());
                    let Some(next) = following(&slot, next, key).await else {
                        return;
                    };
                    key = next;
                    continue;
                }
            };
            let offset = event.offset();
            let event = match event {
                Work::Event(event) => event,
                // Decoded here, by the key's runner; a value that is not JSON becomes a
                // rejected event so the mode's failure policy routes it before it commits.
                Work::Record(record) => record.into_routable(),
            };
            if let Event::Rejected(rejected) = &event {
                error!(%partition, reason = %rejected.reason,
                    "record rejected: cannot decode; the mode's failure policy routes it");
            }
            let fired = match &event {
                Event::Timer(fired) => Some(fired.clone()),
                Event::Message(_) | Event::Excise(_) | Event::Rejected(_) => None,
            };
            let timers = self.inner.timers.as_ref();
            if let (Some(fired), Some(timers)) = (&fired, timers)
                && !timers.is_live(fired)
            {
                // An earlier event of the key removed it after it fired: nothing to handle.
                debug!(%partition, %key, time = %fired.timer.time, "fired timer was removed: skipped");
                timers.finished(fired, true);
                let next = self.finish(&slot, &key, None);
                drop(permit.take_owned());
                let Some(next) = following(&slot, next, key).await else {
                    return;
                };
                key = next;
                continue;
            }
            let dispatched = AssertUnwindSafe(
                self.inner
                    .dispatch
                    .dispatch_admitted(&event, &cancel, &permit),
            )
            .catch_unwind()
            .await;
            let completed = match dispatched {
                Ok(Outcome::Completed) => true,
                Ok(Outcome::Abandoned) => false,
                Err(_) => {
                    error!(%partition, %key, ?offset, "dispatch panicked (a bug): event treated as done");
                    true
                }
            };
            if let (Some(fired), Some(timers)) = (&fired, timers) {
                timers.finished(fired, completed);
            }
            let next = self.finish(&slot, &key, offset.filter(|_| completed));
            // Released (or renewed) only after the finish is recorded, so the engine never
            // counts more running events than there are permits (unless the dispatch gave it
            // back). A runner that goes on at once keeps it for renewal; one that parks or
            // stops gives it back now.
            let held = permit.take_owned();
            if matches!(next, Next::Same | Next::Switch(_)) {
                renewal = held;
            } else {
                drop(held);
            }
            // Decided under the lock with the finish: asking for a permit first only to find
            // the queue empty cost a whole admission (and the fair scheduler's bookkeeping) per
            // event, since most keys have one event queued at a time.
            let Some(next) = following(&slot, next, key).await else {
                return;
            };
            key = next;
        }
    }

    /// Records the end of an event of `key` and returns what its runner does next.
    fn finish(&self, slot: &Arc<Slot>, key: &Key, offset: Option<Offset>) -> Next {
        let (finished, next) = {
            let mut work = slot.work.lock();
            let finished = work.finish(offset);
            let next = work.after_event(key);
            slot.health.progress();
            if work.is_idle() {
                slot.health.idle();
            }
            if finished.resume {
                // Under the lock, ordered with the pause in `offer`.
                debug!(partition = %slot.partition, "backlog drained: resuming");
                self.inner.flow.resume(&slot.partition);
            }
            (finished, next)
        };
        if finished.wake > 0 {
            slot.wake.add_permits(finished.wake);
        }
        for key in finished.start {
            self.spawn_runner(slot.clone(), key);
        }
        if finished.drained {
            slot.drained.notify_one();
        }
        next
    }
}

/// The key a runner serves after `next` (`current` when it goes on with it), or `None` when
/// it ends. A runner told to park waits until a key is handed to it or the assignment ends.
async fn following(slot: &Slot, mut next: Next, current: Key) -> Option<Key> {
    loop {
        match next {
            Next::Same => return Some(current),
            Next::Switch(key) => return Some(key),
            Next::Stop => return None,
            Next::Park => {
                // An error is the semaphore closed by the revocation.
                slot.wake.acquire().await.ok()?.forget();
                next = slot.work.lock().take_ready();
            }
        }
    }
}

/// Fires a partition's due timers into the engine. Holds the engine weakly: the engine owns
/// the timers runtime, which owns the managers, which own their sinks.
struct EngineTimerSink {
    engine: Weak<Inner>,
    partition: TopicPartition,
    generation: u64,
}

impl TimerSink for EngineTimerSink {
    fn fire(&self, timer: FiredTimer) -> bool {
        self.engine.upgrade().is_some_and(|inner| {
            Engine { inner }.offer_timer(&self.partition, self.generation, timer)
        })
    }
}

/// A snapshot of the engine's load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Events queued or running.
    pub backlog: usize,
    /// Events running.
    pub running: usize,
    /// Events received but held because their partition's backlog is full.
    pub held: usize,
    /// Partitions paused.
    pub paused: usize,
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use prosody_api::{Headers, Message, Partition, Timestamp, Topic};
    use serde_json::json;
    use tokio::sync::Semaphore;

    use super::*;

    #[derive(Default)]
    struct RecordingFlow {
        paused: AtomicUsize,
        resumed: AtomicUsize,
    }

    impl FlowControl for RecordingFlow {
        fn pause(&self, _: &TopicPartition) {
            self.paused.fetch_add(1, Ordering::SeqCst);
        }
        fn resume(&self, _: &TopicPartition) {
            self.resumed.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Records per-key order and the peak of concurrently running dispatches; each dispatch
    /// yields a few times so others interleave, and may wait for a gate.
    #[derive(Default)]
    struct Recorder {
        running: AtomicUsize,
        peak: AtomicUsize,
        seen: Mutex<HashMap<String, Vec<i64>>>,
        done: AtomicUsize,
        gate: Option<Arc<Semaphore>>,
        wait_for_cancel: bool,
        /// Each distinct cancellation a dispatch was given, kept alive so none of their
        /// addresses is reused.
        cancellations: Mutex<Vec<Arc<CancelSignal>>>,
    }

    #[async_trait]
    impl Dispatch for Recorder {
        async fn dispatch(&self, event: Event, cancel: Arc<CancelSignal>) -> Outcome {
            {
                let mut cancellations = self.cancellations.lock();
                if !cancellations.iter().any(|seen| Arc::ptr_eq(seen, &cancel)) {
                    cancellations.push(cancel.clone());
                }
            }
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            let offset = event.offset().map_or(-1, |offset| offset.0);
            for _ in 0..(offset % 5) {
                tokio::task::yield_now().await;
            }
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            if self.wait_for_cancel {
                cancel.cancelled().await;
            }
            self.seen
                .lock()
                .entry(event.key().to_string())
                .or_default()
                .push(offset);
            self.running.fetch_sub(1, Ordering::SeqCst);
            self.done.fetch_add(1, Ordering::SeqCst);
            Outcome::Completed
        }
    }

    fn event(key: &str, offset: i64) -> Event {
        Event::Message(Message {
            topic: Topic::from("t"),
            partition: Partition(0),
            offset: Offset(offset),
            timestamp: Timestamp::from_millis(0),
            key: Key::from(key),
            payload: json!({}).into(),
            headers: Headers::new(),
        })
    }

    fn engine(
        recorder: Arc<Recorder>,
        flow: Arc<RecordingFlow>,
        max_concurrency: usize,
        max_uncommitted: usize,
        shutdown_timeout: Duration,
    ) -> Engine {
        Engine::new(
            EngineLimits {
                max_concurrency,
                max_uncommitted,
                shutdown_timeout,
            },
            recorder,
            flow,
            HealthRegistry::new(),
            Handle::current(),
        )
    }

    async fn until(mut condition: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !condition() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("condition within 10 s");
    }

    /// An engine of 4 slots that has handled `events` events over `keys` keys of one
    /// assigned partition.
    async fn handled(keys: i64, events: i64) -> (Arc<Recorder>, Engine, TopicPartition) {
        let recorder = Arc::new(Recorder::default());
        let flow = Arc::new(RecordingFlow::default());
        let engine = engine(recorder.clone(), flow, 4, 1_000, Duration::from_secs(5));
        let partition = TopicPartition::new("t", 0);
        engine.assign([partition.clone()]);
        for offset in 0..events {
            engine.offer(&partition, event(&format!("k{}", offset % keys), offset));
        }
        let expected = usize::try_from(events).unwrap();
        until(|| recorder.done.load(Ordering::SeqCst) == expected).await;
        (recorder, engine, partition)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn keys_in_order_concurrency_bounded() {
        let (recorder, engine, partition) = handled(37, 2_000).await;
        let peak = recorder.peak.load(Ordering::SeqCst);
        assert!(peak > 1 && peak <= 4, "peak concurrency {peak}");
        for (key, offsets) in recorder.seen.lock().iter() {
            assert!(
                offsets.windows(2).all(|w| w[0] < w[1]),
                "{key} out of order: {offsets:?}"
            );
        }
        until(|| engine.committable() == vec![(partition.clone(), Offset(2_000))]).await;
    }

    /// The defer layer tells assignments apart by their cancellation's identity.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_event_of_an_assignment_carries_its_one_cancellation() {
        let (recorder, engine, partition) = handled(13, 200).await;
        assert_eq!(recorder.cancellations.lock().len(), 1, "one per assignment");
        engine.revoke(std::slice::from_ref(&partition)).await;
        engine.assign([partition.clone()]);
        engine.offer(&partition, event("k0", 200));
        until(|| recorder.done.load(Ordering::SeqCst) == 201).await;
        assert_eq!(
            recorder.cancellations.lock().len(),
            2,
            "a new assignment has its own"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_runners_park_serve_later_keys_and_end_with_the_assignment() {
        let recorder = Arc::new(Recorder::default());
        let flow = Arc::new(RecordingFlow::default());
        let engine = engine(recorder.clone(), flow, 4, 100, Duration::from_secs(5));
        // Each runner holds a clone of the engine.
        let runners = || Arc::strong_count(&engine.inner) - 1;
        let partition = TopicPartition::new("t", 0);
        engine.assign([partition.clone()]);
        let batch = |first: i64, keys: [&str; 3]| {
            (first..)
                .zip(keys)
                .map(|(offset, key)| Work::Event(event(key, offset)))
                .collect()
        };
        // One batch, so all three keys are offered before any runner could park.
        engine.offer_batch(&partition, &mut batch(0, ["a", "b", "c"]));
        // The backlog empties under the same lock as a runner parks.
        until(|| recorder.done.load(Ordering::SeqCst) == 3 && engine.load().backlog == 0).await;
        assert_eq!(runners(), 3, "runners park instead of ending");
        engine.offer_batch(&partition, &mut batch(3, ["d", "e", "f"]));
        until(|| recorder.done.load(Ordering::SeqCst) == 6 && engine.load().backlog == 0).await;
        assert_eq!(runners(), 3, "the parked runners served the new keys");
        engine.revoke(std::slice::from_ref(&partition)).await;
        until(|| runners() == 0).await;

        let other = TopicPartition::new("t", 1);
        engine.assign([other.clone()]);
        engine.offer(&other, event("a", 0));
        until(|| recorder.done.load(Ordering::SeqCst) == 7 && engine.load().backlog == 0).await;
        assert_eq!(runners(), 1);
        assert_eq!(
            engine.abandon(std::slice::from_ref(&other)),
            vec![(other, Offset(1))]
        );
        until(|| runners() == 0).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn full_backlog_pauses_and_drain_resumes() {
        let gate = Arc::new(Semaphore::new(0));
        let recorder = Arc::new(Recorder {
            gate: Some(gate.clone()),
            ..Recorder::default()
        });
        let flow = Arc::new(RecordingFlow::default());
        let engine = engine(recorder.clone(), flow.clone(), 2, 4, Duration::from_secs(5));
        let partition = TopicPartition::new("t", 0);
        engine.assign([partition.clone()]);
        for offset in 0..10 {
            engine.offer(&partition, event(&format!("k{offset}"), offset));
        }
        until(|| recorder.running.load(Ordering::SeqCst) == 2).await;
        let load = engine.load();
        assert_eq!(
            (load.backlog, load.running, load.held, load.paused),
            (4, 2, 6, 1)
        );
        assert_eq!(flow.paused.load(Ordering::SeqCst), 1);
        for released in 1..=10 {
            gate.add_permits(1);
            until(|| recorder.done.load(Ordering::SeqCst) == released).await;
            let load = engine.load();
            assert!(load.running <= 2 && load.backlog <= 4, "{load:?}");
        }
        until(|| engine.load().backlog == 0).await;
        assert_eq!(flow.resumed.load(Ordering::SeqCst), 1);
        assert_eq!(engine.committable(), vec![(partition, Offset(10))]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn revoke_waits_for_running_cancels_near_deadline_and_commits_done_work() {
        let recorder = Arc::new(Recorder {
            wait_for_cancel: true,
            ..Recorder::default()
        });
        let flow = Arc::new(RecordingFlow::default());
        let engine = engine(recorder.clone(), flow, 4, 16, Duration::from_millis(500));
        let partition = TopicPartition::new("t", 0);
        engine.assign([partition.clone()]);
        engine.offer(&partition, event("a", 0));
        engine.offer(&partition, event("a", 1));
        until(|| recorder.running.load(Ordering::SeqCst) == 1).await;
        let started = std::time::Instant::now();
        let offsets = engine.revoke(std::slice::from_ref(&partition)).await;
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(390) && waited < Duration::from_millis(500),
            "cancelled at 4/5 of the budget, waited {waited:?}"
        );
        assert_eq!(
            offsets,
            vec![(partition, Offset(1))],
            "offset 0 done, 1 dropped"
        );
        assert_eq!(
            recorder.done.load(Ordering::SeqCst),
            1,
            "the queued event never ran"
        );
        assert_eq!(engine.assigned_partition_count(), 0);
    }

    #[tokio::test]
    async fn revocation_hooks_run_after_the_drain_with_the_revoked_partitions() {
        let recorder = Arc::new(Recorder {
            wait_for_cancel: true,
            ..Recorder::default()
        });
        let flow = Arc::new(RecordingFlow::default());
        let engine = engine(recorder.clone(), flow, 4, 16, Duration::from_millis(200));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook_seen = seen.clone();
        let hook_recorder = recorder.clone();
        engine.on_revoked(Arc::new(move |partitions: &[TopicPartition]| {
            // Runs once nothing of the revoked partitions runs any more.
            hook_seen.lock().push((
                partitions.to_vec(),
                hook_recorder.running.load(Ordering::SeqCst),
            ));
        }));
        let partition = TopicPartition::new("t", 3);
        engine.assign([partition.clone()]);
        engine.offer(&partition, event("a", 0));
        until(|| recorder.running.load(Ordering::SeqCst) == 1).await;
        assert!(seen.lock().is_empty());
        engine.revoke(std::slice::from_ref(&partition)).await;
        assert_eq!(*seen.lock(), vec![(vec![partition], 0)]);
    }
}
