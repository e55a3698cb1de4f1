//! Deferred retry (pipeline mode): a transient failure does not block its partition.
//!
//! When an event of a key fails transiently, this layer stores it through the
//! [`DeferStore`] (a message by its offset, an application timer by its time), schedules a
//! [`TimerKind::DeferRetry`] timer for the key and answers success, so the record's offset can
//! commit and the partition moves on. From then on the key is *deferred*: every later message
//! or timer of the key is stored behind the failed one without being handled, so the key's
//! order holds. When the retry timer fires, the deferred work is retried head first (a
//! message is reloaded from Kafka through the shared [loader](crate::kafka::loader)): what
//! succeeds is removed and the next is tried at once; the first that fails again gets its
//! retry count raised and a new timer `deferBaseMs * 2^retries` later (at most
//! `deferMaxDelayMs`).
//!
//! **Failure-rate gate.** Deferring everything when everything fails would only move the
//! load into storage. The layer keeps the rate of transient failures over
//! `deferFailureWindowMs`; while it exceeds `deferFailureThreshold` deferral is off: a
//! failure goes up to the retry layer, which retries it in place and so blocks the key
//! (backpressure). Switching is logged and visible in [`DeferStatus`]. Keys already deferred
//! stay deferred (their order must hold); their retries then block too.
//!
//! **Excise.** An excise record of a deferred key is not queued: it runs at once, and once it
//! succeeds every deferred message and timer of the key is dropped with the key's retry timer
//! (the data they carry is what the excise deletes). Its own `clear_scheduled()` removes the
//! application timers as usual.
//!
//! **Permanent failures** of deferred work leave deferral as a first attempt's would: a
//! reloaded message goes where the mode sends given-up records (the failure topic when one is
//! set, else the log), a deferred timer is logged. The failure-policy layer above cannot do it:
//! it sees only the retry timer, not the record. A message that cannot be reloaded at all (gone
//! from Kafka) has nothing to forward and is logged.
//!
//! **Which keys are deferred.** Every event asks whether its key is deferred, and almost always
//! the answer is no. So the layer reads the partition's deferred keys once per ownership
//! ([`DeferStore::deferred_keys`], with the partition's first event) and from then on keeps the
//! list itself: it is exact while the partition is owned (calls of a key are serialized and
//! this process is the only writer), so an event of a key that is not listed touches no storage
//! and hashes nothing when the partition has no deferred key at all. A listed key's work is
//! read when needed and cached, at most `deferStoreCacheSize` keys per partition. A revocation
//! (the partition's cancellation) ends the ownership; a partition that comes back is read
//! again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use prosody_api::storage::{DeferStore, DeferredMessage, DeferredTimer, PartitionScope};
use prosody_api::{Key, Offset, Partition, StorageError, Timer, TimerKind, TimerTime, Topic};
use serde_json::Value;
use tokio::sync::OnceCell;
use tracing::{debug, error, info, warn};

use super::failure_policy::Destination;
use super::failure_rate::{FailureRate, Locked};
use super::{Failure, FailureKind, Layer, Service, Task, Verdict};
use crate::consumer::{AttachmentOwner, CancelSignal};
use crate::event::{Event, FiredTimer};
use crate::hashing::KeyMap;
use crate::kafka::loader::LoadRecord;
use crate::monotonic::{Clock, SystemClock};
use crate::timers::{TimerWrite, Timers};

/// Limits and delays of the defer layer.
#[derive(Clone, Copy, Debug)]
pub struct DeferSettings {
    /// Whether new failures are deferred (`deferEnabled`).
    pub new_failures: NewFailures,
    /// Delay before the first deferred retry (`deferBaseMs`).
    pub base: Duration,
    /// Cap of the delay (`deferMaxDelayMs`).
    pub max_delay: Duration,
    /// Failure rate above which deferral switches off (`deferFailureThreshold`).
    pub failure_threshold: f64,
    /// Window of the failure rate (`deferFailureWindowMs`).
    pub failure_window: Duration,
    /// Outcomes the window must hold before the rate can switch deferral off: a handful of
    /// early failures is not a rate.
    pub min_samples: u64,
    /// Deferred keys per partition whose work is cached (`deferStoreCacheSize`).
    pub cache_size: u64,
}

/// What the layer does with a transient failure of a key that has no deferred work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewFailures {
    /// Defer it while the failure-rate gate is open (`deferEnabled: true`).
    Defer,
    /// Leave it to the retry layer, which blocks the key (`deferEnabled: false`). Work that an
    /// earlier run deferred is still retried when its timer fires, and later records of such a
    /// key still queue behind it: turning deferral off never strands stored work or breaks a
    /// key's order.
    RetryInPlace,
}

impl DeferSettings {
    /// The delay before deferred retry number `retries` (from 0).
    #[must_use]
    pub fn delay(&self, retries: u32) -> Duration {
        let factor = 2_u32.saturating_pow(retries.min(31));
        self.base.saturating_mul(factor).min(self.max_delay)
    }
}

/// A snapshot of the defer layer, for logs, metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeferSnapshot {
    /// True while new failures are deferred; false while the failure-rate gate has switched
    /// deferral off (failures then block their key in the retry layer).
    pub deferring: bool,
    /// Transient-failure rate over the window.
    pub failure_rate: f64,
    /// Outcomes in the window.
    pub samples: u64,
    /// Messages and timers deferred so far (first failures and those queued behind them).
    pub deferred: u64,
    /// Deferred messages and timers handled successfully on a retry.
    pub completed: u64,
    /// Deferred work that left deferral without succeeding: excised, failed permanently
    /// (a message then went to the failure destination) or gone from Kafka.
    pub dropped: u64,
    /// Times the gate switched deferral off.
    pub switched_off: u64,
    /// Attempts that failed transiently so far, every retry counted (the failure rate's
    /// numerator over the whole subscription rather than the window): an outage of a store
    /// shows here even when the attempts fail before the handler runs.
    pub transient_failures: u64,
}

#[derive(Debug)]
struct StatusInner {
    new_failures: NewFailures,
    threshold: f64,
    min_samples: u64,
    rate: FailureRate,
    deferring: AtomicBool,
    deferred: AtomicU64,
    completed: AtomicU64,
    dropped: AtomicU64,
    switched_off: AtomicU64,
    transient_failures: AtomicU64,
}

/// The live state of a defer layer: its failure-rate gate and counters. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DeferStatus {
    inner: Arc<StatusInner>,
}

impl DeferStatus {
    /// A gate for `settings`, deferring until failures say otherwise.
    #[must_use]
    pub fn new(settings: &DeferSettings) -> Self {
        Self::with_clock(settings, Arc::new(SystemClock))
    }

    /// [`Self::new`] with the failure-rate window judged by `clock`.
    #[must_use]
    pub fn with_clock(settings: &DeferSettings, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(StatusInner {
                new_failures: settings.new_failures,
                threshold: settings.failure_threshold,
                min_samples: settings.min_samples,
                rate: FailureRate::new(settings.failure_window, clock),
                deferring: AtomicBool::new(settings.new_failures == NewFailures::Defer),
                deferred: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                switched_off: AtomicU64::new(0),
                transient_failures: AtomicU64::new(0),
            }),
        }
    }

    /// Records the outcome of one handler attempt.
    fn record(&self, verdict: &Verdict) {
        let failed = match verdict {
            Ok(_) => false,
            Err(failure) if failure.kind == FailureKind::Transient => true,
            Err(_) => return,
        };
        if failed {
            self.count(|inner| &inner.transient_failures);
        }
        // A success cannot shut an open gate, so the common case only counts it, and while
        // the window's newest bucket is open, without the lock.
        let open = self.inner.deferring.load(Ordering::Relaxed);
        if open && !failed && self.inner.rate.try_count_success() {
            return;
        }
        let mut rate = self.inner.rate.lock();
        rate.record(failed);
        if failed || !open {
            self.update(&mut rate);
        }
    }

    /// Re-evaluates the gate and reports whether deferral is on.
    #[must_use]
    pub fn is_deferring(&self) -> bool {
        let mut rate = self.inner.rate.lock();
        self.update(&mut rate)
    }

    fn update(&self, rate: &mut Locked<'_>) -> bool {
        if self.inner.new_failures == NewFailures::RetryInPlace {
            return false;
        }
        let (failure_rate, samples) = rate.rate();
        let deferring = samples < self.inner.min_samples || failure_rate <= self.inner.threshold;
        let was = self.inner.deferring.swap(deferring, Ordering::SeqCst);
        if was && !deferring {
            self.inner.switched_off.fetch_add(1, Ordering::Relaxed);
            warn!(
                failure_rate,
                samples,
                threshold = self.inner.threshold,
                "failure rate over the threshold: deferral switched off, failures now block their key"
            );
        } else if !was && deferring {
            info!(
                failure_rate,
                samples,
                threshold = self.inner.threshold,
                "failure rate back under the threshold: deferral switched on"
            );
        }
        deferring
    }

    /// The state now.
    #[must_use]
    pub fn snapshot(&self) -> DeferSnapshot {
        let mut rate = self.inner.rate.lock();
        let deferring = self.update(&mut rate);
        let (failure_rate, samples) = rate.rate();
        DeferSnapshot {
            deferring,
            failure_rate,
            samples,
            deferred: self.inner.deferred.load(Ordering::Relaxed),
            completed: self.inner.completed.load(Ordering::Relaxed),
            dropped: self.inner.dropped.load(Ordering::Relaxed),
            switched_off: self.inner.switched_off.load(Ordering::Relaxed),
            transient_failures: self.inner.transient_failures.load(Ordering::Relaxed),
        }
    }

    fn count(&self, counter: fn(&StatusInner) -> &AtomicU64) {
        counter(&self.inner).fetch_add(1, Ordering::Relaxed);
    }
}

/// One key's deferred work, as stored.
#[derive(Clone, Debug, Default)]
struct KeyWork {
    messages: BTreeMap<Offset, u32>,
    timers: BTreeMap<TimerTime, u32>,
}

/// The work of every key with nothing deferred.
static NOTHING: KeyWork = KeyWork {
    messages: BTreeMap::new(),
    timers: BTreeMap::new(),
};

/// What is retried next: messages first (they came through the key's queue in order), then
/// timers.
#[derive(Clone, Copy, Debug)]
enum Head {
    Message(Offset, u32),
    Timer(TimerTime, u32),
}

impl KeyWork {
    fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.timers.is_empty()
    }

    fn head(&self) -> Option<Head> {
        if let Some((&offset, &retries)) = self.messages.first_key_value() {
            return Some(Head::Message(offset, retries));
        }
        self.timers
            .first_key_value()
            .map(|(&time, &retries)| Head::Timer(time, retries))
    }
}

/// One ownership of a partition (an assignment: attached to its signal, see
/// [`crate::consumer::attachments`]) and its deferred keys, read from the store by the first
/// event that needs them.
#[derive(Default)]
struct Ownership {
    keys: OnceCell<Mutex<DeferredKeys>>,
    /// How many keys `keys` lists, readable without its lock: every event asks about its key,
    /// and a partition with nothing deferred (nearly always) answers with no lock taken.
    listed: AtomicUsize,
}

impl Ownership {
    /// Publishes how many keys `keys` lists, after a change under its lock.
    fn publish(&self, keys: &DeferredKeys) {
        self.listed.store(keys.keys.len(), Ordering::Release);
    }

    /// What this ownership knows of `key`'s deferred work.
    fn known(&self, key: &Key) -> Known {
        match self.keys.get() {
            Some(_) if self.listed.load(Ordering::Acquire) == 0 => Known::Settled(None),
            Some(keys) => keys.lock().known(key),
            None => Known::Unknown,
        }
    }
}

/// The keys of an owned partition with deferred work, each with its work when cached.
struct DeferredKeys {
    keys: KeyMap<Key, Option<Arc<KeyWork>>>,
    cached: usize,
}

/// What the layer knows of a key without reading storage.
enum Known {
    /// The key's deferred work (`None`: nothing is deferred).
    Settled(Option<Arc<KeyWork>>),
    /// Storage must answer: the partition's keys are not read yet, or the key is deferred but
    /// its work is not cached.
    Unknown,
}

impl DeferredKeys {
    fn listed(keys: Vec<Key>) -> Self {
        Self {
            keys: keys.into_iter().map(|key| (key, None)).collect(),
            cached: 0,
        }
    }

    fn known(&self, key: &Key) -> Known {
        if self.keys.is_empty() {
            return Known::Settled(None);
        }
        match self.keys.get(key) {
            None => Known::Settled(None),
            Some(Some(work)) => Known::Settled(Some(work.clone())),
            Some(None) => Known::Unknown,
        }
    }

    /// Lists `key` as deferred with `work`, dropping cached work of other keys (not the keys)
    /// beyond `capacity`; theirs is read again when next needed.
    fn hold(&mut self, key: &Key, work: Arc<KeyWork>, capacity: usize) {
        let had = self.keys.insert(key.clone(), Some(work));
        if matches!(had, Some(Some(_))) {
            return;
        }
        self.cached += 1;
        if self.cached > capacity {
            // A quarter at a time keeps the cost per event constant.
            let target = capacity - capacity / 4;
            for (listed, work) in &mut self.keys {
                if self.cached <= target {
                    break;
                }
                if listed != key && work.take().is_some() {
                    self.cached -= 1;
                }
            }
        }
    }

    fn forget(&mut self, key: &Key) {
        if let Some(Some(_)) = self.keys.remove(key) {
            self.cached -= 1;
        }
    }
}

/// Where one event's key lives and what is known of its deferred work. The storage scope and
/// the ownership are fetched only when storage is touched, so the common path writes nothing
/// that every worker shares (not even a reference count).
struct Place<'t> {
    topic: &'t Topic,
    partition: Partition,
    key: &'t Key,
    /// The assignment the event belongs to, which names its ownership.
    assignment: &'t CancelSignal,
    known: Known,
}

impl<'t> Place<'t> {
    fn topic(&self) -> &'t Topic {
        self.topic
    }

    fn key(&self) -> &'t Key {
        self.key
    }
}

/// The defer layer.
pub struct Defer<S> {
    settings: DeferSettings,
    store: Arc<dyn DeferStore>,
    timers: Timers,
    loader: Arc<dyn LoadRecord>,
    status: DeferStatus,
    give_up: Destination,
    /// Whose ownerships are attached to the assignments' signals: this layer's.
    owner: AttachmentOwner,
    /// Deferred keys per partition whose work is cached.
    capacity: usize,
    inner: S,
}

/// Builds a [`Defer`].
pub struct DeferLayer {
    /// Delays, gate and cache size.
    pub settings: DeferSettings,
    /// Where deferred work is kept.
    pub store: Arc<dyn DeferStore>,
    /// Where retry timers are kept (the engine's timers runtime, which fires them).
    pub timers: Timers,
    /// Reloads deferred messages.
    pub loader: Arc<dyn LoadRecord>,
    /// The gate and counters, shared with whoever observes them.
    pub status: DeferStatus,
    /// Where deferred messages that fail permanently go (the mode's failure destination).
    pub give_up: Destination,
}

impl Layer for DeferLayer {
    type Wrapped<S: Service> = Defer<S>;

    fn wrap<S: Service>(self, inner: S) -> Defer<S> {
        Defer {
            owner: AttachmentOwner::unique(),
            capacity: usize::try_from(self.settings.cache_size)
                .unwrap_or(usize::MAX)
                .max(1),
            settings: self.settings,
            store: self.store,
            timers: self.timers,
            loader: self.loader,
            status: self.status,
            give_up: self.give_up,
            inner,
        }
    }
}

/// A retry of deferred work that failed, with the event it retried when there was one (a
/// message that could not be reloaded has none).
struct HeadFailure {
    failure: Failure,
    event: Option<Event>,
}

fn storage_failure(error: &StorageError, attempt: u32) -> Failure {
    Failure::new(
        FailureKind::Transient,
        format!("deferred-work storage failed: {error}"),
        attempt,
    )
}

// Every event's future is allocated at the size of its largest state, so the paths most events
// never take (deferred-work retries, excise, storage reads on a cache miss, deferring a failure)
// are boxed where they start: inline they made this layer's future ~1.9 KiB, and the whole
// stack's over glibc's per-thread cache limit (1 KiB), which cost every event a slow-path
// allocation with fastbin consolidation.
impl<S: Service> Service for Defer<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        match task.event {
            Event::Timer(fired) if fired.kind == TimerKind::DeferRetry => {
                Box::pin(self.retry_deferred(task, fired)).await
            }
            Event::Rejected(_) => self.inner.call(task).await,
            Event::Excise(_) => Box::pin(self.excise(task)).await,
            Event::Message(_) | Event::Timer(_) => self.handle(task).await,
        }
    }
}

impl<S: Service> Defer<S> {
    fn place<'t>(&self, task: &'t Task<'t>) -> Place<'t> {
        let (topic, partition) = task.event.source();
        let key = task.event.key();
        let assignment = task.cancel.signal();
        let known = match assignment.attachments().get::<Arc<Ownership>>(self.owner) {
            Some(ownership) => ownership.known(key),
            None => self.ownership(assignment).known(key),
        };
        Place {
            topic,
            partition,
            key,
            assignment,
            known,
        }
    }

    /// The ownership of the partition by the assignment `assignment` signals: attached to it
    /// by the assignment's first event, so nothing known from an earlier ownership is trusted.
    /// A late event of an assignment already revoked, before any was attached, gets an
    /// ownership of its own, never remembered: the partition may have moved on since.
    fn ownership(&self, assignment: &CancelSignal) -> Arc<Ownership> {
        let attachments = assignment.attachments();
        if let Some(ownership) = attachments.get::<Arc<Ownership>>(self.owner) {
            return ownership.clone();
        }
        if assignment.is_cancelled() {
            return Arc::default();
        }
        // With no room on the signal (more layers attached than a stack has), every event reads
        // for itself: slower, never wrong.
        attachments
            .get_or_attach(self.owner, Arc::<Ownership>::default)
            .cloned()
            .unwrap_or_default()
    }

    fn scope(&self, place: &Place<'_>) -> PartitionScope {
        self.timers.scope(place.topic(), place.partition)
    }

    /// The key's deferred work (`None`: nothing deferred), from what the layer knows or the
    /// store. Work read from the store gets a retry timer if it has none (a crash between
    /// storing work and its timer, or a new owner of the partition).
    async fn work(&self, place: &Place<'_>) -> Result<Option<Arc<KeyWork>>, StorageError> {
        if let Known::Settled(work) = &place.known {
            return Ok(work.clone());
        }
        let ownership = self.ownership(place.assignment);
        let keys = ownership
            .keys
            .get_or_try_init(|| async {
                let listed = self.store.deferred_keys(&self.scope(place)).await?;
                if !listed.is_empty() {
                    debug!(topic = %place.topic(), partition = place.partition.0,
                        keys = listed.len(), "partition has deferred keys");
                }
                let keys = DeferredKeys::listed(listed);
                ownership.publish(&keys);
                Ok::<_, StorageError>(Mutex::new(keys))
            })
            .await?;
        if let Known::Settled(work) = keys.lock().known(place.key()) {
            // The partition's keys were read just now (or by another event meanwhile).
            return Ok(work);
        }
        let messages = self
            .store
            .deferred_messages(&self.scope(place), place.key())
            .await?;
        let timers = self
            .store
            .deferred_timers(&self.scope(place), place.key())
            .await?;
        let work = KeyWork {
            messages: messages
                .into_iter()
                .map(|message| (message.offset, message.retry_count))
                .collect(),
            timers: timers
                .into_iter()
                .map(|timer| (timer.time, timer.retry_count))
                .collect(),
        };
        if !work.is_empty() {
            let scheduled = self
                .timers
                .store()
                .scheduled(&self.scope(place), place.key(), TimerKind::DeferRetry)
                .await?;
            if scheduled.is_empty() {
                debug!(key = %place.key(), "deferred work without a retry timer: scheduling one");
                self.schedule_retry(place, 0, None).await?;
            }
        }
        Ok(self.remember(place, work))
    }

    /// Records `work` as the key's deferred work (an empty one unlists the key) and returns it
    /// shared.
    fn remember(&self, place: &Place<'_>, work: KeyWork) -> Option<Arc<KeyWork>> {
        let work = (!work.is_empty()).then(|| Arc::new(work));
        // Every path reads the partition's keys before it changes a key's work; a write to an
        // ownership that is not read yet would be read from the store anyway.
        let ownership = self.ownership(place.assignment);
        if let Some(keys) = ownership.keys.get() {
            let mut keys = keys.lock();
            match &work {
                Some(work) => keys.hold(place.key(), work.clone(), self.capacity),
                None => keys.forget(place.key()),
            }
            ownership.publish(&keys);
        }
        work
    }

    /// Schedules the key's one retry timer `delay(retries)` from now, strictly after `after`
    /// (the timer being handled, which must not be rescheduled onto itself).
    async fn schedule_retry(
        &self,
        place: &Place<'_>,
        retries: u32,
        after: Option<TimerTime>,
    ) -> Result<TimerTime, StorageError> {
        let due = SystemTime::now() + self.settings.delay(retries);
        // Rounded up: a retry never comes before its delay.
        let mut time = TimerTime::from_secs(TimerTime::from_system_time(due).as_secs() + 1);
        if let Some(after) = after {
            time = time.max(TimerTime::from_secs(after.as_secs() + 1));
        }
        self.timers
            .write_now(
                place.topic(),
                place.partition,
                place.key(),
                &TimerWrite::ClearAndSchedule(TimerKind::DeferRetry, time),
            )
            .await?;
        Ok(time)
    }

    /// Stores `event` as deferred work of its key behind `work`, scheduling the key's retry
    /// timer when it is the first.
    async fn defer(
        &self,
        place: &Place<'_>,
        work: &KeyWork,
        event: &Event,
    ) -> Result<(), StorageError> {
        let mut next = work.clone();
        match event {
            Event::Message(_) | Event::Excise(_) => {
                let Some(offset) = event.offset() else {
                    return Ok(());
                };
                if next.messages.contains_key(&offset) {
                    // Redelivered after a crash before its offset committed: already there.
                    return Ok(());
                }
                self.store
                    .defer_message(
                        &self.scope(place),
                        place.key(),
                        DeferredMessage {
                            offset,
                            retry_count: 0,
                        },
                    )
                    .await?;
                next.messages.insert(offset, 0);
            }
            Event::Timer(fired) => {
                let time = fired.timer.time;
                self.store
                    .defer_timer(
                        &self.scope(place),
                        place.key(),
                        DeferredTimer {
                            time,
                            retry_count: 0,
                        },
                    )
                    .await?;
                // The deferred entry is the timer now; the engine forgets the fired one when
                // this event completes, and the store must not fire it again on restart.
                self.timers
                    .write_now(
                        place.topic(),
                        place.partition,
                        place.key(),
                        &TimerWrite::Unschedule(fired.kind, time),
                    )
                    .await?;
                next.timers.insert(time, 0);
            }
            Event::Rejected(_) => return Ok(()),
        }
        if work.is_empty() {
            self.schedule_retry(place, 0, None).await?;
        }
        self.status.count(|inner| &inner.deferred);
        self.remember(place, next);
        Ok(())
    }

    /// A message or application timer: queued behind the key's deferred work, or handled and
    /// deferred when it fails transiently.
    async fn handle(&self, task: &Task<'_>) -> Verdict {
        let place = self.place(task);
        // Known without storage for nearly every event; the read is boxed so its future does
        // not size this one.
        let work = match &place.known {
            Known::Settled(work) => work.clone(),
            Known::Unknown => Box::pin(self.work(&place))
                .await
                .map_err(|error| storage_failure(&error, task.attempt))?,
        };
        let work = work.as_deref().unwrap_or(&NOTHING);
        if !work.is_empty() {
            Box::pin(self.defer(&place, work, task.event))
                .await
                .map_err(|error| storage_failure(&error, task.attempt))?;
            debug!(key = %place.key(), offset = ?task.event.offset(), "key is deferred: queued behind");
            return Ok(Value::Null);
        }
        let verdict = self.inner.call(task).await;
        self.status.record(&verdict);
        match verdict {
            Err(failure) if failure.kind == FailureKind::Transient => {
                Box::pin(self.defer_failure(&place, work, task, failure)).await
            }
            verdict => verdict,
        }
    }

    /// Defers a transient failure when the gate allows; else it passes up.
    async fn defer_failure(
        &self,
        place: &Place<'_>,
        work: &KeyWork,
        task: &Task<'_>,
        failure: Failure,
    ) -> Verdict {
        if !self.status.is_deferring() {
            return Err(failure);
        }
        match self.defer(place, work, task.event).await {
            Ok(()) => {
                warn!(key = %place.key(), offset = ?task.event.offset(), reason = %failure.reason,
                    retry_in = ?self.settings.delay(0), "transient failure: deferred");
                Ok(Value::Null)
            }
            Err(error) => {
                warn!(key = %place.key(), %error, "cannot defer: retrying in place");
                Err(failure)
            }
        }
    }

    /// An excise record runs at once; once it succeeded, the key's deferred work is dropped.
    async fn excise(&self, task: &Task<'_>) -> Verdict {
        let place = self.place(task);
        let work = self
            .work(&place)
            .await
            .map_err(|error| storage_failure(&error, task.attempt))?;
        let work = work.as_deref().unwrap_or(&NOTHING);
        let verdict = self.inner.call(task).await;
        self.status.record(&verdict);
        if verdict.is_ok() {
            if !work.is_empty() {
                self.drop_work(&place, work)
                    .await
                    .map_err(|error| storage_failure(&error, task.attempt))?;
            }
            return verdict;
        }
        match verdict {
            Err(failure) if failure.kind == FailureKind::Transient => {
                self.defer_failure(&place, work, task, failure).await
            }
            verdict => verdict,
        }
    }

    async fn drop_work(&self, place: &Place<'_>, work: &KeyWork) -> Result<(), StorageError> {
        self.store
            .clear_deferred_messages(&self.scope(place), place.key())
            .await?;
        self.store
            .clear_deferred_timers(&self.scope(place), place.key())
            .await?;
        self.timers
            .write_now(
                place.topic(),
                place.partition,
                place.key(),
                &TimerWrite::Clear(TimerKind::DeferRetry),
            )
            .await?;
        for offset in work.messages.keys() {
            self.loader.forget(place.topic(), place.partition, *offset);
        }
        let dropped = work.messages.len() + work.timers.len();
        for _ in 0..dropped {
            self.status.count(|inner| &inner.dropped);
        }
        info!(key = %place.key(), messages = work.messages.len(), timers = work.timers.len(),
            "key excised: its deferred work is dropped");
        self.remember(place, KeyWork::default());
        Ok(())
    }

    /// The key's retry timer fired: retry its deferred work, head first.
    async fn retry_deferred(&self, task: &Task<'_>, fired: &FiredTimer) -> Verdict {
        let place = self.place(task);
        let mut work = self
            .work(&place)
            .await
            .map_err(|error| storage_failure(&error, task.attempt))?
            .map_or_else(KeyWork::default, |work| (*work).clone());
        while let Some(head) = work.head() {
            let verdict = self.retry_head(task, &place, head).await;
            match verdict {
                Ok(()) => {
                    self.status.count(|inner| &inner.completed);
                    if let Err(error) = self.remove_head(&place, &mut work, head).await {
                        self.remember(&place, work);
                        return Err(storage_failure(&error, task.attempt));
                    }
                }
                Err(HeadFailure { failure, event }) if failure.kind == FailureKind::Permanent => {
                    if let Some(message @ Event::Message(_)) = event.as_ref() {
                        if let Err(cancelled) =
                            self.give_up.forward(message, &failure, task.cancel).await
                        {
                            // Still deferred: the next retry (or owner) forwards it.
                            self.remember(&place, work);
                            return Err(cancelled);
                        }
                    } else {
                        error!(key = %place.key(), ?head, reason = %failure.reason,
                            "deferred work failed permanently: dropped");
                    }
                    self.status.count(|inner| &inner.dropped);
                    if let Err(error) = self.remove_head(&place, &mut work, head).await {
                        self.remember(&place, work);
                        return Err(storage_failure(&error, task.attempt));
                    }
                }
                Err(HeadFailure { failure, .. }) if failure.kind == FailureKind::Transient => {
                    if !self.status.is_deferring() {
                        // The gate is shut: the retry layer retries this timer in place, which
                        // blocks the key as a non-deferred failure would.
                        self.remember(&place, work);
                        return Err(failure);
                    }
                    let retries = match head {
                        Head::Message(_, retries) | Head::Timer(_, retries) => {
                            retries.saturating_add(1)
                        }
                    };
                    let stored = self.bump(&place, &mut work, head, retries).await;
                    let scheduled = match stored {
                        Ok(()) => {
                            self.schedule_retry(&place, retries, Some(fired.timer.time))
                                .await
                        }
                        Err(error) => Err(error),
                    };
                    self.remember(&place, work);
                    return match scheduled {
                        Ok(time) => {
                            warn!(key = %place.key(), ?head, retries, reason = %failure.reason,
                                retry_at = %time, "deferred work failed again: retrying later");
                            Ok(Value::Null)
                        }
                        Err(error) => Err(storage_failure(&error, task.attempt)),
                    };
                }
                Err(HeadFailure { failure, .. }) => {
                    self.remember(&place, work);
                    return Err(failure);
                }
            }
        }
        // Everything retried: the key is no longer deferred, and its timer is done.
        self.remember(&place, work);
        self.timers
            .write_now(
                place.topic(),
                place.partition,
                place.key(),
                &TimerWrite::Unschedule(TimerKind::DeferRetry, fired.timer.time),
            )
            .await
            .map_err(|error| storage_failure(&error, task.attempt))?;
        Ok(Value::Null)
    }

    /// One retry of the head of the key's deferred work through the layers below.
    async fn retry_head(
        &self,
        task: &Task<'_>,
        place: &Place<'_>,
        head: Head,
    ) -> Result<(), HeadFailure> {
        let (event, retries) = match head {
            Head::Message(offset, retries) => {
                match self
                    .loader
                    .load(place.topic(), place.partition, offset)
                    .await
                {
                    Ok(event) => (event, retries),
                    Err(error) => {
                        let kind = if error.is_permanent() {
                            FailureKind::Permanent
                        } else {
                            FailureKind::Transient
                        };
                        return Err(HeadFailure {
                            failure: Failure::new(
                                kind,
                                format!("reloading the deferred message failed: {error}"),
                                task.attempt,
                            ),
                            event: None,
                        });
                    }
                }
            }
            Head::Timer(time, retries) => (
                Event::Timer(FiredTimer {
                    topic: place.topic().clone(),
                    partition: place.partition,
                    kind: TimerKind::Application,
                    timer: Timer {
                        key: place.key().clone(),
                        time,
                    },
                }),
                retries,
            ),
        };
        let retry = Task {
            event: &event,
            started: None,
            // The first attempt failed before the work was deferred.
            attempt: retries.saturating_add(2),
            ..*task
        };
        let verdict = self.inner.call(&retry).await;
        self.status.record(&verdict);
        verdict.map(|_| ()).map_err(|failure| HeadFailure {
            failure,
            event: Some(event),
        })
    }

    async fn remove_head(
        &self,
        place: &Place<'_>,
        work: &mut KeyWork,
        head: Head,
    ) -> Result<(), StorageError> {
        match head {
            Head::Message(offset, _) => {
                self.store
                    .remove_deferred_message(&self.scope(place), place.key(), offset)
                    .await?;
                self.loader.forget(place.topic(), place.partition, offset);
                work.messages.remove(&offset);
            }
            Head::Timer(time, _) => {
                self.store
                    .remove_deferred_timer(&self.scope(place), place.key(), time)
                    .await?;
                work.timers.remove(&time);
            }
        }
        Ok(())
    }

    async fn bump(
        &self,
        place: &Place<'_>,
        work: &mut KeyWork,
        head: Head,
        retries: u32,
    ) -> Result<(), StorageError> {
        match head {
            Head::Message(offset, _) => {
                self.store
                    .defer_message(
                        &self.scope(place),
                        place.key(),
                        DeferredMessage {
                            offset,
                            retry_count: retries,
                        },
                    )
                    .await?;
                work.messages.insert(offset, retries);
            }
            Head::Timer(time, _) => {
                self.store
                    .defer_timer(
                        &self.scope(place),
                        place.key(),
                        DeferredTimer {
                            time,
                            retry_count: retries,
                        },
                    )
                    .await?;
                work.timers.insert(time, retries);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::CancelWatch;
    use crate::kafka::loader::LoadError;
    use crate::middleware::stack::testing::{excise, leak, message, task};
    use crate::timers::TimerSettings;
    use async_trait::async_trait;
    use prosody_api::{SlabSize, SystemClock};
    use serde_json::json;
    use storage_memory::{MemoryDeferStore, MemoryTimerStore};

    /// Records what reaches it; fails transiently while `failing` is set.
    #[derive(Default)]
    struct Inner {
        failing: AtomicBool,
        seen: Mutex<Vec<String>>,
    }

    impl Service for Inner {
        async fn call(&self, task: &Task<'_>) -> Verdict {
            let what = match task.event {
                Event::Message(message) => format!("m{}", message.offset.0),
                Event::Timer(fired) => format!("t{}", fired.timer.time.as_secs()),
                Event::Excise(_) => "x".to_owned(),
                Event::Rejected(_) => "r".to_owned(),
            };
            self.seen.lock().push(what);
            if self.failing.load(Ordering::SeqCst) {
                Err(Failure::new(FailureKind::Transient, "down", task.attempt))
            } else {
                Ok(Value::Null)
            }
        }
    }

    /// Reloads `message("k")` at any offset.
    struct Reloader;

    #[async_trait]
    impl LoadRecord for Reloader {
        async fn load(&self, _: &Topic, _: Partition, offset: Offset) -> Result<Event, LoadError> {
            let Event::Message(mut reloaded) = message("k", json!({})) else {
                unreachable!()
            };
            reloaded.offset = offset;
            Ok(Event::Message(reloaded))
        }

        fn forget(&self, _: &Topic, _: Partition, _: Offset) {}
    }

    struct Fixture {
        layer: Defer<Arc<Inner>>,
        inner: Arc<Inner>,
        store: MemoryDeferStore,
        timers: Timers,
        status: DeferStatus,
    }

    fn fixture() -> Fixture {
        let settings = DeferSettings {
            new_failures: NewFailures::Defer,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(4),
            failure_threshold: 0.9,
            failure_window: Duration::from_secs(60),
            min_samples: 1_000,
            cache_size: 16,
        };
        let store = MemoryDeferStore::new();
        let timers = Timers::new(
            Arc::new(MemoryTimerStore::new(SlabSize::DEFAULT)),
            "group",
            Arc::new(SystemClock),
            TimerSettings::default(),
        );
        let status = DeferStatus::new(&settings);
        let inner = Arc::new(Inner::default());
        let layer = Box::new(DeferLayer {
            settings,
            store: Arc::new(store.clone()),
            timers: timers.clone(),
            loader: Arc::new(Reloader),
            status: status.clone(),
            give_up: Destination::Log,
        })
        .wrap(inner.clone());
        Fixture {
            layer,
            inner,
            store,
            timers,
            status,
        }
    }

    fn at(event: Event, offset: i64) -> Task<'static> {
        let Event::Message(mut message) = event else {
            unreachable!()
        };
        message.offset = Offset(offset);
        task(Event::Message(message))
    }

    fn fired(kind: TimerKind, time: TimerTime) -> Task<'static> {
        task(Event::Timer(FiredTimer {
            topic: Topic::from("t"),
            partition: Partition(0),
            kind,
            timer: Timer {
                key: Key::from("k"),
                time,
            },
        }))
    }

    impl Fixture {
        fn scope(&self) -> PartitionScope {
            self.timers.scope(&Topic::from("t"), Partition(0))
        }

        async fn retry_timers(&self) -> Vec<TimerTime> {
            self.timers
                .store()
                .scheduled(&self.scope(), &Key::from("k"), TimerKind::DeferRetry)
                .await
                .unwrap()
        }

        async fn deferred(&self) -> (Vec<i64>, Vec<u64>) {
            let key = Key::from("k");
            let messages = self.store.deferred_messages(&self.scope(), &key).await;
            let timers = self.store.deferred_timers(&self.scope(), &key).await;
            (
                messages.unwrap().iter().map(|m| m.offset.0).collect(),
                timers.unwrap().iter().map(|t| t.time.as_secs()).collect(),
            )
        }

        fn seen(&self) -> Vec<String> {
            self.inner.seen.lock().clone()
        }
    }

    #[tokio::test]
    async fn a_failure_is_deferred_later_work_queues_behind_and_the_timer_retries_in_order() {
        let f = fixture();
        f.inner.failing.store(true, Ordering::SeqCst);
        assert_eq!(
            f.layer.call(&at(message("k", json!({})), 1)).await,
            Ok(Value::Null)
        );
        let retry = f.retry_timers().await;
        assert_eq!(retry.len(), 1, "one retry timer");
        f.inner.failing.store(false, Ordering::SeqCst);
        assert_eq!(
            f.layer.call(&at(message("k", json!({})), 2)).await,
            Ok(Value::Null)
        );
        let app = TimerTime::from_secs(5);
        assert_eq!(
            f.layer.call(&fired(TimerKind::Application, app)).await,
            Ok(Value::Null)
        );
        assert_eq!(f.seen(), ["m1"], "later work of the key is not handled yet");
        assert_eq!(f.deferred().await, (vec![1, 2], vec![5]));

        // The retry fails once more: the count rises and a later timer replaces the fired one.
        f.inner.failing.store(true, Ordering::SeqCst);
        let first = fired(TimerKind::DeferRetry, retry[0]);
        assert_eq!(f.layer.call(&first).await, Ok(Value::Null));
        let again = f.retry_timers().await;
        assert!(
            again.len() == 1 && again[0] > retry[0],
            "{again:?} after {retry:?}"
        );
        let messages = f.store.deferred_messages(&f.scope(), &Key::from("k")).await;
        assert_eq!(messages.unwrap()[0].retry_count, 1);

        f.inner.failing.store(false, Ordering::SeqCst);
        assert_eq!(
            f.layer.call(&fired(TimerKind::DeferRetry, again[0])).await,
            Ok(Value::Null)
        );
        assert_eq!(f.seen(), ["m1", "m1", "m1", "m2", "t5"], "in order");
        assert_eq!(f.deferred().await, (vec![], vec![]));
        assert!(f.retry_timers().await.is_empty());
        let snapshot = f.status.snapshot();
        assert_eq!((snapshot.deferred, snapshot.completed), (3, 3));
        // The key is no longer deferred: its next message is handled at once.
        assert_eq!(
            f.layer.call(&at(message("k", json!({})), 3)).await,
            Ok(Value::Null)
        );
        assert_eq!(f.seen().last().map(String::as_str), Some("m3"));
    }

    #[tokio::test]
    async fn a_shut_gate_passes_failures_up() {
        let f = fixture();
        // Every outcome so far failed and the window has enough of them.
        let closed = DeferStatus::new(&DeferSettings {
            min_samples: 1,
            ..f_settings()
        });
        closed.record(&Err(Failure::new(FailureKind::Transient, "x", 1)));
        let layer = Box::new(DeferLayer {
            settings: f_settings(),
            store: Arc::new(f.store.clone()),
            timers: f.timers.clone(),
            loader: Arc::new(Reloader),
            status: closed.clone(),
            give_up: Destination::Log,
        })
        .wrap(f.inner.clone());
        f.inner.failing.store(true, Ordering::SeqCst);
        let verdict = layer.call(&at(message("k", json!({})), 1)).await;
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Transient));
        assert_eq!(f.deferred().await, (vec![], vec![]));
        assert!(!closed.snapshot().deferring);
    }

    #[tokio::test]
    async fn with_deferral_off_stored_work_is_still_retried_and_new_failures_pass_up() {
        let f = fixture();
        // An earlier run (deferral on) deferred offset 1; offset 2 queued behind it.
        f.inner.failing.store(true, Ordering::SeqCst);
        f.layer.call(&at(message("k", json!({})), 1)).await.unwrap();
        f.layer.call(&at(message("k", json!({})), 2)).await.unwrap();
        let retry_at = f.retry_timers().await[0];

        // This run has deferEnabled: false, on the same stores.
        let off = DeferSettings {
            new_failures: NewFailures::RetryInPlace,
            ..f_settings()
        };
        let status = DeferStatus::new(&off);
        assert!(!status.snapshot().deferring);
        let layer = Box::new(DeferLayer {
            settings: off,
            store: Arc::new(f.store.clone()),
            timers: f.timers.clone(),
            loader: Arc::new(Reloader),
            status: status.clone(),
            give_up: Destination::Log,
        })
        .wrap(f.inner.clone());
        // A later record of the deferred key still queues behind the stored work.
        assert_eq!(
            layer.call(&at(message("k", json!({})), 3)).await,
            Ok(Value::Null)
        );
        assert_eq!(f.deferred().await, (vec![1, 2, 3], vec![]));
        // The stored retry timer fires: the work is retried, in order, and leaves the store.
        f.inner.failing.store(false, Ordering::SeqCst);
        assert_eq!(
            layer.call(&fired(TimerKind::DeferRetry, retry_at)).await,
            Ok(Value::Null)
        );
        assert_eq!(f.seen(), ["m1", "m1", "m2", "m3"]);
        assert_eq!(f.deferred().await, (vec![], vec![]));
        assert_eq!(status.snapshot().completed, 3);
        // A new failure of a key with nothing stored is not deferred: the retry layer has it.
        f.inner.failing.store(true, Ordering::SeqCst);
        let verdict = layer.call(&at(message("k", json!({})), 4)).await;
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Transient));
        assert_eq!(f.deferred().await, (vec![], vec![]));
        assert_eq!(status.snapshot().switched_off, 0, "not a gate decision");
    }

    /// Counts the reads that reach a memory store.
    #[derive(Debug, Default)]
    struct CountingStore {
        store: MemoryDeferStore,
        key_listings: AtomicU64,
        work_reads: AtomicU64,
    }

    impl CountingStore {
        fn reads(&self) -> (u64, u64) {
            (
                self.key_listings.load(Ordering::SeqCst),
                self.work_reads.load(Ordering::SeqCst),
            )
        }
    }

    #[async_trait]
    impl DeferStore for CountingStore {
        async fn deferred_keys(&self, scope: &PartitionScope) -> Result<Vec<Key>, StorageError> {
            self.key_listings.fetch_add(1, Ordering::SeqCst);
            self.store.deferred_keys(scope).await
        }
        async fn defer_message(
            &self,
            scope: &PartitionScope,
            key: &Key,
            message: DeferredMessage,
        ) -> Result<(), StorageError> {
            self.store.defer_message(scope, key, message).await
        }
        async fn deferred_messages(
            &self,
            scope: &PartitionScope,
            key: &Key,
        ) -> Result<Vec<DeferredMessage>, StorageError> {
            self.work_reads.fetch_add(1, Ordering::SeqCst);
            self.store.deferred_messages(scope, key).await
        }
        async fn remove_deferred_message(
            &self,
            scope: &PartitionScope,
            key: &Key,
            offset: Offset,
        ) -> Result<(), StorageError> {
            self.store.remove_deferred_message(scope, key, offset).await
        }
        async fn clear_deferred_messages(
            &self,
            scope: &PartitionScope,
            key: &Key,
        ) -> Result<(), StorageError> {
            self.store.clear_deferred_messages(scope, key).await
        }
        async fn defer_timer(
            &self,
            scope: &PartitionScope,
            key: &Key,
            timer: DeferredTimer,
        ) -> Result<(), StorageError> {
            self.store.defer_timer(scope, key, timer).await
        }
        async fn deferred_timers(
            &self,
            scope: &PartitionScope,
            key: &Key,
        ) -> Result<Vec<DeferredTimer>, StorageError> {
            self.store.deferred_timers(scope, key).await
        }
        async fn remove_deferred_timer(
            &self,
            scope: &PartitionScope,
            key: &Key,
            time: TimerTime,
        ) -> Result<(), StorageError> {
            self.store.remove_deferred_timer(scope, key, time).await
        }
        async fn clear_deferred_timers(
            &self,
            scope: &PartitionScope,
            key: &Key,
        ) -> Result<(), StorageError> {
            self.store.clear_deferred_timers(scope, key).await
        }
    }

    fn owned_by(event: Event, offset: i64, ownership: &Arc<CancelSignal>) -> Task<'static> {
        Task {
            cancel: leak(CancelWatch::detached(ownership.clone())),
            ..at(event, offset)
        }
    }

    #[tokio::test]
    async fn storage_is_read_once_per_ownership_and_then_only_for_deferred_keys() {
        let f = fixture();
        let store = Arc::new(CountingStore::default());
        // Deferred by an earlier owner: "k" at offset 1.
        let scope = f.scope();
        store
            .defer_message(
                &scope,
                &Key::from("k"),
                DeferredMessage {
                    offset: Offset(1),
                    retry_count: 0,
                },
            )
            .await
            .unwrap();
        let layer = Box::new(DeferLayer {
            settings: DeferSettings {
                cache_size: 1,
                ..f_settings()
            },
            store: store.clone(),
            timers: f.timers.clone(),
            loader: Arc::new(Reloader),
            status: DeferStatus::new(&f_settings()),
            give_up: Destination::Log,
        })
        .wrap(f.inner.clone());
        let ownership = Arc::new(CancelSignal::new());
        for (offset, key) in (2..).zip(["a", "b", "a", "c"]) {
            let verdict = layer
                .call(&owned_by(message(key, json!({})), offset, &ownership))
                .await;
            assert_eq!(verdict, Ok(Value::Null));
        }
        assert_eq!(
            store.reads(),
            (1, 0),
            "keys listed once; no key with nothing deferred is read"
        );
        // The listed key queues behind its stored work, which is read once and then cached.
        for offset in [6, 7] {
            let verdict = layer
                .call(&owned_by(message("k", json!({})), offset, &ownership))
                .await;
            assert_eq!(verdict, Ok(Value::Null));
        }
        assert_eq!(store.reads(), (1, 1));
        let stored = store
            .store
            .deferred_messages(&scope, &Key::from("k"))
            .await
            .unwrap();
        assert_eq!(
            stored.iter().map(|m| m.offset.0).collect::<Vec<_>>(),
            [1, 6, 7]
        );
        // A key deferred during the ownership is known without reading it back; with a cache of
        // one key, "k"'s work makes way for it and is read again when next needed.
        f.inner.failing.store(true, Ordering::SeqCst);
        let verdict = layer
            .call(&owned_by(message("a", json!({})), 8, &ownership))
            .await;
        assert_eq!(verdict, Ok(Value::Null), "deferred");
        f.inner.failing.store(false, Ordering::SeqCst);
        layer
            .call(&owned_by(message("a", json!({})), 9, &ownership))
            .await
            .unwrap();
        layer
            .call(&owned_by(message("k", json!({})), 10, &ownership))
            .await
            .unwrap();
        assert_eq!(store.reads(), (1, 2));
        assert_eq!(
            f.seen(),
            ["m2", "m3", "m4", "m5", "m8"],
            "deferred keys' later work waits"
        );
        // A revocation ends the ownership: the next one lists the keys again.
        ownership.cancel();
        let next = Arc::new(CancelSignal::new());
        layer
            .call(&owned_by(message("b", json!({})), 11, &next))
            .await
            .unwrap();
        assert_eq!(store.reads(), (2, 2));
        // A late event of the revoked assignment, from a partition it never listed, cannot
        // displace the current ownership: the next event of the new one lists nothing again.
        let revoked = Arc::new(CancelSignal::new());
        revoked.cancel();
        layer
            .call(&owned_by(message("b", json!({})), 12, &revoked))
            .await
            .unwrap();
        assert_eq!(store.reads(), (3, 2), "the late event reads for itself");
        layer
            .call(&owned_by(message("b", json!({})), 13, &next))
            .await
            .unwrap();
        assert_eq!(
            store.reads(),
            (3, 2),
            "the current ownership is still the one listed"
        );
    }

    fn f_settings() -> DeferSettings {
        DeferSettings {
            new_failures: NewFailures::Defer,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(4),
            failure_threshold: 0.5,
            failure_window: Duration::from_secs(60),
            min_samples: 1,
            cache_size: 16,
        }
    }

    #[tokio::test]
    async fn an_excise_runs_at_once_and_drops_the_deferred_work() {
        let f = fixture();
        f.inner.failing.store(true, Ordering::SeqCst);
        f.layer.call(&at(message("k", json!({})), 1)).await.unwrap();
        f.layer.call(&at(message("k", json!({})), 2)).await.unwrap();
        f.inner.failing.store(false, Ordering::SeqCst);
        assert_eq!(f.layer.call(&task(excise("k"))).await, Ok(Value::Null));
        assert_eq!(f.seen(), ["m1", "x"]);
        assert_eq!(f.deferred().await, (vec![], vec![]));
        assert!(f.retry_timers().await.is_empty());
        assert_eq!(f.status.snapshot().dropped, 2);
    }

    #[test]
    fn delays_double_from_base_to_the_cap() {
        let settings = DeferSettings {
            new_failures: NewFailures::Defer,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
            failure_threshold: 0.9,
            failure_window: Duration::from_secs(60),
            min_samples: 10,
            cache_size: 16,
        };
        let delays: Vec<u64> = (0..6).map(|n| settings.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(settings.delay(u32::MAX), Duration::from_secs(10));
    }

    /// Deferral switches off past half failures over 10 s, once 4 outcomes are in.
    fn gated_at_half() -> DeferSettings {
        DeferSettings {
            new_failures: NewFailures::Defer,
            base: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
            failure_threshold: 0.5,
            failure_window: Duration::from_secs(10),
            min_samples: 4,
            cache_size: 16,
        }
    }

    #[test]
    fn successes_counted_outside_the_lock_weigh_against_failures() {
        let settings = gated_at_half();
        let status =
            DeferStatus::with_clock(&settings, Arc::new(crate::monotonic::ManualClock::new()));
        for _ in 0..6 {
            status.record(&Ok(Value::Null));
        }
        for _ in 0..4 {
            status.record(&Err(Failure::new(FailureKind::Transient, "x", 1)));
        }
        let snapshot = status.snapshot();
        assert_eq!(snapshot.samples, 10);
        assert!(snapshot.deferring, "4 of 10 failed: {snapshot:?}");
        for _ in 0..3 {
            status.record(&Err(Failure::new(FailureKind::Transient, "x", 1)));
        }
        assert!(!status.is_deferring(), "7 of 13 failed");
    }

    #[test]
    fn the_gate_shuts_over_the_threshold_and_opens_when_the_window_forgets() {
        let settings = gated_at_half();
        let clock = Arc::new(crate::monotonic::ManualClock::new());
        let status = DeferStatus::with_clock(&settings, clock.clone());
        let failed = || Err(Failure::new(FailureKind::Transient, "x", 1));
        for _ in 0..3 {
            status.record(&failed());
        }
        assert!(status.is_deferring(), "too few samples to judge");
        status.record(&failed());
        assert!(!status.is_deferring(), "4 of 4 failed");
        for _ in 0..4 {
            status.record(&Ok(Value::Null));
        }
        assert!(status.is_deferring(), "4 of 8 failed: at the threshold");
        status.record(&Err(Failure::new(FailureKind::Permanent, "p", 1)));
        assert_eq!(
            status.snapshot().samples,
            8,
            "permanent failures are not counted"
        );
        for _ in 0..8 {
            status.record(&failed());
        }
        assert!(!status.is_deferring());
        clock.advance(Duration::from_secs(12));
        let snapshot = status.snapshot();
        assert!(snapshot.deferring, "{snapshot:?}");
        assert_eq!((snapshot.samples, snapshot.switched_off), (0, 2));
        assert_eq!(
            snapshot.transient_failures, 12,
            "the window forgets, the count of transient failures does not"
        );
    }
}
