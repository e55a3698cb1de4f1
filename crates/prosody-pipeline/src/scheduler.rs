//! The fair scheduler: which waiting key runs next when a handler slot frees up.
//!
//! It enforces `maxConcurrency` like a semaphore, but instead of first come, first served:
//!
//! - Each key accrues *virtual time* equal to the run time of its attempts; among waiting keys
//!   the one with the least runs first, so a slow key cannot crowd out many fast ones.
//! - Normal work and retries are two classes with separate virtual-time pools. When both have
//!   waiters, the class whose run time divided by its weight is smaller goes first, which
//!   holds retries to `failure_weight` of the run time while normal work waits (and lets them
//!   use all of it when nothing else waits).
//! - A waiting task gets a priority boost growing with the square of its wait, reaching
//!   `wait_weight` seconds of virtual time at `max_wait`; a task that has waited `max_wait`
//!   runs before any task that has not. The boost alone cannot bound the wait when virtual
//!   times differ by more than `wait_weight`; the rule can, as long as slots free up at all.
//! - At most `cache_size` keys' virtual times are remembered; a forgotten or new key starts at
//!   its class's current virtual time (the latest granted), so it neither jumps the queue with
//!   a zero nor pays for work it did long ago. Keys are remembered by a seeded 64-bit hash
//!   (their tag), hashed once per grant outside the lock: a lookup under the lock is then one
//!   probe with no string to compare, and no key is cloned into the grant. Two keys sharing a
//!   tag would share a virtual time, a slight unfairness at odds of about 1 in 10^11 among
//!   the keys remembered.
//!
//! Run time is measured on the tick-resolution clock (see [`TimedGrant`]): two precise reads
//! per event were a measurable share of the consumer's CPU, and a key's virtual time is the sum
//! over its events, where ticks average out.
//!
//! The waiters are the keys the engine's runners serve: up to `maxConcurrency` per partition.
//! A partition with more active keys than that queues the rest first come, first served until
//! a runner takes them (see `consumer::partition`), so every active key of a partition gets a
//! turn within a bounded number of others' events, and this scheduler chooses among keys that
//! are all ready to run.
//!
//! Choosing among waiters considers two candidates per class, the least virtual time and the
//! longest wait: the boost only grows with the wait, so the longest waiter is the one it can
//! lift furthest. The waiters are kept in arrival order in a ring and by virtual time in a
//! heap, so each grant is O(log n) and, once they have grown, neither allocates: a granted
//! waiter leaves a hole in the ring and a stale heap entry, dropped when they reach the front
//! or when holes outnumber waiters. (Two B-trees did the same with an allocation or a free on
//! most operations; under contention every event queues, so this is the scheduler's hot path.)

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::{CoarseInstant, Key};
use tokio::sync::oneshot;

use crate::consumer::{Admission, ChargeRunTime, Permit, Request, TaskClass, TimedGrant, admit};
use crate::hashing::{TagMap, forget_any};
use crate::monotonic::{Clock, SystemClock};

/// The scheduler's settings (FEATURES.md section 2).
#[derive(Clone, Debug)]
pub struct SchedulerSettings {
    /// Handlers running at once (at least 1).
    pub max_concurrency: usize,
    /// Share of run time for retries while normal work waits, in (0, 1).
    pub failure_weight: f64,
    /// Wait at which the boost peaks and a task goes first.
    pub max_wait: Duration,
    /// The peak boost, in seconds of virtual time.
    pub wait_weight: f64,
    /// Keys whose virtual time is remembered.
    pub cache_size: u64,
}

/// Virtual time in nanoseconds of run time.
type Vt = u64;

struct Waiter {
    tag: u64,
    vt: Vt,
    /// Arrival order over both classes (the tie-break between two overdue waiters).
    arrival: u64,
    /// When it queued, on the scheduler's clock: the one run times are charged on, precise to a
    /// tick (a few milliseconds) against a `max_wait` of seconds, and a reading cheaper than the
    /// precise clock's, which was read twice per queued request.
    since: CoarseInstant,
    grant: oneshot::Sender<Permit>,
}

/// The waiters of one class. A waiter is named by its *position*, its place in this queue's
/// arrival order.
#[derive(Default)]
struct Queue {
    /// Waiters by arrival, the longest waiting first; `None` where one was granted. The
    /// front is always a waiter.
    by_arrival: VecDeque<Option<Waiter>>,
    /// The position of the front of `by_arrival`.
    front: u64,
    /// The waiters in `by_arrival`.
    waiting: usize,
    /// (virtual time, position) of the waiters, the least first; entries of granted waiters
    /// are stale until they reach the top, and the top is always a waiter.
    by_vt: BinaryHeap<Reverse<(Vt, u64)>>,
}

/// Holes and stale entries tolerated beyond twice the waiters before they are swept.
const SLACK: usize = 64;

impl Queue {
    fn is_empty(&self) -> bool {
        self.waiting == 0
    }

    fn len(&self) -> usize {
        self.waiting
    }

    fn push(&mut self, waiter: Waiter) {
        let position = self.front + self.by_arrival.len() as u64;
        self.by_vt.push(Reverse((waiter.vt, position)));
        self.by_arrival.push_back(Some(waiter));
        self.waiting += 1;
    }

    /// Where `position` is in `by_arrival`, if it is still there.
    fn index(&self, position: u64) -> Option<usize> {
        usize::try_from(position.checked_sub(self.front)?).ok()
    }

    fn get(&self, position: u64) -> Option<&Waiter> {
        self.by_arrival.get(self.index(position)?)?.as_ref()
    }

    /// The longest waiting and its position.
    fn oldest(&self) -> Option<(u64, &Waiter)> {
        Some((self.front, self.by_arrival.front()?.as_ref()?))
    }

    /// The position of the waiter with the least virtual time (the earliest among equals).
    fn lightest(&self) -> Option<u64> {
        self.by_vt.peek().map(|Reverse((_, position))| *position)
    }

    fn remove(&mut self, position: u64) -> Option<Waiter> {
        let index = self.index(position)?;
        let waiter = self.by_arrival.get_mut(index)?.take()?;
        self.waiting -= 1;
        self.settle();
        Some(waiter)
    }

    /// Restores the invariants after a removal: both fronts are waiters, and holes and stale
    /// entries stay within [`SLACK`] of twice the waiters. A waiter long at the front (a heavy
    /// key waiting out `max_wait`) would otherwise keep every hole behind it.
    fn settle(&mut self) {
        while matches!(self.by_arrival.front(), Some(None)) {
            self.by_arrival.pop_front();
            self.front += 1;
        }
        let limit = 2 * self.waiting + SLACK;
        if self.by_arrival.len() > limit || self.by_vt.len() > limit {
            // Renumbered from the front: positions only live under the lock.
            self.by_arrival.retain(Option::is_some);
            let front = self.front;
            self.by_vt = self
                .by_arrival
                .iter()
                .zip(front..)
                .filter_map(|(waiter, position)| {
                    waiter.as_ref().map(|waiter| Reverse((waiter.vt, position)))
                })
                .collect();
        }
        while let Some(position) = self.lightest()
            && self.get(position).is_none()
        {
            self.by_vt.pop();
        }
    }
}

/// The waiter of a queue to run next.
#[derive(Clone, Copy)]
struct Candidate {
    position: u64,
    arrival: u64,
    overdue: bool,
}

struct State {
    free: usize,
    arrivals: u64,
    queues: [Queue; 2],
    /// Per class: run time divided by the class weight, in nanoseconds.
    class_time: [f64; 2],
    /// Per class: the virtual time of the key granted last, where newcomers start.
    floor: [Vt; 2],
    /// Per class: the virtual time of each remembered key, by tag. Kept under the same lock as
    /// the queues (a concurrent cache would add its own synchronisation to every grant).
    keys: [TagMap<Vt>; 2],
}

impl State {
    /// Takes a slot when one is free and nobody waits for it (a waiter, however its virtual
    /// time compares, was there first).
    fn take_free_slot(&mut self) -> bool {
        let free = self.free > 0 && self.queues.iter().all(Queue::is_empty);
        if free {
            self.free -= 1;
        }
        free
    }

    /// The virtual time the key tagged `tag` waits with in `class`: its own, or the floor if
    /// that is higher (a key that ran little long ago must not jump ahead of keys that kept
    /// running).
    fn vt(&self, class: usize, tag: u64) -> Vt {
        let floor = self.floor[class];
        self.keys[class]
            .get(&tag)
            .map_or(floor, |vt| (*vt).max(floor))
    }

    /// Adds `ran` to the virtual time of the key tagged `tag`, forgetting keys beyond
    /// `capacity`.
    fn charge(&mut self, class: usize, tag: u64, ran: Vt, capacity: usize) {
        let floor = self.floor[class];
        let keys = &mut self.keys[class];
        if let Some(vt) = keys.get_mut(&tag) {
            *vt = (*vt).max(floor).saturating_add(ran);
            return;
        }
        keys.insert(tag, floor.saturating_add(ran));
        if keys.len() > capacity {
            // Keys at or below the floor lose nothing by being forgotten (they would start at
            // the floor anyway); beyond that, arbitrary ones go. Evicting a quarter at a time
            // keeps the cost per charge constant.
            keys.retain(|_, vt| *vt > floor);
            if keys.len() > capacity {
                let excess = keys.len().saturating_sub(capacity - capacity / 4);
                forget_any(keys, excess);
            }
        }
    }
}

struct Shared {
    settings: SchedulerSettings,
    /// Times grants, to charge their run time.
    clock: Arc<dyn Clock>,
    /// Tags keys (see the module documentation).
    tagger: foldhash::fast::RandomState,
    weights: [f64; 2],
    state: Mutex<State>,
    /// The waiters of both queues, as of the last change under the lock: read without it by a
    /// renewal that has nothing to charge (see [`Admission::renew`]).
    waiting: AtomicUsize,
}

/// The fair scheduler. Cheap to clone; clones share one pool of slots.
#[derive(Clone)]
pub struct FairScheduler {
    shared: Arc<Shared>,
}

/// The classes by their [`index`].
const CLASSES: [TaskClass; 2] = [TaskClass::Normal, TaskClass::Retry];

fn index(class: TaskClass) -> usize {
    match class {
        TaskClass::Normal => 0,
        TaskClass::Retry => 1,
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl FairScheduler {
    /// A scheduler with `settings`, timing grants on the tick-resolution clock.
    #[must_use]
    pub fn new(settings: SchedulerSettings) -> Self {
        Self::with_clock(settings, Arc::new(SystemClock))
    }

    /// A scheduler with `settings`, timing grants on `clock` (what the permits it grants tell
    /// as [`Permit::granted_at`]).
    #[must_use]
    pub fn with_clock(settings: SchedulerSettings, clock: Arc<dyn Clock>) -> Self {
        let failure_weight = settings.failure_weight.clamp(0.01, 0.99);
        Self {
            shared: Arc::new(Shared {
                clock,
                weights: [1.0 - failure_weight, failure_weight],
                state: Mutex::new(State {
                    free: settings.max_concurrency.max(1),
                    arrivals: 0,
                    queues: [Queue::default(), Queue::default()],
                    class_time: [0.0; 2],
                    floor: [0; 2],
                    keys: [TagMap::default(), TagMap::default()],
                }),
                tagger: foldhash::fast::RandomState::default(),
                waiting: AtomicUsize::new(0),
                settings,
            }),
        }
    }

    /// Slots free right now (for tests and metrics).
    #[must_use]
    pub fn free(&self) -> usize {
        self.shared.state.lock().free
    }

    /// Tasks waiting right now.
    #[must_use]
    pub fn waiting(&self) -> usize {
        let state = self.shared.state.lock();
        state.queues.iter().map(Queue::len).sum()
    }
}

/// Returns the slot and charges the run time to the key.
impl ChargeRunTime for Shared {
    fn release(self: Arc<Self>, tag: u64, class: TaskClass, since: CoarseInstant) {
        let ran = self.clock.now().saturating_duration_since(since);
        let unwanted = {
            let mut state = self.state.lock();
            self.charge(&mut state, tag, index(class), ran);
            state.free += 1;
            self.grant(&mut state)
        };
        // Dropped unlocked: each returns its slot through this same code.
        drop(unwanted);
    }
}

impl Shared {
    fn tag(&self, key: &Key) -> u64 {
        self.tagger.hash_one(key.as_str())
    }

    /// Charges `ran` to the key tagged `tag` and to `class`. Nothing is nothing to charge: a
    /// key's virtual time is read as at least the floor whether or not it is remembered, so
    /// remembering it at the floor changes no decision.
    fn charge(&self, state: &mut State, tag: u64, class: usize, ran: Duration) {
        if ran.is_zero() {
            return;
        }
        let capacity = usize::try_from(self.settings.cache_size)
            .unwrap_or(usize::MAX)
            .max(1);
        state.charge(class, tag, nanos(ran), capacity);
        #[allow(
            clippy::cast_precision_loss,
            reason = "run times are far below 2^52 ns"
        )]
        let weighted = nanos(ran) as f64 / self.weights[class];
        state.class_time[class] += weighted;
    }

    /// Queues a request of the key tagged `tag` in `class` and hands free slots on. Returns
    /// where its permit arrives, and the permits of waiters that gave up meanwhile (see
    /// [`Self::grant`]).
    fn enqueue(
        self: &Arc<Self>,
        state: &mut State,
        tag: u64,
        class: usize,
    ) -> (oneshot::Receiver<Permit>, Vec<Permit>) {
        let vt = state.vt(class, tag);
        let (grant, receiver) = oneshot::channel();
        state.arrivals += 1;
        let arrival = state.arrivals;
        if state.queues[class].is_empty() && !state.queues[1 - class].is_empty() {
            // See `grant`: a class that starts waiting again starts level with the other.
            state.class_time[class] = state.class_time[class].max(state.class_time[1 - class]);
        }
        state.queues[class].push(Waiter {
            tag,
            vt,
            arrival,
            since: self.clock.now(),
            grant,
        });
        (receiver, self.grant(state))
    }

    /// Publishes how many wait: [`Self::grant`] does, which follows every change of the queues.
    fn publish_waiting(&self, state: &State) {
        let waiting = state.queues.iter().map(Queue::len).sum();
        self.waiting.store(waiting, Ordering::Release);
    }

    fn permit(self: &Arc<Self>, tag: u64, class: usize) -> Permit {
        self.permit_at(tag, class, self.clock.now())
    }

    /// A permit granted at `now` (a clock reading the caller already has).
    fn permit_at(self: &Arc<Self>, tag: u64, class: usize, now: CoarseInstant) -> Permit {
        let owner: Arc<dyn ChargeRunTime> = self.clone();
        Permit::from(TimedGrant::new(owner, tag, CLASSES[class], now))
    }

    /// The priority of a waiter: lower runs first.
    fn score(&self, waiter: &Waiter, now: CoarseInstant) -> f64 {
        let max_wait = self.settings.max_wait.as_secs_f64().max(f64::EPSILON);
        let ratio = (now.saturating_duration_since(waiter.since).as_secs_f64() / max_wait).min(1.0);
        #[allow(
            clippy::cast_precision_loss,
            reason = "virtual times are far below 2^52 ns"
        )]
        let vt = waiter.vt as f64 / 1e9;
        vt - self.settings.wait_weight * ratio * ratio
    }

    /// The waiter of `queue` to run next.
    fn candidate(&self, queue: &Queue, now: CoarseInstant) -> Option<Candidate> {
        let (oldest, waiter) = queue.oldest()?;
        if now.saturating_duration_since(waiter.since) >= self.settings.max_wait {
            return Some(Candidate {
                position: oldest,
                arrival: waiter.arrival,
                overdue: true,
            });
        }
        let (position, waiter) = match queue
            .lightest()
            .and_then(|least| Some((least, queue.get(least)?)))
        {
            Some((least, lightest)) if self.score(lightest, now) <= self.score(waiter, now) => {
                (least, lightest)
            }
            _ => (oldest, waiter),
        };
        Some(Candidate {
            position,
            arrival: waiter.arrival,
            overdue: false,
        })
    }

    /// Hands free slots to waiters. Returns the permits of waiters that gave up meanwhile,
    /// for the caller to drop once it released the lock.
    #[must_use]
    fn grant(self: &Arc<Self>, state: &mut State) -> Vec<Permit> {
        let mut unwanted = Vec::new();
        // Checked before reading the clock: a slot freed while nobody waits (the common case)
        // costs no clock read.
        while state.free > 0 && !state.queues.iter().all(Queue::is_empty) {
            let now = self.clock.now();
            let normal = self.candidate(&state.queues[0], now);
            let retry = self.candidate(&state.queues[1], now);
            let class = match (normal, retry) {
                (None, None) => break,
                (Some(_), None) => 0,
                (None, Some(_)) => 1,
                (Some(normal), Some(retry)) => {
                    if normal.overdue || retry.overdue {
                        // Overdue goes first; between two overdue ones, the earlier arrival.
                        usize::from(
                            !normal.overdue || (retry.overdue && retry.arrival < normal.arrival),
                        )
                    } else {
                        usize::from(state.class_time[1] < state.class_time[0])
                    }
                }
            };
            let Some(chosen) = (if class == 0 { normal } else { retry }) else {
                break;
            };
            let Some(waiter) = state.queues[class].remove(chosen.position) else {
                break;
            };
            state.free -= 1;
            state.floor[class] = state.floor[class].max(waiter.vt);
            if let Err(permit) = waiter.grant.send(self.permit_at(waiter.tag, class, now)) {
                // The waiter gave up (its future was dropped). Its permit's drop returns the
                // slot, but it locks the state, so it must wait until the caller unlocked.
                unwanted.push(permit);
                continue;
            }
            if state.queues[class].is_empty() && !state.queues[1 - class].is_empty() {
                // No banking of idle time: a class that stops waiting cannot later claim the
                // share it did not use.
                state.class_time[class] = state.class_time[class].max(state.class_time[1 - class]);
            }
        }
        self.publish_waiting(state);
        unwanted
    }
}

#[async_trait]
impl Admission for FairScheduler {
    async fn acquire(&self, key: &Key, class: TaskClass) -> Permit {
        admit(self, key, class).await
    }

    fn try_acquire(&self, key: &Key, class: TaskClass) -> Option<Permit> {
        let taken = self.shared.state.lock().take_free_slot();
        taken.then(|| self.shared.permit(self.shared.tag(key), index(class)))
    }

    fn request(&self, key: &Key, class: TaskClass) -> Request {
        let class = index(class);
        let shared = &self.shared;
        let tag = shared.tag(key);
        let (receiver, unwanted) = {
            let mut state = shared.state.lock();
            if state.take_free_slot() {
                return Request::Granted(shared.permit(tag, class));
            }
            shared.enqueue(&mut state, tag, class)
        };
        drop(unwanted);
        Request::Queued(receiver)
    }

    /// Charges the finished event's run time and, when nobody waits, keeps the slot with the
    /// runner for its next event, under one lock: the same decision as a release followed by
    /// a request, which took the lock twice per event and had every grant take (and every
    /// release drop) a share of the scheduler, a reference count every core wrote per event.
    fn renew(&self, permit: Permit, key: &Key, class: TaskClass) -> Request {
        let shared = &self.shared;
        let mut grant = match permit.into_timed_grant() {
            Ok(grant) if grant.granted_by(shared) => grant,
            // Not one of this scheduler's: given back as it is, then asked for anew.
            other => {
                drop(other);
                return self.request(key, class);
            }
        };
        let (held_tag, held_class, since) = grant.terms();
        let now = shared.clock.now();
        let tag = shared.tag(key);
        let ran = now.saturating_duration_since(since);
        if ran.is_zero() && shared.waiting.load(Ordering::Acquire) == 0 {
            // Nothing to charge and nobody to hand the slot to: keeping it changes no state,
            // so it needs no lock. A request queueing meanwhile finds the slot taken, as it
            // would had this renewal locked first.
            grant.regrant(tag, class, now);
            return Request::Granted(Permit::from(grant));
        }
        let (receiver, unwanted, owner) = {
            let mut state = shared.state.lock();
            shared.charge(&mut state, held_tag, index(held_class), ran);
            if state.queues.iter().all(Queue::is_empty) {
                drop(state);
                grant.regrant(tag, class, now);
                return Request::Granted(Permit::from(grant));
            }
            // Others wait: the slot goes back and to them first (they were there first, as for
            // any request), then this request queues.
            let owner = grant.revoke();
            state.free += 1;
            let mut unwanted = shared.grant(&mut state);
            let (receiver, more) = shared.enqueue(&mut state, tag, index(class));
            unwanted.extend(more);
            (receiver, unwanted, owner)
        };
        drop((unwanted, owner));
        Request::Queued(receiver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monotonic::TokioClock;

    /// Run time on tokio's clock, so the paused tests charge the time they sleep through.
    fn on_tokio_time(settings: SchedulerSettings) -> FairScheduler {
        FairScheduler::with_clock(settings, Arc::new(TokioClock::new()))
    }

    fn scheduler(max_concurrency: usize) -> FairScheduler {
        on_tokio_time(SchedulerSettings {
            max_concurrency,
            failure_weight: 0.3,
            max_wait: Duration::from_secs(120),
            wait_weight: 200.0,
            cache_size: 1_000,
        })
    }

    /// A task waiting for a permit of `key`, queued by the time this returns.
    async fn queued_waiter(
        scheduler: &FairScheduler,
        key: &str,
    ) -> tokio::task::JoinHandle<Permit> {
        let waiting = tokio::spawn({
            let scheduler = scheduler.clone();
            let key = Key::from(key);
            async move { scheduler.acquire(&key, TaskClass::Normal).await }
        });
        tokio::task::yield_now().await;
        waiting
    }

    async fn hold(permit: Permit, run: Duration) {
        tokio::time::sleep(run).await;
        drop(permit);
    }

    fn waiter(vt: Vt, arrival: u64) -> Waiter {
        let (grant, _) = oneshot::channel();
        Waiter {
            tag: arrival,
            vt,
            arrival,
            since: CoarseInstant::now(),
            grant,
        }
    }

    #[test]
    fn the_queue_orders_by_virtual_time_then_arrival() {
        let mut queue = Queue::default();
        for (arrival, vt) in (0..).zip([5, 3, 3, 9]) {
            queue.push(waiter(vt, arrival));
        }
        let mut order = Vec::new();
        let mut oldest = Vec::new();
        while let Some(least) = queue.lightest() {
            oldest.extend(queue.oldest().map(|(_, waiter)| waiter.arrival));
            order.push(queue.remove(least).expect("a waiter").arrival);
        }
        assert_eq!(order, [1, 2, 0, 3]);
        assert_eq!(oldest, [0, 0, 0, 3], "the longest waiting, holes skipped");
        assert!(queue.is_empty());
    }

    #[test]
    fn holes_behind_a_long_waiter_are_swept() {
        let mut queue = Queue::default();
        queue.push(waiter(Vt::MAX, 0));
        for arrival in 1..10_000 {
            queue.push(waiter(arrival, arrival));
            let least = queue.lightest().expect("a waiter");
            assert_eq!(queue.remove(least).expect("a waiter").arrival, arrival);
            assert_eq!(queue.oldest().map(|(_, w)| w.arrival), Some(0));
            assert!(queue.by_arrival.len() <= 2 * queue.len() + SLACK);
            assert!(queue.by_vt.len() <= 2 * queue.len() + SLACK + 1);
        }
        let least = queue.lightest().expect("the long waiter");
        assert_eq!(queue.remove(least).map(|w| w.arrival), Some(0));
        assert!(queue.is_empty() && queue.by_arrival.is_empty() && queue.by_vt.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn try_acquire_takes_only_a_slot_nobody_waits_for() {
        let scheduler = scheduler(1);
        let first = scheduler
            .try_acquire(&Key::from("a"), TaskClass::Normal)
            .expect("a free slot");
        assert!(
            scheduler
                .try_acquire(&Key::from("b"), TaskClass::Normal)
                .is_none()
        );
        let waiting = queued_waiter(&scheduler, "c").await;
        assert_eq!(scheduler.waiting(), 1);
        drop(first);
        // The freed slot went to the waiter, not to a request that came later.
        assert!(
            scheduler
                .try_acquire(&Key::from("d"), TaskClass::Normal)
                .is_none()
        );
        drop(waiting.await.expect("granted"));
        assert!(
            scheduler
                .try_acquire(&Key::from("d"), TaskClass::Normal)
                .is_some()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bounds_concurrency_and_hands_slots_back() {
        let scheduler = scheduler(2);
        let a = scheduler.acquire(&Key::from("a"), TaskClass::Normal).await;
        let _b = scheduler.acquire(&Key::from("b"), TaskClass::Normal).await;
        assert_eq!(scheduler.free(), 0);
        let waiting = queued_waiter(&scheduler, "c").await;
        assert_eq!(scheduler.waiting(), 1);
        drop(a);
        let _c = waiting.await.expect("granted");
        assert_eq!((scheduler.free(), scheduler.waiting()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewed_slot_stays_with_its_runner_while_nobody_waits_and_charges_the_event() {
        let scheduler = scheduler(1);
        let heavy = Key::from("heavy");
        let permit = scheduler.acquire(&heavy, TaskClass::Normal).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let Request::Granted(renewed) =
            scheduler.renew(permit, &Key::from("next"), TaskClass::Normal)
        else {
            panic!("nobody waits: renewed at once");
        };
        assert_eq!((scheduler.free(), scheduler.waiting()), (0, 0));
        let charged = {
            let shared = &scheduler.shared;
            shared.state.lock().vt(0, shared.tag(&heavy))
        };
        assert!(
            charged >= nanos(Duration::from_secs(5)),
            "the finished event's run time was charged: {charged} ns"
        );
        drop(renewed);
        assert_eq!(scheduler.free(), 1, "the renewed permit returns the slot");
    }

    #[tokio::test(start_paused = true)]
    async fn events_that_took_no_time_are_not_remembered() {
        let scheduler = scheduler(1);
        let permit = scheduler.acquire(&Key::from("a"), TaskClass::Normal).await;
        let Request::Granted(renewed) = scheduler.renew(permit, &Key::from("b"), TaskClass::Normal)
        else {
            panic!("nobody waits: renewed at once");
        };
        drop(renewed);
        let state = scheduler.shared.state.lock();
        assert!(
            state.keys.iter().all(TagMap::is_empty),
            "nothing charged, nothing remembered"
        );
        assert_eq!(state.free, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_yields_the_slot_to_requests_already_waiting() {
        let scheduler = scheduler(1);
        let permit = scheduler.acquire(&Key::from("a"), TaskClass::Normal).await;
        let waiting = queued_waiter(&scheduler, "b").await;
        assert_eq!(scheduler.waiting(), 1);
        let Request::Queued(renewal) = scheduler.renew(permit, &Key::from("a"), TaskClass::Normal)
        else {
            panic!("a waiter was there first: the renewal queues");
        };
        let b = waiting.await.expect("granted");
        assert_eq!((scheduler.free(), scheduler.waiting()), (0, 1));
        drop(b);
        let _a = renewal.await.expect("granted once b is done");
        assert_eq!((scheduler.free(), scheduler.waiting()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_of_another_admission_is_given_back_and_asked_for_anew() {
        let scheduler = scheduler(1);
        let Request::Granted(_held) =
            scheduler.renew(Permit::new(()), &Key::from("a"), TaskClass::Normal)
        else {
            panic!("a free slot");
        };
        assert_eq!(scheduler.free(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_request_does_not_leak_its_slot() {
        let scheduler = scheduler(1);
        let held = scheduler.acquire(&Key::from("a"), TaskClass::Normal).await;
        let gave_up = tokio::time::timeout(
            Duration::from_millis(10),
            scheduler.acquire(&Key::from("b"), TaskClass::Normal),
        )
        .await;
        assert!(gave_up.is_err());
        drop(held);
        assert_eq!(
            scheduler.free(),
            1,
            "the abandoned waiter did not keep the slot"
        );
        let _again = scheduler.acquire(&Key::from("c"), TaskClass::Normal).await;
    }

    /// Runs `key` once for `run`, then queues it and a key that never ran, and returns which
    /// runs first.
    #[tokio::test(start_paused = true)]
    async fn the_key_with_less_run_time_goes_first() {
        let scheduler = scheduler(1);
        let heavy = Key::from("heavy");
        hold(
            scheduler.acquire(&heavy, TaskClass::Normal).await,
            Duration::from_secs(5),
        )
        .await;
        let light = Key::from("light");
        hold(
            scheduler.acquire(&light, TaskClass::Normal).await,
            Duration::from_millis(10),
        )
        .await;
        let gate = scheduler
            .acquire(&Key::from("gate"), TaskClass::Normal)
            .await;
        let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        for key in [heavy.clone(), light.clone()] {
            let scheduler = scheduler.clone();
            let order_tx = order_tx.clone();
            tokio::spawn(async move {
                let permit = scheduler.acquire(&key, TaskClass::Normal).await;
                order_tx.send(key).expect("open");
                drop(permit);
            });
            tokio::task::yield_now().await;
        }
        drop(gate);
        assert_eq!(order.recv().await, Some(light), "arrived second, ran less");
        assert_eq!(order.recv().await, Some(heavy));
    }

    /// Saturates the scheduler with both classes and counts run time per class.
    #[tokio::test(start_paused = true)]
    async fn retries_get_their_weight_of_run_time_under_contention() {
        let scheduler = scheduler(2);
        let run = Duration::from_millis(10);
        let mut workers = Vec::new();
        let ran = Arc::new(Mutex::new([Duration::ZERO; 2]));
        for worker in 0..8 {
            let class = if worker % 2 == 0 {
                TaskClass::Normal
            } else {
                TaskClass::Retry
            };
            let scheduler = scheduler.clone();
            let ran = ran.clone();
            workers.push(tokio::spawn(async move {
                let key = Key::from(format!("k{worker}"));
                loop {
                    let permit = scheduler.acquire(&key, class).await;
                    tokio::time::sleep(run).await;
                    drop(permit);
                    ran.lock()[index(class)] += run;
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        for worker in workers {
            worker.abort();
        }
        let [normal, retry] = *ran.lock();
        let share = retry.as_secs_f64() / (normal + retry).as_secs_f64();
        assert!((0.27..=0.33).contains(&share), "retry share {share}");
    }

    #[tokio::test(start_paused = true)]
    async fn remembers_at_most_cache_size_keys() {
        let scheduler = on_tokio_time(SchedulerSettings {
            max_concurrency: 1,
            failure_weight: 0.3,
            max_wait: Duration::from_secs(1),
            wait_weight: 1.0,
            cache_size: 10,
        });
        for index in 0..100 {
            let key = Key::from(format!("k{index}"));
            hold(
                scheduler.acquire(&key, TaskClass::Normal).await,
                Duration::from_millis(1),
            )
            .await;
            assert!(scheduler.shared.state.lock().keys[0].len() <= 10);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_use_every_slot_when_nothing_else_waits() {
        let scheduler = scheduler(2);
        let _a = scheduler.acquire(&Key::from("a"), TaskClass::Retry).await;
        let _b = scheduler.acquire(&Key::from("b"), TaskClass::Retry).await;
        assert_eq!(scheduler.free(), 0);
    }

    /// A key with a huge virtual time competes with a stream of fresh keys; it still runs
    /// within `max_wait` (plus the run in progress when the wait expired).
    #[tokio::test(start_paused = true)]
    async fn a_waiting_task_is_not_starved_beyond_max_wait() {
        let max_wait = Duration::from_secs(2);
        let scheduler = on_tokio_time(SchedulerSettings {
            max_concurrency: 1,
            failure_weight: 0.3,
            max_wait,
            wait_weight: 0.001,
            cache_size: 10_000,
        });
        let heavy = Key::from("heavy");
        hold(
            scheduler.acquire(&heavy, TaskClass::Normal).await,
            Duration::from_secs(600),
        )
        .await;
        let run = Duration::from_millis(50);
        // Fresh keys keep arriving, always with less virtual time than `heavy`.
        let competitors = tokio::spawn({
            let scheduler = scheduler.clone();
            async move {
                let mut fresh = 0_u64;
                loop {
                    for _ in 0..4 {
                        fresh += 1;
                        let scheduler = scheduler.clone();
                        let key = Key::from(format!("fresh{fresh}"));
                        tokio::spawn(async move {
                            hold(scheduler.acquire(&key, TaskClass::Normal).await, run).await;
                        });
                    }
                    tokio::time::sleep(run).await;
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = tokio::time::Instant::now();
        let _permit = scheduler.acquire(&heavy, TaskClass::Normal).await;
        let waited = started.elapsed();
        competitors.abort();
        assert!(
            waited >= Duration::from_millis(500) && waited <= max_wait + run,
            "waited {waited:?}: behind fresh keys, but not past max_wait"
        );
    }
}
