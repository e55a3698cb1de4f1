//! Admission to run: the global bound on handlers running at once (`maxConcurrency`).
//!
//! The engine's key runners ask an [`Admission`] for a [`Permit`] before taking their next
//! event, naming the key and the [`TaskClass`], so an implementation can choose *which*
//! waiting key runs next (the fair scheduler) rather than only *how many* run. The permit
//! travels with the dispatch in a [`PermitSlot`]: the middleware may give it back while a
//! failed attempt waits for its retry and ask again in the retry class, so a key in backoff
//! does not hold a slot other keys could use.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody_api::{CoarseInstant, Key};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// The two pools of run time the scheduler keeps apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskClass {
    /// A first attempt.
    Normal,
    /// A retry of a failed attempt.
    Retry,
}

/// Grants permits to run one event's attempt. Dropping the future returned by
/// [`acquire`](Admission::acquire) withdraws the request.
#[async_trait]
pub trait Admission: Send + Sync + 'static {
    /// Waits for a permit for `key` in `class`.
    async fn acquire(&self, key: &Key, class: TaskClass) -> Permit;

    /// A permit for `key` in `class` if one can be granted without waiting (a free slot that no
    /// waiting request has a better claim to), else `None`. Callers go through [`admit`], so
    /// the usual uncontended admission costs no boxed future.
    fn try_acquire(&self, key: &Key, class: TaskClass) -> Option<Permit> {
        let _ = (key, class);
        None
    }

    /// Asks for a permit for `key` in `class` without waiting: granted at once, queued with
    /// the permit to arrive on a channel, or (the default, after [`Self::try_acquire`] found
    /// none) left to [`Self::acquire`]. An admission that queues requests itself answers
    /// [`Request::Queued`], so a waiting admission costs one decision and no boxed future.
    /// Dropping the receiver withdraws the request.
    fn request(&self, key: &Key, class: TaskClass) -> Request {
        self.try_acquire(key, class)
            .map_or(Request::Acquire, Request::Granted)
    }

    /// Asks for a permit for `key` in `class` in exchange for `permit`, which a runner held for
    /// the event it just finished and would otherwise give back only to ask again at once:
    /// decided as if `permit` were returned first and then [`Self::request`] made. The default
    /// does exactly that; an admission that can decide both in one step keeps the slot with
    /// the runner when nobody waits for it (the fair scheduler: one lock per event instead of
    /// two).
    fn renew(&self, permit: Permit, key: &Key, class: TaskClass) -> Request {
        drop(permit);
        self.request(key, class)
    }
}

/// What [`Admission::request`] decided.
#[derive(Debug)]
pub enum Request {
    /// A permit, at once.
    Granted(Permit),
    /// The request waits in the admission's queue; the permit arrives here.
    Queued(oneshot::Receiver<Permit>),
    /// Wait in [`Admission::acquire`].
    Acquire,
}

/// A permit for `key` in `class`: at once when one is free, else by waiting as
/// [`Admission::request`] directs.
pub async fn admit<A: Admission + ?Sized>(admission: &A, key: &Key, class: TaskClass) -> Permit {
    settle(admission, admission.request(key, class), key, class).await
}

/// The permit `request` (of `admission`, for `key` in `class`) stands for: at once when
/// granted, else by waiting as it directs.
pub async fn settle<A: Admission + ?Sized>(
    admission: &A,
    request: Request,
    key: &Key,
    class: TaskClass,
) -> Permit {
    match request {
        Request::Granted(permit) => permit,
        Request::Queued(receiver) => match receiver.await {
            Ok(permit) => permit,
            // An admission keeps a queued request's sender until it grants it, and the
            // caller's reference keeps the admission alive.
            Err(_) => std::future::pending().await,
        },
        Request::Acquire => admission.acquire(key, class).await,
    }
}

/// The right to run one attempt. Dropping it gives the slot back.
///
/// The two admissions of this crate release without a boxed value (a permit is taken per
/// event, and an allocation per event showed in profiles): a semaphore permit as it is, and a
/// [`TimedGrant`] that reports its key's run time to the admission that granted it.
pub struct Permit {
    held: Held,
}

/// Each kind is held for its `Drop`; a timed grant also tells when it was granted.
enum Held {
    Semaphore { _permit: OwnedSemaphorePermit },
    Timed { grant: TimedGrant },
    Other { _release: Box<dyn Send + Sync> },
}

impl Permit {
    /// The timed grant it is, else itself back.
    ///
    /// # Errors
    /// The permit itself when it is not a [`TimedGrant`].
    pub fn into_timed_grant(self) -> Result<TimedGrant, Self> {
        match self.held {
            Held::Timed { grant } => Ok(grant),
            held => Err(Self { held }),
        }
    }

    /// A permit that runs `release`'s `Drop` when it is dropped.
    pub fn new(release: impl Send + Sync + 'static) -> Self {
        Self {
            held: Held::Other {
                _release: Box::new(release),
            },
        }
    }

    /// When the admission granted it, on the admission's clock, if the admission records that
    /// (the fair scheduler does, to charge the key's run time).
    #[must_use]
    pub fn granted_at(&self) -> Option<CoarseInstant> {
        match &self.held {
            Held::Timed { grant } => Some(grant.since),
            Held::Semaphore { .. } | Held::Other { .. } => None,
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permit")
    }
}

/// An admission that wants to know how long each granted attempt ran (the fair scheduler
/// charges it to the key).
pub trait ChargeRunTime: Send + Sync + 'static {
    /// Takes back the slot granted in `class` to the key it tagged `tag` (whatever the
    /// admission remembers a key by) at `since`, on the admission's own clock: the run time is
    /// from then to the admission's now. Receives its own `Arc` (the grant's) so it can hand
    /// the slot on as a new grant.
    fn release(self: Arc<Self>, tag: u64, class: TaskClass, since: CoarseInstant);
}

/// A slot granted to a key in a class at a moment; dropping it hands the slot back to the
/// admission that granted it, which charges the time held.
///
/// The moment is at tick resolution ([`CoarseInstant`]): run time is charged per event, and a
/// precise clock read at each end was a measurable share of the consumer's CPU. A key's handlers
/// shorter than a tick are charged a tick or nothing, depending on where the ticks fall, so over
/// its events the charge averages out to the time they ran.
pub struct TimedGrant {
    /// The granting admission, taken by `drop`.
    owner: Option<Arc<dyn ChargeRunTime>>,
    /// The key as the admission tagged it.
    tag: u64,
    class: TaskClass,
    since: CoarseInstant,
}

impl TimedGrant {
    /// A grant by `owner` in `class` to the key it tagged `tag`, at `since` on the owner's
    /// clock.
    #[must_use]
    pub fn new(
        owner: Arc<dyn ChargeRunTime>,
        tag: u64,
        class: TaskClass,
        since: CoarseInstant,
    ) -> Self {
        Self {
            owner: Some(owner),
            tag,
            class,
            since,
        }
    }
}

impl TimedGrant {
    /// True when `owner` granted it.
    #[must_use]
    pub fn granted_by<T: ChargeRunTime>(&self, owner: &Arc<T>) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|granted| std::ptr::addr_eq(Arc::as_ptr(granted), Arc::as_ptr(owner)))
    }

    /// The key's tag, the class and the moment it was granted in, as its owner gave them.
    #[must_use]
    pub fn terms(&self) -> (u64, TaskClass, CoarseInstant) {
        (self.tag, self.class, self.since)
    }

    /// The same slot, granted anew to the key tagged `tag` in `class` at `since`: what its
    /// owner does when it keeps the slot with a runner from one event to the next.
    pub fn regrant(&mut self, tag: u64, class: TaskClass, since: CoarseInstant) {
        self.tag = tag;
        self.class = class;
        self.since = since;
    }

    /// Ends the grant without telling its owner, which took the slot back itself; returns the
    /// owner so the caller drops it where that is safe (not under the owner's lock).
    #[must_use]
    pub fn revoke(mut self) -> Option<Arc<dyn ChargeRunTime>> {
        self.owner.take()
    }
}

impl Drop for TimedGrant {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            owner.release(self.tag, self.class, self.since);
        }
    }
}

impl From<TimedGrant> for Permit {
    fn from(grant: TimedGrant) -> Self {
        Self {
            held: Held::Timed { grant },
        }
    }
}

/// The permit of one dispatch, shared between the engine (which drops it after recording the
/// event's end, so it never counts more running events than permits) and the middleware
/// (which may release it during a retry's backoff). Cheap to clone; clones share the slot.
///
/// Only the dispatch's own task touches a slot, one step at a time, so its lock is never
/// contended; still, each lock and unlock is a locked instruction, and an event used to take
/// the lock four times. What an event asks on every dispatch is answered without it: whether a
/// permit is held (an atomic flag beside the lock), when the runner's permit was granted
/// (copied out when the runner put it in), and the runner's own taking after the dispatch (the
/// only reference left then).
#[derive(Clone, Debug, Default)]
pub struct PermitSlot {
    shared: Arc<SlotState>,
    /// When the permit [`hold`](Self::hold) or [`holding`](Self::holding) put in was granted.
    granted_at: Option<CoarseInstant>,
}

#[derive(Debug, Default)]
struct SlotState {
    permit: Mutex<Option<Permit>>,
    /// Whether `permit` holds one; written under the lock, read without it.
    held: AtomicBool,
}

impl SlotState {
    fn holding(permit: Option<Permit>) -> Self {
        Self {
            held: AtomicBool::new(permit.is_some()),
            permit: Mutex::new(permit),
        }
    }

    fn replace(&self, permit: Option<Permit>) -> Option<Permit> {
        let mut slot = self.permit.lock();
        self.held.store(permit.is_some(), Ordering::Release);
        std::mem::replace(&mut *slot, permit)
    }
}

impl PermitSlot {
    /// A slot holding `permit`.
    #[must_use]
    pub fn holding(permit: Permit) -> Self {
        Self {
            granted_at: permit.granted_at(),
            shared: Arc::new(SlotState::holding(Some(permit))),
        }
    }

    /// Holds `permit` (dropping any permit already held). The slot's allocation is reused when
    /// no clone of it is left, so a runner refilling its slot per event allocates none; a clone
    /// still out there (a dispatch that kept one) gets this slot's old contents to itself.
    pub fn hold(&mut self, permit: Permit) {
        match Arc::get_mut(&mut self.shared) {
            Some(state) => {
                self.granted_at = permit.granted_at();
                *state.held.get_mut() = true;
                let previous = state.permit.get_mut().replace(permit);
                drop(previous);
            }
            None => *self = Self::holding(permit),
        }
    }

    /// Takes the permit out, if the slot holds one.
    #[must_use]
    pub fn take(&self) -> Option<Permit> {
        self.shared.replace(None)
    }

    /// [`take`](Self::take) for the slot's owner: without the lock when no clone is left (the
    /// runner, once its dispatch ended).
    #[must_use]
    pub fn take_owned(&mut self) -> Option<Permit> {
        match Arc::get_mut(&mut self.shared) {
            Some(state) => {
                *state.held.get_mut() = false;
                state.permit.get_mut().take()
            }
            None => self.take(),
        }
    }

    /// Puts `permit` in the slot (dropping any permit already there).
    pub fn put(&self, permit: Permit) {
        drop(self.shared.replace(Some(permit)));
    }

    /// When the permit [`hold`](Self::hold) or [`holding`](Self::holding) put in the slot was
    /// granted, if its admission recorded that ([`Permit::granted_at`]): the dispatch reads it
    /// before anything else can change what the slot holds.
    #[must_use]
    pub fn granted_at(&self) -> Option<CoarseInstant> {
        self.granted_at
    }

    /// True when the slot holds a permit.
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.shared.held.load(Ordering::Acquire)
    }
}

/// First come, first served admission: a plain semaphore of `max_concurrency` permits that
/// ignores keys and classes. The engine's default, and the reference the fair scheduler is
/// measured against.
#[derive(Clone, Debug)]
pub struct SemaphoreAdmission(Arc<Semaphore>);

impl SemaphoreAdmission {
    /// An admission of `max_concurrency` (at least one) permits.
    #[must_use]
    pub fn new(max_concurrency: usize) -> Self {
        Self(Arc::new(Semaphore::new(max_concurrency.max(1))))
    }
}

#[async_trait]
impl Admission for SemaphoreAdmission {
    async fn acquire(&self, _: &Key, _: TaskClass) -> Permit {
        match self.0.clone().acquire_owned().await {
            Ok(permit) => Permit::from(permit),
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    fn try_acquire(&self, _: &Key, _: TaskClass) -> Option<Permit> {
        // Tokio's semaphore hands released permits to queued waiters first, so a free permit
        // here is one no waiter is owed.
        self.0.clone().try_acquire_owned().ok().map(Permit::from)
    }
}

/// Owned semaphore permits release on drop, so they are permits as they are.
impl From<OwnedSemaphorePermit> for Permit {
    fn from(permit: OwnedSemaphorePermit) -> Self {
        Self {
            held: Held::Semaphore { _permit: permit },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An owner that takes grants back and charges nothing.
    struct Uncharged;

    impl ChargeRunTime for Uncharged {
        fn release(self: Arc<Self>, _: u64, _: TaskClass, _: CoarseInstant) {}
    }

    #[tokio::test]
    async fn a_timed_grant_tells_when_it_was_granted_a_semaphore_permit_does_not() {
        let granted = CoarseInstant::now();
        let timed = PermitSlot::holding(Permit::from(TimedGrant::new(
            Arc::new(Uncharged),
            1,
            TaskClass::Normal,
            granted,
        )));
        assert_eq!(timed.granted_at(), Some(granted));
        let semaphore = SemaphoreAdmission::new(1);
        let counted =
            PermitSlot::holding(semaphore.acquire(&Key::from("k"), TaskClass::Normal).await);
        assert_eq!(counted.granted_at(), None);
        assert_eq!(PermitSlot::default().granted_at(), None);
    }

    #[tokio::test]
    async fn semaphore_admission_bounds_and_slot_releases_on_drop() {
        let admission = SemaphoreAdmission::new(1);
        let key = Key::from("k");
        let slot = PermitSlot::holding(admission.acquire(&key, TaskClass::Normal).await);
        assert!(slot.is_held());
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            admission.acquire(&key, TaskClass::Retry),
        )
        .await;
        assert!(blocked.is_err(), "the only permit is in the slot");
        let permit = slot.take().expect("held");
        assert!(!slot.is_held());
        drop(permit);
        let _again = admission.acquire(&key, TaskClass::Retry).await;
    }

    /// A free permit of `admission`, which must have one.
    fn free_permit(admission: &SemaphoreAdmission) -> Permit {
        admission
            .try_acquire(&Key::from("k"), TaskClass::Normal)
            .expect("a free permit")
    }

    #[test]
    fn a_slot_is_refilled_in_place_unless_a_clone_is_out() {
        let admission = SemaphoreAdmission::new(3);
        let permit = || free_permit(&admission);
        let mut slot = PermitSlot::default();
        slot.hold(permit());
        let first = Arc::as_ptr(&slot.shared);
        drop(slot.take());
        slot.hold(permit());
        assert_eq!(Arc::as_ptr(&slot.shared), first, "reused");
        assert_eq!(admission.0.available_permits(), 2, "one held");
        let kept = slot.clone();
        slot.hold(permit());
        assert_ne!(
            Arc::as_ptr(&slot.shared),
            first,
            "a new slot while a clone is out"
        );
        assert!(kept.is_held(), "the clone keeps what it had");
        assert_eq!(admission.0.available_permits(), 1);
        drop(kept.take());
        drop(slot.take());
        assert_eq!(admission.0.available_permits(), 3);
    }

    #[test]
    fn whether_a_slot_holds_a_permit_follows_every_way_in_and_out() {
        let admission = SemaphoreAdmission::new(2);
        let permit = || free_permit(&admission);
        let mut slot = PermitSlot::default();
        assert!(!slot.is_held());
        slot.hold(permit());
        assert!(slot.is_held());
        drop(slot.take());
        assert!(!slot.is_held());
        slot.put(permit());
        assert!(slot.is_held());
        let clone = slot.clone();
        drop(clone.take());
        assert!(!slot.is_held(), "clones share one slot");
        slot.put(permit());
        assert!(clone.is_held());
        drop(clone);
        assert!(slot.take_owned().is_some());
        assert!(!slot.is_held());
        assert!(slot.take_owned().is_none());
        assert_eq!(
            admission.0.available_permits(),
            2,
            "every permit given back"
        );
    }

    #[tokio::test]
    async fn admit_takes_a_free_permit_at_once_and_waits_for_a_taken_one() {
        let admission = SemaphoreAdmission::new(1);
        let key = Key::from("k");
        let first = admission
            .try_acquire(&key, TaskClass::Normal)
            .expect("a free permit");
        assert!(admission.try_acquire(&key, TaskClass::Normal).is_none());
        let waiting = tokio::spawn({
            let admission = admission.clone();
            async move { admit(&admission, &Key::from("k"), TaskClass::Normal).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the only permit is taken");
        drop(first);
        let _second = waiting
            .await
            .expect("admitted once the first permit is dropped");
    }
}
