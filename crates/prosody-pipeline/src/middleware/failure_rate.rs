//! The transient-failure rate over a rolling window, which the defer layer's gate judges by.
//!
//! The window is kept in buckets, so memory stays constant. Most outcomes are successes,
//! recorded from every core. While the newest bucket is open, a success is one atomic add
//! outside the lock, to a counter of the recording thread's own ([`crate::thread_shard`], each
//! on a cache line of its own). With a lock per outcome, or one shared counter, a cache line moved
//! between the cores handling messages on every outcome, and the line also held what every
//! outcome reads (when the newest bucket closes). The lock-free successes are folded into the
//! newest bucket whenever the lock is taken. A success that races with the bucket's end lands
//! in the next bucket, which is within the rate's resolution.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use prosody_api::CoarseInstant;

use crate::monotonic::Clock;
use crate::thread_shard::{self, SHARDS};

/// Buckets the window is divided in.
const BUCKETS: u32 = 10;

/// Outcomes over a rolling window.
#[derive(Debug)]
pub(super) struct FailureRate {
    clock: Arc<dyn Clock>,
    /// What `open_until` counts from.
    origin: CoarseInstant,
    window: Mutex<Window>,
    /// Successes counted outside the lock, not yet in the newest bucket, per shard.
    unfolded: [CachePadded<AtomicU64>; SHARDS],
    /// When the newest bucket ends, in nanoseconds since `origin`; zero when there is none.
    /// Read by every outcome, written when a bucket opens: on a line the counters do not share.
    open_until: CachePadded<AtomicU64>,
}

#[derive(Debug)]
struct Window {
    length: Duration,
    width: Duration,
    buckets: VecDeque<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    start: CoarseInstant,
    successes: u64,
    failures: u64,
}

impl FailureRate {
    /// An empty rate over `window` (at least a millisecond per bucket), judged by `clock`.
    pub(super) fn new(window: Duration, clock: Arc<dyn Clock>) -> Self {
        let length = window.max(Duration::from_millis(BUCKETS.into()));
        let origin = clock.now();
        Self {
            clock,
            origin,
            window: Mutex::new(Window {
                length,
                width: length / BUCKETS,
                buckets: VecDeque::new(),
            }),
            unfolded: Default::default(),
            open_until: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// Counts a success without the lock if the newest bucket is open; false when the caller
    /// must take the lock and [`Locked::record`] it.
    pub(super) fn try_count_success(&self) -> bool {
        if self.since_origin(self.clock.now()) >= self.open_until.load(Ordering::Acquire) {
            return false;
        }
        self.unfolded[thread_shard::index()].fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The window, with every success counted outside the lock folded in.
    pub(super) fn lock(&self) -> Locked<'_> {
        let mut window = self.window.lock();
        let unfolded: u64 = self
            .unfolded
            .iter()
            .map(|count| count.swap(0, Ordering::AcqRel))
            .sum();
        // They were counted while the newest bucket was open, so they belong to it. If it
        // has left the window since, so have they.
        if let Some(newest) = window.buckets.back_mut() {
            newest.successes += unfolded;
        }
        Locked { rate: self, window }
    }

    fn since_origin(&self, at: CoarseInstant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The window under its lock.
pub(super) struct Locked<'a> {
    rate: &'a FailureRate,
    window: MutexGuard<'a, Window>,
}

impl Locked<'_> {
    /// Records one outcome now.
    pub(super) fn record(&mut self, failed: bool) {
        let now = self.rate.clock.now();
        let window = &mut *self.window;
        window.prune(now);
        let width = window.width;
        let current = match window.buckets.back_mut() {
            Some(bucket) if now < bucket.start + width => bucket,
            _ => {
                window.buckets.push_back(Bucket {
                    start: now,
                    successes: 0,
                    failures: 0,
                });
                window
                    .buckets
                    .back_mut()
                    .unwrap_or_else(|| unreachable!("just pushed"))
            }
        };
        if failed {
            current.failures += 1;
        } else {
            current.successes += 1;
        }
        let open_until = self.rate.since_origin(current.start + width);
        self.rate.open_until.store(open_until, Ordering::Release);
    }

    /// (failure rate, outcomes) in the window now.
    pub(super) fn rate(&mut self) -> (f64, u64) {
        self.window.prune(self.rate.clock.now());
        let (successes, failures) = self
            .window
            .buckets
            .iter()
            .fold((0_u64, 0_u64), |(s, f), bucket| {
                (s + bucket.successes, f + bucket.failures)
            });
        let total = successes + failures;
        if total == 0 {
            return (0.0, 0);
        }
        #[allow(
            clippy::cast_precision_loss,
            reason = "a rate: counts far below 2^52 in any window"
        )]
        let rate = failures as f64 / total as f64;
        (rate, total)
    }
}

impl Window {
    fn prune(&mut self, now: CoarseInstant) {
        while let Some(front) = self.buckets.front() {
            if front.start + self.width + self.length <= now {
                self.buckets.pop_front();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monotonic::ManualClock;

    fn rate(window: Duration) -> (FailureRate, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new());
        (FailureRate::new(window, clock.clone()), clock)
    }

    #[test]
    fn successes_outside_the_lock_count_once_the_newest_bucket_is_open() {
        let (rate, clock) = rate(Duration::from_secs(10));
        assert!(!rate.try_count_success(), "no bucket is open yet");
        rate.lock().record(false);
        for _ in 0..5 {
            assert!(rate.try_count_success());
        }
        assert_eq!(rate.lock().rate(), (0.0, 6));
        clock.advance(Duration::from_secs(1));
        assert!(!rate.try_count_success(), "the newest bucket has ended");
        rate.lock().record(true);
        assert!(rate.try_count_success(), "a new bucket is open");
        let (failure_rate, samples) = rate.lock().rate();
        assert_eq!(samples, 8);
        assert!((failure_rate - 1.0 / 8.0).abs() < f64::EPSILON);
    }

    #[test]
    fn successes_counted_on_many_threads_are_all_folded_in() {
        let (rate, _clock) = rate(Duration::from_secs(10));
        rate.lock().record(false);
        // More threads than shards, so some share one.
        std::thread::scope(|scope| {
            for _ in 0..(SHARDS + 3) {
                scope.spawn(|| {
                    for _ in 0..1_000 {
                        assert!(rate.try_count_success());
                    }
                });
            }
        });
        let counted = u64::try_from((SHARDS + 3) * 1_000).unwrap() + 1;
        assert_eq!(rate.lock().rate(), (0.0, counted));
        assert_eq!(rate.lock().rate(), (0.0, counted), "folded once");
    }

    #[test]
    fn the_window_forgets_successes_counted_outside_the_lock() {
        let (rate, clock) = rate(Duration::from_secs(10));
        rate.lock().record(false);
        assert!(rate.try_count_success());
        clock.advance(Duration::from_secs(12));
        assert_eq!(rate.lock().rate(), (0.0, 0));
        rate.lock().record(true);
        assert_eq!(
            rate.lock().rate(),
            (1.0, 1),
            "none of the old successes is folded in"
        );
    }
}
