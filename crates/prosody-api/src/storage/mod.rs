//! Storage traits, one per concern, and the value types they share.
//!
//! | trait | concern | scoped by |
//! |---|---|---|
//! | [`TimerStore`] | durable timers, per key and per time slab | [`PartitionScope`] |
//! | [`DeferStore`] | deferred messages and timers with retry counts | [`PartitionScope`] |
//! | [`DedupStore`] | processed (key, id, version) records with TTL | [`PartitionScope`] |
//! | [`StateStore`] | keyed state: value, map and deque collections | [`StateScope`] |
//! | [`PublishedStateView`] | read-only view of published collections | [`PublishedScope`] |
//!
//! # Why these shapes
//!
//! - **Object safe and async** (`async-trait`): the pipeline holds `Arc<dyn TimerStore>` etc.
//!   and never names a backend.
//! - **Every call carries its scope**, so a backend isolates consumer groups, topics and
//!   partitions by construction instead of by convention in each caller. Timers, deferred work
//!   and dedup records belong to a partition of a group (a partition moves between owners as a
//!   whole); keyed state belongs to a group (or a subsystem, when published) and a collection.
//! - **Writes are idempotent**: every call may be retried after an ambiguous failure (a timeout
//!   after the write landed), so repeating a call must leave the same state.
//! - **Time comes from a [`crate::Clock`]** given to the store, not from the system, so TTL
//!   expiry is testable. A backend with native TTL (Cassandra) must still store the expiry
//!   instant and filter on it, using native TTL only to reclaim space.
//! - **One error type**, [`crate::StorageError`], names the failed operation and its class.
//!
//! Backends prove they honour these contracts by running the conformance suite
//! (feature `conformance`, see the crate docs).

mod dedup;
mod defer;
mod published;
mod state;
mod timer;

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use crate::key::{ConsumerGroup, Partition, Topic};

pub use dedup::{DedupRecord, DedupStore, ImmediateDedupStore, LookupCost};
pub use defer::{DeferStore, DeferredMessage, DeferredTimer};
pub use published::{PublishedScope, PublishedStateView};
pub use state::{
    DequeBounds, ScanDirection, ScanRequest, StateNamespace, StateOp, StateScope, StateStore,
    StateWrite,
};
pub use timer::{StoredTimer, TimerStore};

/// The partition of a consumer group's subscription that a call is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionScope {
    /// The consumer group that owns the data.
    pub group: ConsumerGroup,
    /// The topic of the partition.
    pub topic: Topic,
    /// The partition number.
    pub partition: Partition,
}

impl PartitionScope {
    /// A scope from its parts.
    pub fn new(
        group: impl Into<ConsumerGroup>,
        topic: impl Into<Topic>,
        partition: Partition,
    ) -> Self {
        Self {
            group: group.into(),
            topic: topic.into(),
            partition,
        }
    }
}

/// A time to live in whole seconds (at least one), as the spec's `ttlSeconds` and
/// `idempotenceTtlS` are. An entry written at `t` with TTL `d` is visible while the store's clock
/// reads before `t + d`, and never at or after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(NonZeroU32);

impl Ttl {
    /// A TTL of `secs` seconds.
    #[must_use]
    pub const fn new(secs: NonZeroU32) -> Self {
        Self(secs)
    }

    /// A TTL of `secs` seconds, or `None` for zero.
    #[must_use]
    pub const fn from_secs(secs: u32) -> Option<Self> {
        match NonZeroU32::new(secs) {
            Some(secs) => Some(Self(secs)),
            None => None,
        }
    }

    /// The TTL in seconds.
    #[must_use]
    pub const fn as_secs(self) -> u32 {
        self.0.get()
    }

    /// The TTL as a [`Duration`].
    #[must_use]
    pub fn as_duration(self) -> Duration {
        Duration::from_secs(u64::from(self.0.get()))
    }

    /// When an entry written at `written` expires.
    #[must_use]
    pub fn expires_at(self, written: SystemTime) -> SystemTime {
        written + self.as_duration()
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn ttl_rejects_zero_and_expires_after_its_seconds() {
        assert_eq!(Ttl::from_secs(0), None);
        let ttl = Ttl::from_secs(30).unwrap();
        assert_eq!(
            ttl.expires_at(UNIX_EPOCH),
            UNIX_EPOCH + Duration::from_secs(30)
        );
    }

    #[test]
    fn deque_bounds_length_handles_extremes_and_inversion() {
        assert_eq!(DequeBounds::new(-2, 3).len(), 5);
        assert_eq!(DequeBounds::new(i64::MIN, i64::MAX).len(), u64::MAX);
        assert_eq!(DequeBounds::new(3, 1).len(), 0);
        assert!(DequeBounds::new(4, 4).is_empty());
        assert!(DequeBounds::new(-1, 1).contains(-1));
        assert!(!DequeBounds::new(-1, 1).contains(1));
    }
}
