//! [`MemoryDedupStore`].
//!
//! Records are kept per partition scope as their 128-bit fingerprints rather than their
//! strings: a consumer inserts one record per handled message, so the strings would cost
//! allocations per insert and lookup and a few hundred bytes per record held. The fingerprint
//! comes with the record ([`DedupRecord::fingerprint`], a keyed digest computed once per
//! message), so a lookup here hashes no string; a collision (which would skip a message) is
//! vanishingly unlikely, the same argument as the pipeline's recent set.
//!
//! A call finds its scope's records through the calling thread's own cache (see [`Shared`]) and
//! locks one shard of them, a [`FingerprintTable`] whose lookup readies the line its insert
//! writes: on two cores, a lookup and an insert per record from two threads sharing the store
//! took 72-80 ns per record where a lock around the scopes took 200 and hashbrown tables 91, and
//! two threads with a store each 63-65 (`cargo bench -p storage-memory --bench dedup_store`). With
//! a record in one 16-byte slot instead of a fingerprint and an expiry in two arrays, one thread
//! takes 77-96 ns against 87-111 on a later day, two threads sharing the store 40-47 against
//! 43-49.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use async_trait::async_trait;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use prosody_api::storage::{
    DedupRecord, DedupStore, ImmediateDedupStore, LookupCost, PartitionScope, Ttl,
};
use prosody_api::{Clock, StorageError};

use crate::fingerprints::FingerprintTable;
use crate::sweep::SweepSchedule;

/// Independently locked parts of a scope's records. A consumer inserts a record per handled
/// message from every runtime worker at once, and an insert into a large table waits on cache
/// misses while it holds its lock: behind one lock the workers queued for each other (measured
/// on two cores: the store's lock the most contended in the consumer, about a tenth of its CPU in
/// the store). Records are spread over the shards by their fingerprints, which are keyed digests,
/// so the shards fill evenly and two workers rarely meet in one.
const SHARDS: usize = 16;

/// Every scope's records, and when to sweep them all next.
#[derive(Debug)]
struct Scopes {
    records: HashMap<PartitionScope, Arc<ScopeRecords>, foldhash::fast::RandomState>,
    /// A scope sweeps its own shards as they grow, but one no longer inserted into (its
    /// partition moved to another consumer) would keep its records: when a scope is added and
    /// the store has doubled since the last time, every scope is swept.
    sweep: SweepSchedule,
}

/// Dedup records in memory, expiring on the given clock.
#[derive(Clone, Debug)]
pub struct MemoryDedupStore {
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
}

/// What the handles of one store share.
///
/// Every lookup and insert finds its scope's records. Behind one lock (or in a map inside each
/// shard), that meant a line every insert wrote (the lock, or the scope table's header in the
/// map's bucket) and every lookup read, which the two cores passed back and forth with nearly
/// every record. So each thread keeps the scopes it used (see [`RECENT`]); the map and its lock
/// are only for a scope the thread has not used yet. A scope's records are never replaced or
/// dropped while the store lives (an empty scope costs its empty shards, and scopes are bounded
/// by the groups, topics and partitions the process consumes), so what a thread kept stays valid
/// without asking anyone.
#[derive(Debug)]
struct Shared {
    /// Tells this store's entries in the threads' caches apart from other stores'.
    id: u64,
    scopes: Mutex<Scopes>,
}

/// The threads' caches may outlive the store: its records go with it, only the empty shards of
/// the scopes they kept wait to be evicted.
impl Drop for Shared {
    fn drop(&mut self) {
        for records in self.scopes.get_mut().records.values() {
            for shard in &records.shards {
                shard.lock().records = FingerprintTable::default();
            }
        }
    }
}

/// Numbers the stores of the process.
static STORES: AtomicU64 = AtomicU64::new(0);

/// Scopes a thread keeps: more than the partitions a worker usually handles at once.
const RECENT_SCOPES: usize = 64;
const _: () = assert!(RECENT_SCOPES.is_power_of_two(), "slots are chosen by bits");

/// A scope a thread used: (store id, scope, its records).
type RecentScope = (u64, PartitionScope, Arc<ScopeRecords>);

thread_local! {
    /// The scopes this thread used, each in the slot [`recent_slot`] gives it (a later scope of
    /// the same slot replaces it).
    static RECENT: RefCell<[Option<RecentScope>; RECENT_SCOPES]> =
        const { RefCell::new([const { None }; RECENT_SCOPES]) };
}

/// The slot of `scope` of store `id` in a thread's [`RECENT`]: the partition and where the
/// (interned) names live, mixed; no hashing of the names per record.
fn recent_slot(id: u64, scope: &PartitionScope) -> usize {
    let names =
        scope.group.as_str().as_ptr().addr() ^ scope.topic.as_str().as_ptr().addr().rotate_left(17);
    let mixed = (u64::try_from(names).unwrap_or_default()
        ^ id.rotate_left(32)
        ^ u64::from(scope.partition.0.cast_unsigned()))
    .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The product's top bits depend on all of its input's.
    usize::try_from(mixed >> (u64::BITS - RECENT_SCOPES.trailing_zeros())).unwrap_or_default()
}

/// One scope's records, in shards.
#[derive(Debug)]
struct ScopeRecords {
    shards: [CachePadded<Mutex<Shard>>; SHARDS],
}

/// The records whose fingerprints select this shard of a scope: the table's header shares the
/// lock's cache line, so an insert moves one line between the cores, not two.
#[derive(Debug)]
struct Shard {
    /// Expiry per record fingerprint.
    records: FingerprintTable,
    sweep: SweepSchedule,
}

impl Shard {
    fn new() -> Self {
        Self {
            records: FingerprintTable::default(),
            // Each shard holds a share of the records, so it is worth sweeping at that share.
            sweep: SweepSchedule::with_minimum(SweepSchedule::MINIMUM / SHARDS),
        }
    }

    fn sweep(&mut self, now: SystemTime) {
        self.records.remove_expired(now);
        self.sweep.swept(self.records.len());
    }
}

impl ScopeRecords {
    fn new() -> Self {
        Self {
            shards: std::array::from_fn(|_| CachePadded::new(Mutex::new(Shard::new()))),
        }
    }

    /// The shard of a record: low bits of its fingerprint's upper half. The table places a
    /// record by its lower half and tags it with its top bits, so a shard's records still spread
    /// over its table's groups and tags.
    fn shard(&self, fingerprint: u128) -> &Mutex<Shard> {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "only the low bits of the upper half select a shard"
        )]
        let index = (fingerprint >> 64) as usize % SHARDS;
        &self.shards[index]
    }

    /// Records held, expired or not.
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().records.len())
            .sum()
    }

    /// Drops the records expired at `now`.
    fn sweep(&self, now: SystemTime) {
        for shard in &self.shards {
            shard.lock().sweep(now);
        }
    }
}

impl Scopes {
    /// Records held over every scope, expired or not.
    fn len(&self) -> usize {
        self.records.values().map(|records| records.len()).sum()
    }

    /// Adds `scope`, sweeping every scope first if the store has doubled since the last time.
    /// Adding is rare (a partition assignment), so counting the records then costs nothing
    /// per record.
    fn add(&mut self, scope: &PartitionScope, now: SystemTime) -> Arc<ScopeRecords> {
        if self.sweep.due(self.len()) {
            for records in self.records.values() {
                records.sweep(now);
            }
            let len = self.len();
            self.sweep.swept(len);
        }
        let records = Arc::new(ScopeRecords::new());
        self.records.insert(scope.clone(), records.clone());
        records
    }
}

impl MemoryDedupStore {
    /// An empty store judging expiry by `clock`.
    pub fn new(clock: impl Clock + 'static) -> Self {
        Self {
            clock: Arc::new(clock),
            shared: Arc::new(Shared {
                id: STORES.fetch_add(1, Ordering::Relaxed),
                scopes: Mutex::new(Scopes {
                    records: HashMap::default(),
                    sweep: SweepSchedule::new(),
                }),
            }),
        }
    }

    /// Number of records held, expired or not (for tests of the sweep).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.scopes.lock().len()
    }

    /// True when no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with the records of `scope`, or with `None` when the store has none and
    /// `now` is `None` (a lookup). An insert (`now` given) adds the scope if it is new.
    fn with_scope<R>(
        &self,
        scope: &PartitionScope,
        now: Option<SystemTime>,
        f: impl FnOnce(Option<&ScopeRecords>) -> R,
    ) -> R {
        let shared = &*self.shared;
        let slot = recent_slot(shared.id, scope);
        RECENT.with_borrow_mut(|recent| {
            if let Some((id, kept, records)) = &recent[slot]
                && *id == shared.id
                && kept == scope
            {
                return f(Some(records));
            }
            let records = {
                let mut scopes = shared.scopes.lock();
                match (scopes.records.get(scope), now) {
                    (Some(records), _) => records.clone(),
                    (None, Some(now)) => scopes.add(scope, now),
                    (None, None) => return f(None),
                }
            };
            let (_, _, records) = recent[slot].insert((shared.id, scope.clone(), records));
            f(Some(records))
        })
    }
}

/// Everything is in memory behind short locks: nothing ever waits for I/O.
impl ImmediateDedupStore for MemoryDedupStore {
    fn insert_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        let now = self.clock.now();
        let fingerprint = record.fingerprint();
        self.with_scope(scope, Some(now), |records| {
            if let Some(records) = records {
                let mut shard = records.shard(fingerprint).lock();
                shard.records.insert(fingerprint, ttl.expires_at(now));
                if shard.sweep.due(shard.records.len()) {
                    shard.sweep(now);
                }
            }
        });
        Ok(())
    }

    fn contains_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError> {
        let fingerprint = record.fingerprint();
        let expiry = self.with_scope(scope, None, |records| {
            records.and_then(|records| records.shard(fingerprint).lock().records.get(fingerprint))
        });
        // The clock is read only for a record that is there: most lookups miss.
        Ok(expiry.is_some_and(|expiry| self.clock.now() < expiry))
    }
}

#[async_trait]
impl DedupStore for MemoryDedupStore {
    fn lookup_cost(&self) -> LookupCost {
        LookupCost::InProcess
    }

    fn immediate(&self) -> Option<&dyn ImmediateDedupStore> {
        Some(self)
    }

    async fn insert(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError> {
        self.insert_now(scope, record, ttl)
    }

    async fn contains(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError> {
        self.contains_now(scope, record)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prosody_api::{ManualClock, Partition};

    use super::*;

    #[tokio::test]
    async fn expired_records_are_swept_as_the_store_grows() {
        let clock = ManualClock::new();
        let store = MemoryDedupStore::new(clock.clone());
        let scope = PartitionScope::new("g", "t", Partition(0));
        let ttl = Ttl::from_secs(1).unwrap();
        for id in 0..2000 {
            store
                .insert(&scope, &DedupRecord::new("k", id.to_string(), "1"), ttl)
                .await
                .unwrap();
            clock.advance(Duration::from_secs(1));
        }
        assert!(store.len() < 1100, "held {} records", store.len());
    }

    fn record(id: usize) -> DedupRecord<'static> {
        DedupRecord::new("k", id.to_string(), "1")
    }

    #[test]
    fn a_scope_no_longer_inserted_into_is_swept_when_scopes_are_added() {
        let clock = ManualClock::new();
        let store = MemoryDedupStore::new(clock.clone());
        let ttl = Ttl::from_secs(1).unwrap();
        let moved_away = PartitionScope::new("g", "t", Partition(0));
        for id in 0..1100 {
            store.insert_now(&moved_away, &record(id), ttl).unwrap();
        }
        assert_eq!(store.len(), 1100, "nothing expired yet");
        clock.advance(Duration::from_secs(2));
        store
            .insert_now(
                &PartitionScope::new("g", "t", Partition(1)),
                &record(0),
                ttl,
            )
            .unwrap();
        assert_eq!(store.len(), 1, "the first scope's expired records are gone");
    }

    #[test]
    fn records_inserted_on_one_thread_are_seen_on_others() {
        let store = MemoryDedupStore::new(ManualClock::new());
        let ttl = Ttl::from_secs(60).unwrap();
        let scopes: Vec<_> = (0..8)
            .map(|partition| PartitionScope::new("g", "t", Partition(partition)))
            .collect();
        // Each thread looks every scope up first, so each keeps them all before any insert.
        for scope in &scopes {
            assert!(!store.contains_now(scope, &record(0)).unwrap());
        }
        std::thread::scope(|threads| {
            threads.spawn(|| {
                for scope in &scopes {
                    assert!(!store.contains_now(scope, &record(0)).unwrap());
                    store.insert_now(scope, &record(0), ttl).unwrap();
                }
            });
        });
        for scope in &scopes {
            assert!(store.contains_now(scope, &record(0)).unwrap());
        }
        std::thread::scope(|threads| {
            threads.spawn(|| {
                for scope in &scopes {
                    assert!(store.contains_now(scope, &record(0)).unwrap());
                    assert!(!store.contains_now(scope, &record(1)).unwrap());
                }
            });
        });
    }

    #[test]
    fn stores_keep_their_own_records() {
        let ttl = Ttl::from_secs(60).unwrap();
        let scope = PartitionScope::new("g", "t", Partition(0));
        let first = MemoryDedupStore::new(ManualClock::new());
        first.insert_now(&scope, &record(0), ttl).unwrap();
        let second = MemoryDedupStore::new(ManualClock::new());
        assert!(!second.contains_now(&scope, &record(0)).unwrap());
        second.insert_now(&scope, &record(1), ttl).unwrap();
        assert!(first.contains_now(&scope, &record(0)).unwrap());
        assert!(!first.contains_now(&scope, &record(1)).unwrap());
        assert!(second.contains_now(&scope, &record(1)).unwrap());
        // A store made where a dropped one was sees none of the dropped one's records.
        drop(first);
        let third = MemoryDedupStore::new(ManualClock::new());
        assert!(!third.contains_now(&scope, &record(0)).unwrap());
    }
}
