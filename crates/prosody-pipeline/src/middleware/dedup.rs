//! Deduplication: a message whose payload has an `id` is handled once per (key, id,
//! `idempotenceVersion`). Two tiers: a bounded in-memory set of recently handled records,
//! shared by every partition of the subscription, answers repeats without I/O; the durable
//! [`DedupStore`] (TTL `idempotenceTtlS`) answers after restarts and partition moves.
//!
//! A store that answers from the process's own memory ([`LookupCost::InProcess`]) is asked
//! directly, without the in-memory tier: remembering its answers would cost as much as asking.
//! A store that never waits ([`DedupStore::immediate`]) is called without a future.
//!
//! The in-memory tier is two generations of a set rather than a general cache (moka was
//! measured at several percent of the consumer's CPU here): every handled record is inserted
//! once and looked up about once, so recency is the only signal, and a frequency-based
//! admission policy could even refuse to remember a record just handled. Generations rather
//! than a first-in, first-out queue: forgetting is one drop of the older half instead of a
//! queue pop and a map removal per insert, and the TTL is judged per generation, so the clock
//! is read once per generation and on a hit, not for every record.
//!
//! A record is recorded as seen only after the layers below succeeded, so a failed attempt
//! never hides the record from a later delivery. A store that cannot answer does not block
//! the key: the record is handled (at least once is the contract; dedup only narrows it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prosody_api::digest::{DigestSet, Digester};
use prosody_api::storage::{DedupRecord, DedupStore, LookupCost, PartitionScope, Ttl};
use prosody_api::{ConsumerGroup, Partition, Topic};
use serde_json::Value;
use tracing::{debug, warn};

use super::{Layer, Service, Task, Verdict};
use crate::event::Event;
use crate::hashing::KeyMap;

/// The recent set's notion of a record: the record's fingerprint (key, id and version, fixed
/// per subscription) combined with a keyed digest of its (topic, partition). Both halves are
/// keyed 128-bit digests unknown outside the process, so two different records share a key
/// with negligible probability, and a digest rather than the strings keeps the hot path free of
/// allocations.
type CacheKey = u128;

/// Skips messages already handled.
pub struct Dedup<S> {
    store: Arc<dyn DedupStore>,
    /// The in-memory tier; none in front of a store that is in memory itself.
    cache: Option<RecentSet>,
    group: ConsumerGroup,
    version: String,
    ttl: Ttl,
    inner: S,
}

/// Builds a [`Dedup`].
pub struct DedupLayer {
    /// The durable tier.
    pub store: Arc<dyn DedupStore>,
    /// Entries of the in-memory tier (at least 1: the configuration rejects 0).
    pub cache_size: u64,
    /// The consumer group: part of the store's scope.
    pub group_id: String,
    /// `idempotenceVersion`.
    pub version: String,
    /// `idempotenceTtlS`.
    pub ttl: Ttl,
}

impl Layer for DedupLayer {
    type Wrapped<S: Service> = Dedup<S>;

    fn wrap<S: Service>(self, inner: S) -> Dedup<S> {
        // A remembered answer never outlives the durable record it stands for.
        let cache = (self.store.lookup_cost() == LookupCost::Io).then(|| {
            RecentSet::new(
                usize::try_from(self.cache_size).unwrap_or(usize::MAX),
                self.ttl.as_duration().max(Duration::from_secs(1)),
            )
        });
        Dedup {
            store: self.store,
            cache,
            group: ConsumerGroup::from(self.group_id),
            version: self.version,
            ttl: self.ttl,
            inner,
        }
    }
}

/// Records inserted recently: at least the last `capacity / 2` and at most the last
/// `capacity`, each for at most `ttl`.
struct RecentSet {
    /// Records per generation.
    generation: usize,
    ttl: Duration,
    /// Digests the places (topic, partition) records are combined with.
    digester: Digester,
    inner: Mutex<Generations>,
}

/// The generation being filled, the one before it, and the digest of each place seen.
#[derive(Default)]
struct Generations {
    current: Generation,
    previous: Generation,
    places: KeyMap<(Topic, Partition), u128>,
}

impl Generations {
    /// True when a generation holds `key` and is younger than `ttl`.
    fn holds(&self, key: CacheKey, ttl: Duration) -> bool {
        [&self.current, &self.previous]
            .into_iter()
            .find(|generation| generation.records.contains(&key))
            .and_then(|generation| generation.since)
            .is_some_and(|since| since.elapsed() < ttl)
    }
}

/// Records inserted together, with the time of the first: every record of the generation was
/// inserted at or after it, so judging the TTL by it can only forget a record early (the store
/// then answers), never remember one too long.
#[derive(Default)]
struct Generation {
    records: DigestSet,
    since: Option<Instant>,
}

impl RecentSet {
    fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            generation: capacity.div_ceil(2).max(1),
            ttl,
            digester: Digester::default(),
            inner: Mutex::new(Generations::default()),
        }
    }

    /// The key of `record` read from `topic` and `partition`, and whether it is in the set.
    fn lookup(
        &self,
        topic: &Topic,
        partition: Partition,
        record: &DedupRecord<'_>,
    ) -> (CacheKey, bool) {
        let mut inner = self.inner.lock();
        let place = *inner
            .places
            .entry((topic.clone(), partition))
            .or_insert_with(|| self.digester.digest((topic.as_str(), partition.0)));
        let key = place ^ record.fingerprint();
        (key, inner.holds(key, self.ttl))
    }

    fn insert(&self, key: CacheKey) {
        let mut inner = self.inner.lock();
        if inner.current.records.len() >= self.generation {
            // The dropped generation's table is reused: a fresh one would grow by rehashing
            // all the way to the generation's size again.
            let mut dropped = std::mem::take(&mut inner.previous);
            dropped.records.clear();
            dropped.since = None;
            inner.previous = std::mem::replace(&mut inner.current, dropped);
        }
        let current = &mut inner.current;
        current.since.get_or_insert_with(Instant::now);
        current.records.insert(key);
    }

    #[cfg(test)]
    fn contains(&self, key: CacheKey) -> bool {
        self.inner.lock().holds(key, self.ttl)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let inner = self.inner.lock();
        inner.current.records.union(&inner.previous.records).count()
    }
}

/// The message and its payload's `id` as text (a string as it is, a number in its JSON form);
/// `None` (not deduplicated) for other events and for an absent, null or structured `id`.
fn payload_id(event: &Event) -> Option<(&prosody_api::Message, &str)> {
    let Event::Message(message) = event else {
        return None;
    };
    Some((message, message.payload.id()?))
}

impl<S: Service> Service for Dedup<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        match payload_id(task.event) {
            Some((message, id)) => self.deduplicated(task, message, id).await,
            None => self.inner.call(task).await,
        }
    }
}

impl<S: Service> Dedup<S> {
    /// The scope of `message`'s records in the store (interned names: copies of references).
    fn scope(&self, message: &prosody_api::Message) -> PartitionScope {
        PartitionScope::new(self.group.clone(), message.topic.clone(), message.partition)
    }

    /// Handles `message`, whose payload's id is `id`, unless it was handled already.
    ///
    /// Its own future, apart from the pass-through of events without an id, and holding
    /// across the handler only what the insert after it needs: each local kept across the
    /// await widens the future every event's dispatch allocates and moves.
    async fn deduplicated(
        &self,
        task: &Task<'_>,
        message: &prosody_api::Message,
        id: &str,
    ) -> Verdict {
        let record = DedupRecord::borrowing(&message.key, id, &*self.version);
        // The recent set and the record's key in it, when there is one to remember it in.
        let mut recent = None;
        if let Some(cache) = &self.cache {
            let (cache_key, seen) = cache.lookup(&message.topic, message.partition, &record);
            if seen {
                debug!(key = %message.key, id = record.id(), offset = message.offset.0,
                    "duplicate skipped (cache)");
                return Ok(Value::Null);
            }
            recent = Some((cache, cache_key));
        }
        let remember = || {
            if let Some((cache, cache_key)) = recent {
                cache.insert(cache_key);
            }
        };
        // Asked once: the same store answers the lookup and, after success, the insert.
        let immediate = self.store.immediate();
        // In a block of its own, so the answer is gone before the handler's await.
        let duplicate = {
            let seen = match immediate {
                Some(store) => store.contains_now(&self.scope(message), &record),
                None => self.store.contains(&self.scope(message), &record).await,
            };
            match seen {
                Ok(seen) => seen,
                Err(error) => {
                    warn!(key = %message.key, id = record.id(), %error,
                        "dedup store cannot answer: handling the message anyway");
                    false
                }
            }
        };
        if duplicate {
            debug!(key = %message.key, id = record.id(), offset = message.offset.0,
                "duplicate skipped (store)");
            remember();
            return Ok(Value::Null);
        }
        let verdict = self.inner.call(task).await;
        if verdict.is_ok() {
            let scope = self.scope(message);
            let recorded = match immediate {
                Some(store) => store.insert_now(&scope, &record, self.ttl),
                None => self.store.insert(&scope, &record, self.ttl).await,
            };
            if let Err(error) = recorded {
                warn!(key = %message.key, id = record.id(), %error,
                    "cannot record the message as handled: a redelivery would handle it again");
            }
            remember();
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::FailureKind;
    use crate::middleware::stack::testing::{Calls, message, task};
    use async_trait::async_trait;
    use parking_lot::Mutex;
    use prosody_api::StorageError;
    use prosody_api::storage::ImmediateDedupStore;
    use serde_json::json;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A store without TTL: the pipeline never names a backend, not even in its tests. It
    /// counts lookups and says it does I/O unless built [`MemoryDedupStore::in_process`].
    #[derive(Clone, Debug, Default)]
    struct MemoryDedupStore {
        records: Arc<Mutex<HashSet<(PartitionScope, DedupRecord<'static>)>>>,
        lookups: Arc<AtomicUsize>,
        in_process: bool,
    }

    impl MemoryDedupStore {
        fn in_process() -> Self {
            Self {
                in_process: true,
                ..Self::default()
            }
        }

        fn is_empty(&self) -> bool {
            self.records.lock().is_empty()
        }

        fn lookups(&self) -> usize {
            self.lookups.load(Ordering::SeqCst)
        }
    }

    impl ImmediateDedupStore for MemoryDedupStore {
        fn insert_now(
            &self,
            scope: &PartitionScope,
            record: &DedupRecord<'_>,
            _: Ttl,
        ) -> Result<(), StorageError> {
            self.records
                .lock()
                .insert((scope.clone(), record.clone().into_owned()));
            Ok(())
        }

        fn contains_now(
            &self,
            scope: &PartitionScope,
            record: &DedupRecord<'_>,
        ) -> Result<bool, StorageError> {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            Ok(self
                .records
                .lock()
                .contains(&(scope.clone(), record.clone().into_owned())))
        }
    }

    /// In process, it also answers immediately, so the layer's tests cover both call paths.
    #[async_trait]
    impl DedupStore for MemoryDedupStore {
        fn lookup_cost(&self) -> LookupCost {
            if self.in_process {
                LookupCost::InProcess
            } else {
                LookupCost::Io
            }
        }

        fn immediate(&self) -> Option<&dyn ImmediateDedupStore> {
            self.in_process.then_some(self as &dyn ImmediateDedupStore)
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

    fn layer<S: Service>(store: &MemoryDedupStore, version: &str, inner: S) -> Dedup<S> {
        Box::new(DedupLayer {
            store: Arc::new(store.clone()),
            cache_size: 16,
            group_id: "g".to_owned(),
            version: version.to_owned(),
            ttl: Ttl::from_secs(60).expect("non-zero"),
        })
        .wrap(inner)
    }

    /// Handles a message of `key` with `payload` through `dedup`, which must succeed.
    async fn handle<S: Service>(dedup: &Dedup<S>, key: &str, payload: Value) {
        dedup
            .call(&task(message(key, payload)))
            .await
            .expect("handled");
    }

    #[test]
    fn the_recent_set_keeps_the_last_entries_within_their_ttl() {
        let set = RecentSet::new(4, Duration::from_secs(60));
        for key in 1..=5 {
            set.insert(key);
        }
        assert!(
            !set.contains(1) && !set.contains(2),
            "the oldest generation was dropped"
        );
        assert!((3..=5).all(|key| set.contains(key)));
        set.insert(5);
        assert_eq!(set.len(), 3, "re-inserting does not grow the set");
        for key in 6..=100 {
            set.insert(key);
            assert!(set.len() <= 4, "never more than the capacity");
            assert!(
                set.contains(key) && set.contains(key - 1),
                "the last half is kept"
            );
        }
        let expired = RecentSet::new(2, Duration::ZERO);
        expired.insert(1);
        assert!(!expired.contains(1));
    }

    /// A store answering through futures, and one answering immediately.
    fn both_kinds_of_store() -> [MemoryDedupStore; 2] {
        [MemoryDedupStore::default(), MemoryDedupStore::in_process()]
    }

    #[tokio::test]
    async fn same_key_and_id_once_other_key_or_version_again() {
        for store in both_kinds_of_store() {
            same_key_and_id_once_other_key_or_version_again_with(&store).await;
        }
    }

    async fn same_key_and_id_once_other_key_or_version_again_with(store: &MemoryDedupStore) {
        let calls = Calls::succeeding();
        let dedup = layer(store, "1", calls.clone());
        for (key, id) in [
            ("a", json!("x")),
            ("a", json!("x")),
            ("b", json!("x")),
            ("a", json!(7)),
        ] {
            handle(&dedup, key, json!({ "id": id })).await;
        }
        assert_eq!(calls.count(), 3, "the second (a, x) is a duplicate");
        // A fresh layer (restart) answers from the store; a new version forgets.
        let restarted = layer(store, "1", calls.clone());
        handle(&restarted, "a", json!({"id": "x"})).await;
        assert_eq!(calls.count(), 3);
        let bumped = layer(store, "2", calls.clone());
        handle(&bumped, "a", json!({"id": "x"})).await;
        assert_eq!(calls.count(), 4);
    }

    #[tokio::test]
    async fn repeats_are_answered_by_the_recent_set_unless_the_store_is_in_process() {
        for (store, lookups) in [
            (MemoryDedupStore::default(), 1),
            (MemoryDedupStore::in_process(), 3),
        ] {
            let calls = Calls::succeeding();
            let dedup = layer(&store, "1", calls.clone());
            for _ in 0..3 {
                handle(&dedup, "a", json!({"id": "x"})).await;
            }
            assert_eq!(calls.count(), 1, "handled once either way");
            assert_eq!(
                store.lookups(),
                lookups,
                "store lookups when in process: {}",
                store.in_process
            );
        }
    }

    #[tokio::test]
    async fn a_failed_attempt_is_not_recorded_and_payloads_without_id_always_pass() {
        for store in both_kinds_of_store() {
            a_failed_attempt_is_not_recorded_with(&store).await;
        }
    }

    async fn a_failed_attempt_is_not_recorded_with(store: &MemoryDedupStore) {
        let failing = Calls::failing(FailureKind::Permanent);
        let dedup = layer(store, "1", failing.clone());
        let verdict = dedup.call(&task(message("a", json!({"id": "x"})))).await;
        assert!(verdict.is_err());
        assert!(store.is_empty());
        let calls = Calls::succeeding();
        let dedup = layer(store, "1", calls.clone());
        for _ in 0..2 {
            handle(&dedup, "a", json!({"id": "x"})).await;
            handle(&dedup, "a", json!({"no": "id"})).await;
        }
        assert_eq!(calls.count(), 3);
    }
}
