//! Hot-key protection (pipeline mode): a key whose handlers used more than
//! `monopolizationThreshold` of the last `monopolizationWindowMs` is rejected with a transient
//! failure before its handler runs. The defer layer above then defers it, so the key waits out
//! its retry delay in storage instead of holding a handler slot, and the other keys keep their
//! throughput. While rejected a key accrues no time, so the window slides and it is let in
//! again.
//!
//! Handler time is kept per key in a few buckets over the window (constant memory per key),
//! for at most `monopolizationCacheSize` keys; keys with no time left in the window are
//! forgotten first.
//!
//! Most events never reach a key's account. Run time is read on the tick-resolution clock, so
//! an event shorter than a tick is charged a whole tick or nothing (which averages out to its
//! run time over the key's events), and nothing is nothing to record. And a key can only be
//! over its share if some charge brought it past half of it: such keys are *suspects*,
//! counted as they are charged, and only while there are suspects does an event look its key
//! up before running. Each look-up and charge is a lock and a cache miss in a table every core
//! writes, which for fast handlers was several percent of the consumer's CPU.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use prosody_api::CoarseInstant;
use tracing::warn;

use super::{Failure, FailureKind, Layer, Service, Task, Verdict};
use crate::event::Event;
use crate::hashing::{TagMap, forget_any};
use crate::monotonic::Clock;
use crate::tag_shards::TagShards;

/// Buckets a key's window is divided in.
const BUCKETS: u32 = 10;

/// Limits of the monopolization layer.
#[derive(Clone, Copy, Debug)]
pub struct MonopolizationSettings {
    /// Share of the window, in (0, 1], one key's handlers may use (`monopolizationThreshold`).
    pub threshold: f64,
    /// The rolling window (`monopolizationWindowMs`).
    pub window: Duration,
    /// Keys tracked (`monopolizationCacheSize`).
    pub cache_size: u64,
}

/// One key's handler time per bucket: a ring of `BUCKETS` slots, each tagged with the bucket
/// number it holds, so nothing is allocated per key and stale slots need no pruning pass.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    slots: [(u64, u64); BUCKETS as usize],
    /// The newest bucket charged.
    last: u64,
    /// Counted among the suspects (see the module documentation).
    suspect: bool,
}

impl Usage {
    /// True when time was charged in the window ending in bucket `now`.
    fn charged_within(&self, now: u64) -> bool {
        self.last + u64::from(BUCKETS) > now
    }

    /// Busy nanoseconds in the buckets of the window ending in bucket `now`.
    fn total(&self, now: u64) -> u64 {
        self.slots
            .iter()
            .filter(|(bucket, _)| *bucket + u64::from(BUCKETS) > now && *bucket <= now)
            .map(|(_, busy)| *busy)
            .sum()
    }

    fn add(&mut self, now: u64, busy: u64) {
        self.last = self.last.max(now);
        let slot = &mut self.slots[usize::try_from(now % u64::from(BUCKETS)).unwrap_or(0)];
        if slot.0 == now {
            slot.1 = slot.1.saturating_add(busy);
        } else {
            *slot = (now, busy);
        }
    }
}

/// Counters of the layer, shared with whoever observes them. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct MonopolizationStatus {
    rejected: Arc<AtomicU64>,
}

impl MonopolizationStatus {
    /// Events rejected so far.
    #[must_use]
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}

/// Rejects keys over their share of handler time.
pub struct Monopolization<S> {
    settings: MonopolizationSettings,
    /// Times the handlers; reads the same time as the admission's clock (see [`Task::started`]).
    clock: Arc<dyn Clock>,
    /// Bucket numbers count from here.
    origin: CoarseInstant,
    width: Duration,
    allowed: u64,
    /// Tracked keys past [`Self::suspect_at`] when last charged or looked up. Read by every
    /// event, so it is written only when a key becomes or stops being a suspect.
    suspects: AtomicUsize,
    /// One lock of a shard for lookup and update: a concurrent cache would add its own
    /// synchronisation to every event for nothing. Keyed by a seeded 64-bit hash of (topic, key)
    /// rather than the pair: no clones of the shared topic and key per event and no string
    /// comparisons on lookup. Unlike dedup's, a collision here costs no data: two keys would
    /// share one account, so one might be deferred early, and among the
    /// `monopolizationCacheSize` keys tracked (8,192 by default) the chance of any collision is
    /// about 2 in 10^12.
    usage: TagShards<Usage>,
    hasher: foldhash::fast::RandomState,
    status: MonopolizationStatus,
    inner: S,
}

/// Builds a [`Monopolization`].
pub struct MonopolizationLayer {
    /// Threshold, window and cache size.
    pub settings: MonopolizationSettings,
    /// Counters.
    pub status: MonopolizationStatus,
    /// The clock run time is measured on: the one the admission's grants are timed on
    /// ([`crate::monotonic::SystemClock`], the fair scheduler's), since an attempt's run time
    /// starts at its grant. Tick resolution suffices: a key's use is summed over its events in
    /// a window of seconds, where ticks average out.
    pub clock: Arc<dyn Clock>,
}

impl Layer for MonopolizationLayer {
    type Wrapped<S: Service> = Monopolization<S>;

    fn wrap<S: Service>(self, inner: S) -> Monopolization<S> {
        let settings = self.settings;
        let window = settings.window.max(Duration::from_millis(BUCKETS.into()));
        Monopolization {
            origin: self.clock.now(),
            clock: self.clock,
            width: window / BUCKETS,
            allowed: nanos(window.mul_f64(settings.threshold.clamp(0.0, 1.0))),
            suspects: AtomicUsize::new(0),
            settings: MonopolizationSettings { window, ..settings },
            usage: TagShards::new(usize::try_from(settings.cache_size).unwrap_or(usize::MAX)),
            hasher: foldhash::fast::RandomState::default(),
            status: self.status,
            inner,
        }
    }
}

impl<S: Service> Service for Monopolization<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        if matches!(*task.event, Event::Rejected(_)) {
            return self.inner.call(task).await;
        }
        let (topic, _) = task.event.source();
        let index = self.hasher.hash_one((topic, task.event.key().as_str()));
        // One start serves the window check and the run time.
        let started = task.started.unwrap_or_else(|| self.clock.now());
        let used = if self.suspects.load(Ordering::Acquire) == 0 {
            0
        } else {
            self.used(index, self.bucket(started))
        };
        if used > self.allowed {
            self.status.rejected.fetch_add(1, Ordering::Relaxed);
            let used = Duration::from_nanos(used);
            warn!(key = %task.event.key(), ?used, window = ?self.settings.window,
                "key is monopolizing handler time: rejected");
            return Err(Failure::new(
                FailureKind::Transient,
                format!(
                    "key used {used:?} of the last {:?} of handler time (over the \
                     monopolization threshold)",
                    self.settings.window
                ),
                task.attempt,
            ));
        }
        let verdict = self.inner.call(task).await;
        let ended = self.clock.now();
        let busy = nanos(ended.saturating_duration_since(started));
        if busy > 0 {
            self.charge(index, self.bucket(ended), busy);
        }
        verdict
    }
}

impl<S: Service> Monopolization<S> {
    fn bucket(&self, at: CoarseInstant) -> u64 {
        let width = nanos(self.width).max(1);
        nanos(at.saturating_duration_since(self.origin)) / width
    }

    /// Time in the window past which a key is a suspect: half of what it is allowed.
    fn suspect_at(&self) -> u64 {
        self.allowed / 2
    }

    /// The time of the key indexed `index` in the window ending in bucket `now`; a key no
    /// longer past half its share stops being a suspect.
    fn used(&self, index: u64, now: u64) -> u64 {
        let mut usage = self.usage.lock(index);
        let Some(key) = usage.get_mut(&index) else {
            return 0;
        };
        let used = key.total(now);
        if key.suspect && used <= self.suspect_at() {
            key.suspect = false;
            self.suspects.fetch_sub(1, Ordering::Release);
        }
        used
    }

    fn charge(&self, index: u64, now: u64, busy: u64) {
        let capacity = self.usage.shard_capacity();
        let mut usage = self.usage.lock(index);
        // Room is made before a new key is added, so the key being charged is never the one
        // forgotten.
        if usage.len() >= capacity && !usage.contains_key(&index) {
            let before = suspects_in(&usage);
            // Keys with no time left in the window lose nothing by being forgotten; beyond
            // that, arbitrary ones go. A quarter at a time keeps the cost per event constant.
            usage.retain(|_, key| key.charged_within(now));
            let excess = (usage.len() + 1).saturating_sub(capacity - capacity / 4);
            forget_any(&mut *usage, excess);
            let forgotten = before - suspects_in(&usage);
            if forgotten > 0 {
                self.suspects.fetch_sub(forgotten, Ordering::Release);
            }
        }
        let key = usage.entry(index).or_default();
        key.add(now, busy);
        if !key.suspect && key.total(now) > self.suspect_at() {
            key.suspect = true;
            self.suspects.fetch_add(1, Ordering::Release);
        }
    }
}

/// Suspects among `usage`'s keys (counted only when making room, which is rare).
fn suspects_in(usage: &TagMap<Usage>) -> usize {
    usage.values().filter(|key| key.suspect).count()
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::stack::testing::{message, task};
    use crate::monotonic::TokioClock;
    use serde_json::{Value, json};

    struct Sleeping(Duration);

    impl Service for Sleeping {
        async fn call(&self, _: &Task<'_>) -> Verdict {
            tokio::time::sleep(self.0).await;
            Ok(Value::Null)
        }
    }

    /// Keys may use 5 s of a 10 s window; every attempt runs 2 s (of tokio's paused time, which
    /// `clock` reads).
    fn half_of_ten_seconds(
        status: &MonopolizationStatus,
        clock: Arc<TokioClock>,
    ) -> Monopolization<Arc<Sleeping>> {
        Box::new(MonopolizationLayer {
            settings: MonopolizationSettings {
                threshold: 0.5,
                window: Duration::from_secs(10),
                cache_size: 8,
            },
            status: status.clone(),
            clock,
        })
        .wrap(Arc::new(Sleeping(Duration::from_secs(2))))
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_over_its_share_is_rejected_until_the_window_slides() {
        let status = MonopolizationStatus::default();
        let layer = half_of_ten_seconds(&status, Arc::new(TokioClock::new()));
        let hog = task(message("hog", json!({})));
        for _ in 0..3 {
            assert_eq!(layer.call(&hog).await, Ok(Value::Null));
        }
        let rejected = layer.call(&hog).await.expect_err("6 s of 10 s used");
        assert_eq!(rejected.kind, FailureKind::Transient);
        assert_eq!(
            layer.call(&task(message("other", json!({})))).await,
            Ok(Value::Null),
            "other keys are not affected"
        );
        assert_eq!(status.rejected(), 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(layer.call(&hog).await, Ok(Value::Null), "the window slid");
    }

    #[tokio::test(start_paused = true)]
    async fn run_time_counts_from_the_admission_when_it_is_known() {
        let status = MonopolizationStatus::default();
        let clock = Arc::new(TokioClock::new());
        let layer = half_of_ten_seconds(&status, clock.clone());
        let mut admitted_early = task(message("k", json!({})));
        admitted_early.started = Some(clock.now());
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(layer.call(&admitted_early).await, Ok(Value::Null));
        let rejected = layer
            .call(&task(message("k", json!({}))))
            .await
            .expect_err("6 s of 10 s used: 4 s admitted before the handler ran, 2 s running");
        assert_eq!(rejected.kind, FailureKind::Transient);
        assert_eq!(status.rejected(), 1);
    }

    /// Keys may use 5 s of a 10 s window, 8 keys are tracked, and the handler takes no time.
    fn instant_handler_eight_keys() -> Monopolization<Arc<Sleeping>> {
        Box::new(MonopolizationLayer {
            settings: MonopolizationSettings {
                threshold: 0.5,
                window: Duration::from_secs(10),
                cache_size: 8,
            },
            status: MonopolizationStatus::default(),
            clock: Arc::new(TokioClock::new()),
        })
        .wrap(Arc::new(Sleeping(Duration::ZERO)))
    }

    #[tokio::test(start_paused = true)]
    async fn events_shorter_than_a_tick_leave_no_account() {
        let layer = instant_handler_eight_keys();
        for _ in 0..3 {
            assert_eq!(
                layer.call(&task(message("k", json!({})))).await,
                Ok(Value::Null)
            );
        }
        assert!(layer.usage.is_empty(), "nothing to charge, nothing tracked");
    }

    #[tokio::test(start_paused = true)]
    async fn keys_past_half_their_share_are_suspects_until_they_cool_down() {
        let status = MonopolizationStatus::default();
        let layer = half_of_ten_seconds(&status, Arc::new(TokioClock::new()));
        let suspects = || layer.suspects.load(Ordering::Acquire);
        let hog = task(message("hog", json!({})));
        assert_eq!(layer.call(&hog).await, Ok(Value::Null));
        assert_eq!(suspects(), 0, "2 s of the 5 s allowed: under half");
        assert_eq!(layer.call(&hog).await, Ok(Value::Null));
        assert_eq!(suspects(), 1, "4 s: past half");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(layer.call(&hog).await, Ok(Value::Null), "the window slid");
        assert_eq!(
            suspects(),
            0,
            "looked up with nothing left, charged 2 s anew"
        );
    }

    #[test]
    fn forgotten_suspects_are_no_longer_counted() {
        let layer = instant_handler_eight_keys();
        let three_seconds = nanos(Duration::from_secs(3));
        for index in 0..8 {
            layer.charge(index, 1, three_seconds);
        }
        assert_eq!(layer.suspects.load(Ordering::Acquire), 8);
        layer.charge(8, 100, 5);
        assert_eq!(
            layer.suspects.load(Ordering::Acquire),
            0,
            "the idle suspects were forgotten"
        );
    }

    #[test]
    fn over_capacity_idle_keys_go_first_then_arbitrary_ones_down_to_three_quarters() {
        let layer = instant_handler_eight_keys();
        // Keys 0..4 charged long ago, 4..8 in the current window.
        for index in 0..4 {
            layer.charge(index, 1, 5);
        }
        for index in 4..8 {
            layer.charge(index, 100, 5);
        }
        layer.charge(8, 100, 5);
        let kept: Vec<u64> = {
            let mut kept = layer.usage.tags();
            kept.sort_unstable();
            kept
        };
        assert_eq!(kept, [4, 5, 6, 7, 8], "only the idle keys were forgotten");
        for index in 9..13 {
            layer.charge(index, 100, 5);
        }
        assert_eq!(
            layer.usage.len(),
            6,
            "room made for a ninth busy key: three quarters with it"
        );
        assert!(
            layer.usage.tags().contains(&12),
            "the key just charged is kept"
        );
    }
}
