//! Which partitions this process owns and whether each one is making progress.
//!
//! The consumer is the only writer: it registers a partition when it is assigned, keeps the
//! returned [`PartitionHealth`] handle in the partition's manager and reports work on it. The
//! probe server and the client's `is_stalled()`/`assigned_partition_count()` are readers.
//!
//! Per-record updates go through the handle and touch two atomics only, so reporting progress
//! never contends with a probe request. The registry's map sits behind a read-write lock that is
//! written only on rebalance.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use prosody_api::CoarseInstant;

pub use crate::monotonic::{Clock, ManualClock, SystemClock};

/// Shared view of the partitions this process owns and their progress.
///
/// Cloning is cheap (one `Arc`); every clone sees the same partitions.
#[derive(Clone, Debug)]
pub struct HealthRegistry {
    inner: Arc<RegistryInner>,
}

#[derive(Debug)]
struct RegistryInner {
    clock: Arc<dyn Clock>,
    // Times are stored as nanoseconds since `origin` so they fit in an atomic.
    origin: CoarseInstant,
    // Sorted so probe bodies list partitions in a stable order operators can diff.
    partitions: RwLock<BTreeMap<Arc<str>, BTreeMap<i32, PartitionHealth>>>,
}

impl Default for HealthRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthRegistry {
    /// A registry on the real clock, with no partition assigned.
    #[must_use]
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// A registry that reads time from `clock`.
    #[must_use]
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let origin = clock.now();
        Self {
            inner: Arc::new(RegistryInner {
                clock,
                origin,
                partitions: RwLock::new(BTreeMap::new()),
            }),
        }
    }

    /// The current instant according to the registry's clock.
    #[must_use]
    pub fn now(&self) -> CoarseInstant {
        self.inner.clock.now()
    }

    /// Records that `topic`/`partition` is now owned by this process and returns the handle its
    /// manager reports progress on. A newly assigned partition is idle.
    ///
    /// Assigning a partition that is already assigned returns the existing handle unchanged.
    // Registering is the point of the call; the handle can be looked up again with
    // `partition()`, so ignoring it is not a mistake.
    #[allow(clippy::must_use_candidate)]
    pub fn partition_assigned(&self, topic: &str, partition: i32) -> PartitionHealth {
        if let Some(existing) = self.partition(topic, partition) {
            return existing;
        }
        let mut partitions = self.inner.partitions.write();
        // One allocation of the topic name shared by the map key and all its partitions.
        let topic: Arc<str> = partitions
            .get_key_value(topic)
            .map_or_else(|| Arc::from(topic), |(name, _)| Arc::clone(name));
        partitions
            .entry(Arc::clone(&topic))
            .or_default()
            .entry(partition)
            .or_insert_with(|| PartitionHealth {
                state: Arc::new(PartitionState {
                    topic,
                    partition,
                    clock: Arc::clone(&self.inner.clock),
                    origin: self.inner.origin,
                    pending: AtomicBool::new(false),
                    last_progress_nanos: AtomicU64::new(0),
                }),
            })
            .clone()
    }

    /// Records that `topic`/`partition` is no longer owned. Handles to it stay usable but are no
    /// longer looked at, so a late report from a draining manager cannot mark the process stalled.
    pub fn partition_revoked(&self, topic: &str, partition: i32) {
        let mut partitions = self.inner.partitions.write();
        if let Some(by_partition) = partitions.get_mut(topic) {
            by_partition.remove(&partition);
            if by_partition.is_empty() {
                partitions.remove(topic);
            }
        }
    }

    /// Forgets every partition (e.g. on unsubscribe).
    pub fn clear(&self) {
        self.inner.partitions.write().clear();
    }

    /// The handle of an assigned partition.
    #[must_use]
    pub fn partition(&self, topic: &str, partition: i32) -> Option<PartitionHealth> {
        self.inner
            .partitions
            .read()
            .get(topic)
            .and_then(|by_partition| by_partition.get(&partition))
            .cloned()
    }

    /// How many partitions are assigned to this process.
    #[must_use]
    pub fn assigned_partition_count(&self) -> usize {
        self.inner
            .partitions
            .read()
            .values()
            .map(BTreeMap::len)
            .sum()
    }

    /// Whether at least one partition is assigned (what `/readyz` reports).
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.inner
            .partitions
            .read()
            .values()
            .any(|by_partition| !by_partition.is_empty())
    }

    /// Whether any assigned partition has pending work and made no progress for `threshold` as
    /// of `now`.
    #[must_use]
    pub fn is_stalled(&self, threshold: Duration, now: CoarseInstant) -> bool {
        self.inner
            .partitions
            .read()
            .values()
            .flat_map(BTreeMap::values)
            .any(|p| p.is_stalled(threshold, now))
    }

    /// The assigned partitions that are stalled as of `now`, in topic/partition order.
    #[must_use]
    pub fn stalled_partitions(
        &self,
        threshold: Duration,
        now: CoarseInstant,
    ) -> Vec<PartitionStatus> {
        self.snapshot(threshold, now)
            .into_iter()
            .filter(|status| status.stalled)
            .collect()
    }

    /// The state of every assigned partition as of `now`, in topic/partition order.
    #[must_use]
    pub fn snapshot(&self, threshold: Duration, now: CoarseInstant) -> Vec<PartitionStatus> {
        self.inner
            .partitions
            .read()
            .values()
            .flat_map(BTreeMap::values)
            .map(|p| p.status(threshold, now))
            .collect()
    }
}

/// The progress handle of one assigned partition; the partition's manager reports on it.
///
/// Cloning is cheap; every method is a couple of atomic operations.
#[derive(Clone, Debug)]
pub struct PartitionHealth {
    state: Arc<PartitionState>,
}

#[derive(Debug)]
struct PartitionState {
    topic: Arc<str>,
    partition: i32,
    clock: Arc<dyn Clock>,
    origin: CoarseInstant,
    pending: AtomicBool,
    last_progress_nanos: AtomicU64,
}

impl PartitionHealth {
    /// The partition's topic.
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.state.topic
    }

    /// The partition's number.
    #[must_use]
    pub fn partition(&self) -> i32 {
        self.state.partition
    }

    /// The partition has work queued or running. If it was idle, the stall clock starts now:
    /// time spent idle is not time without progress.
    pub fn work_pending(&self) {
        if !self.state.pending.load(Ordering::Acquire) {
            self.state
                .last_progress_nanos
                .fetch_max(self.now_nanos(), Ordering::AcqRel);
            // Published after the timestamp so a reader never pairs "pending" with the time of
            // an old progress and reports a stall that is not there.
            self.state.pending.store(true, Ordering::Release);
        }
    }

    /// Some work of the partition finished (a record or timer was handled, an offset advanced).
    pub fn progress(&self) {
        self.state
            .last_progress_nanos
            .fetch_max(self.now_nanos(), Ordering::AcqRel);
    }

    /// The partition has nothing queued or running; an idle partition is never stalled.
    pub fn idle(&self) {
        self.state.pending.store(false, Ordering::Release);
    }

    /// Whether work is queued or running.
    #[must_use]
    pub fn has_pending_work(&self) -> bool {
        self.state.pending.load(Ordering::Acquire)
    }

    /// When the partition last made progress (or became busy after being idle); the assignment
    /// time of the registry's clock origin if it never did.
    #[must_use]
    pub fn last_progress(&self) -> CoarseInstant {
        self.state.origin
            + Duration::from_nanos(self.state.last_progress_nanos.load(Ordering::Acquire))
    }

    /// Whether the partition has pending work and made no progress for `threshold` as of `now`.
    #[must_use]
    pub fn is_stalled(&self, threshold: Duration, now: CoarseInstant) -> bool {
        self.has_pending_work() && now.saturating_duration_since(self.last_progress()) >= threshold
    }

    /// The partition's state as of `now`.
    #[must_use]
    pub fn status(&self, threshold: Duration, now: CoarseInstant) -> PartitionStatus {
        let pending = self.has_pending_work();
        let since_progress = now.saturating_duration_since(self.last_progress());
        PartitionStatus {
            topic: Arc::clone(&self.state.topic),
            partition: self.state.partition,
            has_pending_work: pending,
            since_progress,
            stalled: pending && since_progress >= threshold,
        }
    }

    fn now_nanos(&self) -> u64 {
        duration_nanos(
            self.state
                .clock
                .now()
                .saturating_duration_since(self.state.origin),
        )
    }
}

/// A point-in-time view of one partition, for probe bodies and diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionStatus {
    /// The partition's topic.
    pub topic: Arc<str>,
    /// The partition's number.
    pub partition: i32,
    /// Whether work is queued or running.
    pub has_pending_work: bool,
    /// Time since the last progress (or since the partition became busy).
    pub since_progress: Duration,
    /// Whether the partition has pending work and made no progress for the threshold.
    pub stalled: bool,
}

fn duration_nanos(duration: Duration) -> u64 {
    // 2^64 ns is 584 years: saturating is only a guard against absurd test inputs.
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLD: Duration = Duration::from_secs(60);

    fn registry() -> (HealthRegistry, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new());
        (HealthRegistry::with_clock(clock.clone()), clock)
    }

    #[test]
    fn counts_assigned_partitions() {
        let (registry, _) = registry();
        assert_eq!(registry.assigned_partition_count(), 0);
        assert!(!registry.is_ready());

        registry.partition_assigned("a", 0);
        registry.partition_assigned("a", 1);
        registry.partition_assigned("b", 0);
        assert_eq!(registry.assigned_partition_count(), 3);
        assert!(registry.is_ready());

        registry.partition_revoked("a", 0);
        registry.partition_revoked("b", 0);
        assert_eq!(registry.assigned_partition_count(), 1);
        registry.partition_revoked("a", 1);
        assert_eq!(registry.assigned_partition_count(), 0);
        assert!(!registry.is_ready());
    }

    #[test]
    fn assigning_twice_keeps_one_partition_and_its_state() {
        let (registry, _) = registry();
        let first = registry.partition_assigned("a", 0);
        first.work_pending();
        let second = registry.partition_assigned("a", 0);
        assert_eq!(registry.assigned_partition_count(), 1);
        assert!(second.has_pending_work());
    }

    #[test]
    fn revoking_an_unknown_partition_is_a_no_op() {
        let (registry, _) = registry();
        registry.partition_assigned("a", 0);
        registry.partition_revoked("a", 7);
        registry.partition_revoked("zzz", 0);
        assert_eq!(registry.assigned_partition_count(), 1);
    }

    #[test]
    fn idle_partition_is_never_stalled() {
        let (registry, clock) = registry();
        let p = registry.partition_assigned("a", 0);
        clock.advance(THRESHOLD * 10);
        assert!(!p.is_stalled(THRESHOLD, registry.now()));
        assert!(!registry.is_stalled(THRESHOLD, registry.now()));
    }

    #[test]
    fn busy_partition_without_progress_stalls_at_the_threshold() {
        let (registry, clock) = registry();
        let p = registry.partition_assigned("a", 0);
        p.work_pending();
        clock.advance(THRESHOLD.saturating_sub(Duration::from_millis(1)));
        assert!(!registry.is_stalled(THRESHOLD, registry.now()));
        clock.advance(Duration::from_millis(1));
        assert!(registry.is_stalled(THRESHOLD, registry.now()));
        let stalled = registry.stalled_partitions(THRESHOLD, registry.now());
        assert_eq!(stalled.len(), 1);
        assert_eq!((&*stalled[0].topic, stalled[0].partition), ("a", 0));
        assert_eq!(stalled[0].since_progress, THRESHOLD);
    }

    #[test]
    fn progress_resets_the_stall_clock() {
        let (registry, clock) = registry();
        let p = registry.partition_assigned("a", 0);
        p.work_pending();
        clock.advance(THRESHOLD * 2);
        assert!(registry.is_stalled(THRESHOLD, registry.now()));
        p.progress();
        assert!(!registry.is_stalled(THRESHOLD, registry.now()));
        clock.advance(THRESHOLD / 2);
        assert!(!registry.is_stalled(THRESHOLD, registry.now()));
        clock.advance(THRESHOLD / 2);
        assert!(registry.is_stalled(THRESHOLD, registry.now()));
    }

    #[test]
    fn time_spent_idle_does_not_count_once_work_arrives() {
        let (registry, clock) = registry();
        let p = registry.partition_assigned("a", 0);
        clock.advance(THRESHOLD * 5);
        p.work_pending();
        assert!(!p.is_stalled(THRESHOLD, registry.now()));
        // More work while already busy must not restart the clock.
        clock.advance(THRESHOLD / 2);
        p.work_pending();
        clock.advance(THRESHOLD / 2);
        assert!(p.is_stalled(THRESHOLD, registry.now()));
    }

    #[test]
    fn going_idle_clears_a_stall() {
        let (registry, clock) = registry();
        let p = registry.partition_assigned("a", 0);
        p.work_pending();
        clock.advance(THRESHOLD * 2);
        assert!(registry.is_stalled(THRESHOLD, registry.now()));
        p.idle();
        assert!(!registry.is_stalled(THRESHOLD, registry.now()));
    }

    #[test]
    fn revoked_stalled_partition_no_longer_counts() {
        let (registry, clock) = registry();
        let p = registry.partition_assigned("a", 0);
        p.work_pending();
        clock.advance(THRESHOLD * 2);
        registry.partition_revoked("a", 0);
        assert!(!registry.is_stalled(THRESHOLD, registry.now()));
        // A late report on the old handle stays invisible.
        p.work_pending();
        assert!(!registry.is_stalled(THRESHOLD, registry.now()));
        // Reassignment starts from a fresh, idle state.
        let again = registry.partition_assigned("a", 0);
        assert!(!again.has_pending_work());
    }

    #[test]
    fn one_stalled_partition_among_healthy_ones_is_reported_alone() {
        let (registry, clock) = registry();
        let stuck = registry.partition_assigned("b", 3);
        let healthy = registry.partition_assigned("a", 1);
        registry.partition_assigned("a", 0);
        stuck.work_pending();
        healthy.work_pending();
        clock.advance(THRESHOLD);
        healthy.progress();
        let snapshot = registry.snapshot(THRESHOLD, registry.now());
        let ids: Vec<_> = snapshot
            .iter()
            .map(|s| (s.topic.to_string(), s.partition, s.stalled))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("a".to_owned(), 0, false),
                ("a".to_owned(), 1, false),
                ("b".to_owned(), 3, true),
            ]
        );
    }

    #[test]
    fn clear_forgets_everything() {
        let (registry, _) = registry();
        registry.partition_assigned("a", 0);
        registry.partition_assigned("b", 1);
        registry.clear();
        assert_eq!(registry.assigned_partition_count(), 0);
    }

    #[test]
    fn clones_share_state() {
        let (registry, _) = registry();
        let other = registry.clone();
        registry.partition_assigned("a", 0);
        assert_eq!(other.assigned_partition_count(), 1);
    }

    #[test]
    fn stale_now_is_not_stalled() {
        // A `now` older than the last progress (read before a concurrent update) must not
        // underflow into a huge duration.
        let (registry, clock) = registry();
        let p = registry.partition_assigned("a", 0);
        let before = registry.now();
        clock.advance(THRESHOLD * 2);
        p.work_pending();
        assert!(!p.is_stalled(THRESHOLD, before));
    }

    #[test]
    fn handles_are_updated_from_many_threads() {
        let registry = HealthRegistry::new();
        let p = registry.partition_assigned("a", 0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let p = p.clone();
                scope.spawn(move || {
                    for _ in 0..1000 {
                        p.work_pending();
                        p.progress();
                    }
                });
            }
        });
        assert!(p.has_pending_work());
        assert!(!registry.is_stalled(Duration::from_secs(60), registry.now()));
    }
}
