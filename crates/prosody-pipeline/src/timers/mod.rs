//! Durable timers at run time: one manager per assigned partition loads the near future from
//! the [`TimerStore`], and fires due timers into the engine's key queues, where they wait
//! behind (and never overlap) the key's messages.
//!
//! # How a timer flows
//!
//! 1. A handler calls `schedule` on its context. The write is *staged* in the attempt's
//!    [`StagedTimers`]; reads of the attempt see it, the store does not.
//! 2. When the attempt succeeds, the dispatch [commits](StagedTimers::commit) the staged
//!    writes to the store and mirrors each into the partition's manager. A failed attempt's
//!    writes are dropped with its context.
//! 3. The manager holds the timers of the slabs up to the one after now (bounded by
//!    [`TimerSettings::capacity`]); when one is due it hands a [`FiredTimer`] event to the
//!    engine ([`TimerSink`]), which queues it behind the key's other events.
//! 4. The dispatch calls `on_timer`; when the event completes, the commit removes the fired
//!    timer from the store first, then applies the handler's own writes. The engine then tells
//!    the manager the timer [finished](Timers::finished).
//!
//! On revocation the engine stops the partition's manager before draining its key queues, so
//! the old owner fires nothing more; timers it did not finish stay stored and the next owner
//! loads them.

mod manager;
mod queue;
mod staging;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prosody_api::storage::{PartitionScope, StoredTimer, TimerStore};
use prosody_api::{Clock, ConsumerGroup, Key, Partition, SlabId, StorageError, Topic};
use tokio::runtime::Handle;

use self::manager::PartitionTimers;
use crate::consumer::TopicPartition;
use crate::event::{Event, FiredTimer};

pub use queue::TimerWrite;
pub use staging::StagedTimers;

/// Where a manager sends due timers: the engine's key queues in production.
pub trait TimerSink: Send + Sync + 'static {
    /// Queues a due timer behind its key's other events. False when the partition no longer
    /// takes events (it is being revoked): the manager then stops.
    fn fire(&self, timer: FiredTimer) -> bool;
}

/// Limits of the timer managers.
#[derive(Clone, Copy, Debug)]
pub struct TimerSettings {
    /// Pending timers a partition keeps in memory (>= 1). Beyond it the latest are left in
    /// the store and read again once the queue has drained to half.
    pub capacity: usize,
    /// Timers of a partition fired and not yet finished (>= 1): bounds what one burst of due
    /// timers adds to the key queues.
    pub max_in_flight: usize,
    /// The longest the manager sleeps between two looks at the clock, so a clock jump or a
    /// missed wake-up cannot delay a timer for longer.
    pub recheck_interval: Duration,
}

impl Default for TimerSettings {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            max_in_flight: 256,
            recheck_interval: Duration::from_secs(1),
        }
    }
}

/// A snapshot of one partition's in-memory timers, for tests and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueStats {
    /// Loaded and not fired.
    pub pending: usize,
    /// Fired and not finished.
    pub in_flight: usize,
    /// The last slab read.
    pub frontier: Option<SlabId>,
    /// True when some loaded slab did not fit in memory.
    pub truncated: bool,
    /// True while slabs are being read.
    pub loading: bool,
}

struct Inner {
    store: Arc<dyn TimerStore>,
    group: ConsumerGroup,
    clock: Arc<dyn Clock>,
    settings: TimerSettings,
    partitions: Mutex<HashMap<TopicPartition, Arc<PartitionTimers>>>,
}

/// The timers runtime of one consumer: the store, and a manager per assigned partition. The
/// engine starts and stops managers as partitions come and go; the dispatch stages and
/// commits handlers' timer writes through it. Cheap to clone; clones share the managers.
#[derive(Clone)]
pub struct Timers {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Timers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timers")
            .field("group", &self.inner.group)
            .field("store", &self.inner.store)
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl Timers {
    /// Timers of consumer group `group` kept in `store`, judged due by `clock`.
    pub fn new(
        store: Arc<dyn TimerStore>,
        group: impl Into<ConsumerGroup>,
        clock: Arc<dyn Clock>,
        settings: TimerSettings,
    ) -> Self {
        let settings = TimerSettings {
            capacity: settings.capacity.max(1),
            max_in_flight: settings.max_in_flight.max(1),
            recheck_interval: settings.recheck_interval.max(Duration::from_millis(1)),
        };
        Self {
            inner: Arc::new(Inner {
                store,
                group: group.into(),
                clock,
                settings,
                partitions: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn TimerStore> {
        &self.inner.store
    }

    /// The store scope of a partition of this group.
    #[must_use]
    pub fn scope(&self, topic: &Topic, partition: Partition) -> PartitionScope {
        PartitionScope::new(self.inner.group.clone(), topic.clone(), partition)
    }

    /// Starts the manager of a newly assigned partition on `runtime`; it fires into `sink`.
    /// A partition that already has one keeps it.
    pub fn start(&self, partition: &TopicPartition, sink: Arc<dyn TimerSink>, runtime: &Handle) {
        let mut partitions = self.inner.partitions.lock();
        if partitions.contains_key(partition) {
            return;
        }
        let scope = self.scope(&partition.topic, partition.partition);
        let manager = Arc::new(PartitionTimers::new(
            partition.clone(),
            scope,
            self.inner.store.as_ref(),
            self.inner.settings,
        ));
        partitions.insert(partition.clone(), manager.clone());
        runtime.spawn(manager.run(self.inner.store.clone(), self.inner.clock.clone(), sink));
    }

    /// Stops the manager of a partition being revoked: it fires nothing from now on.
    pub fn stop(&self, partition: &TopicPartition) {
        if let Some(manager) = self.inner.partitions.lock().remove(partition) {
            manager.stop();
        }
    }

    fn manager(&self, topic: &Topic, partition: Partition) -> Option<Arc<PartitionTimers>> {
        self.inner
            .partitions
            .lock()
            .get(&TopicPartition {
                topic: topic.clone(),
                partition,
            })
            .cloned()
    }

    /// True while a fired timer should still be handled: its partition's manager runs and the
    /// timer was not removed since it fired (an earlier event of the key may have cleared it).
    #[must_use]
    pub fn is_live(&self, fired: &FiredTimer) -> bool {
        self.manager(&fired.topic, fired.partition)
            .is_some_and(|manager| manager.is_live(&stored(fired)))
    }

    /// Tells the manager a fired timer's event ended: `done` when it completed (the dispatch
    /// removed the timer), false when abandoned (it stays stored and pending).
    pub fn finished(&self, fired: &FiredTimer, done: bool) {
        if let Some(manager) = self.manager(&fired.topic, fired.partition) {
            manager.finished(&stored(fired), done);
        }
    }

    /// Writes `key`'s timers in the store now, unstaged, and mirrors the write into the
    /// partition's manager. Handlers' writes go through [`StagedTimers`] instead; this is for
    /// middleware whose writes must land whatever the attempt's outcome (the defer layer's
    /// [`TimerKind::DeferRetry`](prosody_api::TimerKind::DeferRetry) timers).
    ///
    /// # Errors
    /// The store's error; nothing is mirrored then.
    pub async fn write_now(
        &self,
        topic: &Topic,
        partition: Partition,
        key: &Key,
        write: &TimerWrite,
    ) -> Result<(), StorageError> {
        let store = self.store();
        let scope = self.scope(topic, partition);
        match *write {
            TimerWrite::Schedule(kind, time) => store.schedule(&scope, key, kind, time).await?,
            TimerWrite::Unschedule(kind, time) => {
                store.unschedule(&scope, key, kind, time).await?;
            }
            TimerWrite::Clear(kind) => store.clear(&scope, key, kind).await?,
            TimerWrite::ClearAndSchedule(kind, time) => {
                store.clear_and_schedule(&scope, key, kind, time).await?;
            }
        }
        // After the store: a manager loading meanwhile either listed the write or sees it now.
        if let Some(manager) = self.manager(topic, partition) {
            manager.apply(key, write);
        }
        Ok(())
    }

    /// A staging buffer for one attempt on `event`: the timers API of its context.
    #[must_use]
    pub fn stage<'a>(&'a self, event: &'a Event) -> StagedTimers<'a> {
        let (topic, partition) = event.source();
        let fired = match event {
            Event::Timer(fired) => Some(stored(fired)),
            Event::Message(_) | Event::Excise(_) | Event::Rejected(_) => None,
        };
        StagedTimers::new(self, topic, partition, event.key(), fired)
    }

    /// A snapshot of every running manager's in-memory timers.
    #[must_use]
    pub fn all_stats(&self) -> Vec<(TopicPartition, QueueStats)> {
        self.inner
            .partitions
            .lock()
            .iter()
            .map(|(partition, manager)| (partition.clone(), manager.stats()))
            .collect()
    }

    /// A snapshot of a partition's in-memory timers; `None` when it has no manager.
    #[must_use]
    pub fn stats(&self, partition: &TopicPartition) -> Option<QueueStats> {
        self.inner
            .partitions
            .lock()
            .get(partition)
            .map(|manager| manager.stats())
    }
}

fn stored(fired: &FiredTimer) -> StoredTimer {
    StoredTimer {
        time: fired.timer.time,
        key: fired.timer.key.clone(),
        kind: fired.kind,
    }
}
