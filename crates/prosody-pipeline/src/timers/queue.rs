//! The in-memory timers of one partition: which stored timers are loaded, which are firing,
//! and how far ahead the loader has read. Plain synchronous state, changed under the manager's
//! lock, so its rules are unit tested without a store or a runtime.
//!
//! # What "loaded" means
//!
//! Outside a load, `pending` plus the live `in_flight` timers are exactly the store's timers of
//! the partition whose slab is at most `frontier` and which order before `limit` (when set).
//! Nothing else is in memory: the far future stays in the store. `limit` exists because
//! memory is bounded: when more timers are due within the frontier than `capacity`, the latest
//! are evicted and read again (a *refill*) once the queue has drained.
//!
//! Handlers' writes are mirrored here after they land in the store (see [`TimerQueue::apply`]),
//! so the store is read only to load slabs, never to fire.
//!
//! # Loads
//!
//! A load lists slabs without the lock while handlers keep writing. To stay exact, the queue
//! records what happens meanwhile: removals (and finished timers) become tombstones that
//! override a listing taken before them, and schedules beyond the old bound wait in a buffer
//! until the new bound is known. A listing taken after a write includes it; a write after the
//! listing is mirrored: either way each timer ends up loaded once.

use std::collections::{BTreeSet, HashMap, HashSet};

use prosody_api::storage::StoredTimer;
use prosody_api::{Key, SlabId, SlabSize, TimerKind, TimerTime};

/// A write that landed in the store, mirrored into the queue. Serializable so a commit
/// journal can record the writes of an interrupted commit (see `crate::state::journal`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TimerWrite {
    /// The timer was added (upsert).
    Schedule(TimerKind, TimerTime),
    /// The timer was removed.
    Unschedule(TimerKind, TimerTime),
    /// Every timer of the kind was removed.
    Clear(TimerKind),
    /// Every timer of the kind was replaced by one.
    ClearAndSchedule(TimerKind, TimerTime),
}

/// What a load must read: every slab in `from..=through` (listed by the store), keeping the
/// timers at or after `after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadPlan {
    /// First slab to read.
    pub from: SlabId,
    /// Last slab to read.
    pub through: SlabId,
    /// Timers ordered before this are already loaded (a refill resumes here).
    pub after: Option<StoredTimer>,
}

/// How a load ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadEnd {
    /// Every slab of the plan was merged.
    Complete,
    /// Slabs from this one on were not merged (the queue filled up, or the store failed).
    StoppedAt(SlabId),
}

#[derive(Debug)]
struct Load {
    plan: LoadPlan,
    target: SlabId,
    tombstones: HashSet<StoredTimer>,
    cleared: HashSet<(Key, TimerKind)>,
    buffered: Vec<StoredTimer>,
}

/// The in-memory timers of one partition.
#[derive(Debug)]
pub struct TimerQueue {
    size: SlabSize,
    capacity: usize,
    frontier: Option<SlabId>,
    limit: Option<StoredTimer>,
    pending: BTreeSet<StoredTimer>,
    by_key: HashMap<(Key, TimerKind), BTreeSet<TimerTime>>,
    /// Fired and not finished; `false` once removed from the store meanwhile, so the queued
    /// event is skipped instead of handled.
    in_flight: HashMap<StoredTimer, bool>,
    load: Option<Load>,
}

/// The smallest timer at `time`: keys order bytewise from the empty string and
/// [`TimerKind::Application`] is the first kind, so every timer at `time` orders at or after it.
fn first_at(time: TimerTime) -> StoredTimer {
    StoredTimer {
        time,
        key: Key::from(""),
        kind: TimerKind::Application,
    }
}

impl TimerQueue {
    /// An empty queue for a store bucketing by `size`, holding at most about `capacity`
    /// (>= 1) pending timers.
    #[must_use]
    pub fn new(size: SlabSize, capacity: usize) -> Self {
        Self {
            size,
            capacity: capacity.max(1),
            frontier: None,
            limit: None,
            pending: BTreeSet::new(),
            by_key: HashMap::new(),
            in_flight: HashMap::new(),
            load: None,
        }
    }

    /// The slab width of the store the queue mirrors.
    #[must_use]
    pub fn slab_size(&self) -> SlabSize {
        self.size
    }

    /// The last slab read (or being read), if any.
    #[must_use]
    pub fn frontier(&self) -> Option<SlabId> {
        self.frontier
    }

    /// Timers loaded and not fired.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Timers fired and not finished.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// True when memory holds only part of the slabs up to the frontier.
    #[must_use]
    pub fn is_truncated(&self) -> bool {
        self.limit.is_some()
    }

    fn loaded(&self, timer: &StoredTimer) -> bool {
        self.frontier
            .is_some_and(|frontier| timer.time.slab(self.size) <= frontier)
            && self.limit.as_ref().is_none_or(|limit| timer < limit)
    }

    fn insert(&mut self, timer: StoredTimer) {
        self.by_key
            .entry((timer.key.clone(), timer.kind))
            .or_default()
            .insert(timer.time);
        self.pending.insert(timer);
    }

    fn remove(&mut self, timer: &StoredTimer) {
        if self.pending.remove(timer) {
            let index = (timer.key.clone(), timer.kind);
            if let Some(times) = self.by_key.get_mut(&index) {
                times.remove(&timer.time);
                if times.is_empty() {
                    self.by_key.remove(&index);
                }
            }
        }
    }

    /// Mirrors a write of `key`'s timers that landed in the store.
    pub fn apply(&mut self, key: &Key, write: &TimerWrite) {
        match *write {
            TimerWrite::Schedule(kind, time) => self.scheduled(key, kind, time),
            TimerWrite::Unschedule(kind, time) => self.unscheduled(StoredTimer {
                time,
                key: key.clone(),
                kind,
            }),
            TimerWrite::Clear(kind) => self.cleared(key, kind),
            TimerWrite::ClearAndSchedule(kind, time) => {
                self.cleared(key, kind);
                self.scheduled(key, kind, time);
            }
        }
    }

    fn scheduled(&mut self, key: &Key, kind: TimerKind, time: TimerTime) {
        let timer = StoredTimer {
            time,
            key: key.clone(),
            kind,
        };
        let loaded = self.loaded(&timer);
        if let Some(load) = &mut self.load {
            load.tombstones.remove(&timer);
            if !loaded {
                load.buffered.push(timer);
                return;
            }
        } else if !loaded {
            // Beyond what memory holds: a later load reads it from the store.
            return;
        }
        self.insert(timer);
        self.evict_over_capacity();
    }

    fn unscheduled(&mut self, timer: StoredTimer) {
        self.remove(&timer);
        if let Some(live) = self.in_flight.get_mut(&timer) {
            *live = false;
        }
        if let Some(load) = &mut self.load {
            load.buffered.retain(|buffered| *buffered != timer);
            load.tombstones.insert(timer);
        }
    }

    fn cleared(&mut self, key: &Key, kind: TimerKind) {
        let times = self.by_key.remove(&(key.clone(), kind)).unwrap_or_default();
        for time in times {
            self.pending.remove(&StoredTimer {
                time,
                key: key.clone(),
                kind,
            });
        }
        for (timer, live) in &mut self.in_flight {
            if timer.kind == kind && timer.key == *key {
                *live = false;
            }
        }
        if let Some(load) = &mut self.load {
            load.buffered
                .retain(|buffered| buffered.kind != kind || buffered.key != *key);
            load.cleared.insert((key.clone(), kind));
        }
    }

    fn evict_over_capacity(&mut self) {
        // Only outside a load: during one the bound is about to be recomputed, and evicting
        // now could drop a merged timer below a bound that then claims it is loaded.
        if self.load.is_some() {
            return;
        }
        while self.pending.len() > self.capacity {
            let Some(last) = self.pending.last().cloned() else {
                break;
            };
            self.remove(&last);
            // Exclusive bound: the evicted timer and everything after it is no longer loaded.
            self.limit = Some(last);
        }
    }

    /// Takes the timers due at `now`, oldest first, while fewer than `max_in_flight` are
    /// firing. A timer whose previous firing has not finished waits for it (it was scheduled
    /// again by its own handler).
    pub fn take_due(&mut self, now: TimerTime, max_in_flight: usize) -> Vec<StoredTimer> {
        let room = max_in_flight.saturating_sub(self.in_flight.len());
        let due: Vec<StoredTimer> = self
            .pending
            .iter()
            .take_while(|timer| timer.time <= now)
            .filter(|timer| !self.in_flight.contains_key(timer))
            .take(room)
            .cloned()
            .collect();
        for timer in &due {
            self.remove(timer);
            self.in_flight.insert(timer.clone(), true);
        }
        due
    }

    /// When the earliest pending timer is due; `None` when nothing is pending or the firing
    /// limit is reached (a finishing timer wakes the manager then).
    #[must_use]
    pub fn next_due(&self, max_in_flight: usize) -> Option<TimerTime> {
        if self.in_flight.len() >= max_in_flight {
            return None;
        }
        self.pending
            .iter()
            .find(|timer| !self.in_flight.contains_key(timer))
            .map(|timer| timer.time)
    }

    /// True while a fired timer is still in the store: it was not removed since it fired.
    #[must_use]
    pub fn is_live(&self, timer: &StoredTimer) -> bool {
        self.in_flight.get(timer).copied().unwrap_or(false)
    }

    /// Records that a fired timer's event finished. `done` means its handling completed (the
    /// dispatch removed it from the store); otherwise it was abandoned (revocation, shutdown)
    /// and, still stored, it is pending again.
    pub fn finished(&mut self, timer: &StoredTimer, done: bool) {
        let Some(live) = self.in_flight.remove(timer) else {
            return;
        };
        if done {
            if let Some(load) = &mut self.load {
                load.tombstones.insert(timer.clone());
            }
        } else if live && self.loaded(timer) {
            self.insert(timer.clone());
            self.evict_over_capacity();
        }
    }

    /// Starts the next load needed at `now`, if any: the first load reads every slab up to the
    /// one after `now`'s (overdue timers included); later the frontier moves one slab ahead as
    /// time enters it; a truncated queue that drained to half its capacity is refilled.
    pub fn begin_load(&mut self, now: TimerTime) -> Option<LoadPlan> {
        if self.load.is_some() {
            return None;
        }
        let target = SlabId(now.slab(self.size).0.saturating_add(1));
        let plan = match self.frontier {
            None => LoadPlan {
                from: SlabId(0),
                through: target,
                after: None,
            },
            Some(frontier) if frontier < target && self.limit.is_none() => LoadPlan {
                from: SlabId(frontier.0.saturating_add(1)),
                through: target,
                after: None,
            },
            Some(frontier) if frontier < target => {
                // Truncated: the new slab orders after the limit anyway; a refill reads it.
                self.frontier = Some(target);
                return self.begin_load(now);
            }
            Some(frontier) => {
                let limit = self.limit.as_ref()?;
                if self.pending.len() > self.capacity / 2 {
                    return None;
                }
                LoadPlan {
                    from: limit.time.slab(self.size),
                    through: frontier,
                    after: Some(limit.clone()),
                }
            }
        };
        self.load = Some(Load {
            plan: plan.clone(),
            target: self
                .frontier
                .map_or(target, |frontier| frontier.max(target)),
            tombstones: HashSet::new(),
            cleared: HashSet::new(),
            buffered: Vec::new(),
        });
        Some(plan)
    }

    /// Merges the listing of one slab of the current load. Returns false when the queue is full
    /// and the load should stop before the next slab.
    pub fn merge(&mut self, listed: Vec<StoredTimer>) -> bool {
        let Some(load) = &self.load else {
            return false;
        };
        let keep: Vec<StoredTimer> = listed
            .into_iter()
            .filter(|timer| {
                load.plan.after.as_ref().is_none_or(|after| timer >= after)
                    && timer.time.slab(self.size) <= load.plan.through
                    && !load.tombstones.contains(timer)
                    && !load.cleared.contains(&(timer.key.clone(), timer.kind))
                    && !self.in_flight.contains_key(timer)
            })
            .collect();
        for timer in keep {
            self.insert(timer);
        }
        self.pending.len() < self.capacity
    }

    /// Ends the current load: sets the new frontier and bound, applies the writes that waited
    /// for them, and evicts down to the capacity.
    pub fn end_load(&mut self, end: LoadEnd) {
        let Some(load) = self.load.take() else {
            return;
        };
        let stopped = match end {
            LoadEnd::Complete => None,
            LoadEnd::StoppedAt(slab) => Some(first_at(slab.start(self.size))),
        };
        self.frontier = Some(load.target);
        self.limit = match (self.limit.take(), stopped) {
            // A refill that got past the old bound moves it; one that failed at once keeps it.
            (Some(old), Some(stopped)) => Some(old.max(stopped)),
            (_, stopped) => stopped,
        };
        for timer in load.buffered {
            if self.loaded(&timer) {
                self.insert(timer);
            }
        }
        self.evict_over_capacity();
    }

    /// True while a load is in progress.
    #[must_use]
    pub fn is_loading(&self) -> bool {
        self.load.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: TimerKind = TimerKind::Application;

    fn size() -> SlabSize {
        SlabSize::from_secs(100).unwrap()
    }

    fn t(secs: u64) -> TimerTime {
        TimerTime::from_secs(secs)
    }

    fn timer(secs: u64, key: &str) -> StoredTimer {
        StoredTimer {
            time: t(secs),
            key: Key::from(key),
            kind: APP,
        }
    }

    /// A queue that completed its first load at `now` with `listed` timers in the store.
    fn loaded(capacity: usize, now: u64, listed: &[StoredTimer]) -> TimerQueue {
        let mut queue = TimerQueue::new(size(), capacity);
        let plan = queue.begin_load(t(now)).unwrap();
        assert_eq!(plan.from, SlabId(0));
        let full = !queue.merge(listed.to_vec());
        queue.end_load(if full {
            LoadEnd::StoppedAt(SlabId(plan.through.0 + 1))
        } else {
            LoadEnd::Complete
        });
        queue
    }

    fn keys(timers: &[StoredTimer]) -> Vec<(u64, String)> {
        timers
            .iter()
            .map(|timer| (timer.time.as_secs(), timer.key.to_string()))
            .collect()
    }

    #[test]
    fn first_load_reads_through_the_next_slab_and_fires_only_due_timers() {
        let mut queue = loaded(
            100,
            150,
            &[timer(120, "a"), timer(160, "b"), timer(250, "c")],
        );
        assert_eq!(queue.frontier(), Some(SlabId(2)), "slabs 0..=2 read");
        assert_eq!(keys(&queue.take_due(t(150), 10)), vec![(120, "a".into())]);
        assert!(queue.take_due(t(159), 10).is_empty(), "nothing early");
        assert_eq!(queue.next_due(10), Some(t(160)));
        assert_eq!(keys(&queue.take_due(t(300), 10)).len(), 2);
    }

    #[test]
    fn frontier_moves_one_slab_ahead_as_time_enters_it() {
        let mut queue = loaded(100, 150, &[]);
        assert_eq!(queue.begin_load(t(199)), None, "still in slab 1");
        let plan = queue.begin_load(t(200)).unwrap();
        assert_eq!((plan.from, plan.through), (SlabId(3), SlabId(3)));
        assert!(queue.merge(vec![timer(350, "x")]));
        queue.end_load(LoadEnd::Complete);
        assert_eq!(queue.frontier(), Some(SlabId(3)));
        assert_eq!(queue.pending(), 1);
    }

    #[test]
    fn writes_are_mirrored_only_within_the_loaded_window() {
        let mut queue = loaded(100, 150, &[]);
        let key = Key::from("k");
        queue.apply(&key, &TimerWrite::Schedule(APP, t(170)));
        queue.apply(&key, &TimerWrite::Schedule(APP, t(170)));
        queue.apply(&key, &TimerWrite::Schedule(APP, t(999)));
        assert_eq!(
            queue.pending(),
            1,
            "upsert, and the far future stays in the store"
        );
        queue.apply(&key, &TimerWrite::ClearAndSchedule(APP, t(180)));
        assert_eq!(queue.next_due(10), Some(t(180)));
        queue.apply(&key, &TimerWrite::Unschedule(APP, t(180)));
        assert_eq!(queue.pending(), 0);
    }

    #[test]
    fn a_timer_removed_while_in_flight_is_no_longer_live() {
        let mut queue = loaded(100, 150, &[timer(120, "a"), timer(121, "b")]);
        let fired = queue.take_due(t(150), 10);
        assert!(fired.iter().all(|timer| queue.is_live(timer)));
        queue.apply(&Key::from("a"), &TimerWrite::Clear(APP));
        assert!(!queue.is_live(&fired[0]));
        assert!(queue.is_live(&fired[1]));
    }

    #[test]
    fn firing_is_bounded_and_a_rescheduled_firing_timer_waits_for_itself() {
        let mut queue = loaded(
            100,
            150,
            &[timer(110, "a"), timer(111, "b"), timer(112, "c")],
        );
        let fired = queue.take_due(t(150), 2);
        assert_eq!(fired.len(), 2);
        assert_eq!(queue.next_due(2), None, "at the firing limit");
        // a's handler schedules its own second again before finishing.
        queue.apply(&Key::from("a"), &TimerWrite::Schedule(APP, t(110)));
        queue.finished(&fired[1], true);
        assert_eq!(keys(&queue.take_due(t(150), 2)), vec![(112, "c".into())]);
        queue.finished(&fired[0], true);
        assert_eq!(keys(&queue.take_due(t(150), 3)), vec![(110, "a".into())]);
    }

    #[test]
    fn abandoned_timers_are_pending_again_and_cancelled_ones_are_not() {
        let mut queue = loaded(100, 150, &[timer(110, "a"), timer(111, "b")]);
        let fired = queue.take_due(t(150), 10);
        queue.apply(&Key::from("b"), &TimerWrite::Unschedule(APP, t(111)));
        queue.finished(&fired[0], false);
        queue.finished(&fired[1], false);
        assert_eq!(keys(&queue.take_due(t(150), 10)), vec![(110, "a".into())]);
    }

    #[test]
    fn a_stale_listing_does_not_resurrect_removed_or_finished_timers() {
        let mut queue = loaded(100, 150, &[timer(110, "done")]);
        let fired = queue.take_due(t(150), 10);
        let plan = queue.begin_load(t(200)).unwrap();
        assert_eq!(plan.through, SlabId(3));
        // While slab 3 is listed: a write removes x, the fired timer finishes, and y is
        // scheduled in the slab being loaded (beyond the old frontier: it waits).
        queue.apply(&Key::from("x"), &TimerWrite::Unschedule(APP, t(310)));
        queue.finished(&fired[0], true);
        queue.apply(&Key::from("y"), &TimerWrite::Schedule(APP, t(320)));
        queue.apply(&Key::from("z"), &TimerWrite::Clear(APP));
        // The listing was taken before those writes.
        assert!(queue.merge(vec![timer(110, "done"), timer(310, "x"), timer(330, "z")]));
        queue.end_load(LoadEnd::Complete);
        assert_eq!(keys(&queue.take_due(t(400), 10)), vec![(320, "y".into())]);
    }

    #[test]
    fn capacity_truncates_and_a_drained_queue_refills_from_the_limit() {
        let listed: Vec<StoredTimer> = (0..10).map(|i| timer(110 + i, &format!("k{i}"))).collect();
        let mut queue = loaded(4, 150, &listed);
        assert_eq!(queue.pending(), 4);
        assert!(queue.is_truncated());
        // A write beyond the limit is left to the store.
        queue.apply(&Key::from("late"), &TimerWrite::Schedule(APP, t(118)));
        assert_eq!(queue.pending(), 4);
        assert_eq!(queue.begin_load(t(150)), None, "not drained yet");
        let first = queue.take_due(t(150), 2);
        assert_eq!(keys(&first), vec![(110, "k0".into()), (111, "k1".into())]);
        let plan = queue.begin_load(t(150)).unwrap();
        assert_eq!(plan.after, Some(timer(114, "k4")));
        let mut store = listed.clone();
        store.push(timer(118, "late"));
        store.sort();
        assert!(!queue.merge(store), "full again");
        queue.end_load(LoadEnd::StoppedAt(SlabId(plan.through.0 + 1)));
        assert_eq!(queue.pending(), 4);
        for timer in &first {
            queue.finished(timer, true);
        }
        let mut fired = Vec::new();
        loop {
            let due = queue.take_due(t(150), 100);
            if due.is_empty() {
                let Some(plan) = queue.begin_load(t(150)) else {
                    break;
                };
                let mut store = listed.clone();
                store.push(timer(118, "late"));
                store.retain(|timer| plan.after.as_ref().is_none_or(|after| timer >= after));
                let full = !queue.merge(store);
                queue.end_load(if full {
                    LoadEnd::StoppedAt(SlabId(plan.through.0 + 1))
                } else {
                    LoadEnd::Complete
                });
                continue;
            }
            for timer in &due {
                queue.finished(timer, true);
            }
            fired.extend(due);
        }
        assert_eq!(
            fired.len(),
            9,
            "k2..k9 and late, each once: {:?}",
            keys(&fired)
        );
        assert!(!queue.is_truncated());
    }

    #[test]
    fn a_failed_load_leaves_the_rest_to_a_refill() {
        let mut queue = TimerQueue::new(size(), 100);
        let plan = queue.begin_load(t(150)).unwrap();
        assert!(queue.merge(vec![timer(50, "old")]));
        queue.end_load(LoadEnd::StoppedAt(SlabId(1)));
        assert!(queue.is_truncated());
        queue.apply(&Key::from("k"), &TimerWrite::Schedule(APP, t(160)));
        assert_eq!(
            queue.pending(),
            1,
            "slab 1 is not loaded: left to the store"
        );
        let refill = queue.begin_load(t(150)).unwrap();
        assert_eq!(refill.from, SlabId(1));
        assert_eq!(refill.through, plan.through);
        assert!(queue.merge(vec![timer(160, "k")]));
        queue.end_load(LoadEnd::Complete);
        assert!(!queue.is_truncated());
        assert_eq!(queue.pending(), 2);
    }
}
