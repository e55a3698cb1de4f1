//! The work of one assigned partition: its key queues, its backlog bound and its offsets.
//!
//! This is plain synchronous state, changed under the engine's lock; the engine spawns the key
//! runners and talks to Kafka. Keeping the rules here (what is admitted, what is held, when to
//! pause and resume, which offset is committable) makes them testable without a broker or a
//! runtime.
//!
//! A key is *active* while it has an entry in `keys`: at most one runner serves an active key
//! and takes its events one at a time, which is what keeps a key's events in order and never
//! concurrent. The entry is removed by the runner itself, under the lock, when it finds the
//! queue empty, so an event offered concurrently either lands in the queue the runner will
//! still see or starts a new runner.
//!
//! Runners are few and long-lived rather than one per active key: a partition has at most
//! `max_runners` (the engine's concurrency limit, so one partition alone can still use every
//! permit), and an active key beyond them waits in `ready` for one. A runner whose key has
//! nothing more takes the next ready key instead of stopping, and one whose key has more
//! while others wait moves it to the back of `ready` and serves the front one, so every active
//! key keeps its turn. A runner that finds no key waiting parks rather than ends, and the next
//! key that becomes active is handed to a parked runner before a new one is started; runners
//! end only with the assignment. Spawning a task per key cost a task allocation (cache-line
//! aligned, a slow path of the allocator), its registration and its teardown for nearly every
//! record, and even with runners taking turns about every other record still started one: with
//! a fast handler a partition's runners were mostly out of keys, ended, and were started again
//! by the next record.

use prosody_api::{Key, Offset};
use std::collections::VecDeque;
use std::collections::hash_map::Entry;

use super::offsets::OffsetTracker;
use super::work::Keyed;
use crate::hashing::KeyMap;

/// Emptied key queues kept for keys that become active later (see `PartitionWork::spare`).
const SPARE_QUEUES: usize = 64;

/// A spare queue that grew past this (a key that had a long backlog) is freed instead of kept.
const SPARE_QUEUE_CAPACITY: usize = 8;

/// What happened to an offered event.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// The key was idle, no runner is parked and the partition has room for another runner:
    /// start one for it.
    StartRunner(Key),
    /// The key was idle and waits in `ready` for a parked runner: wake one.
    WakeRunner,
    /// The event waits in its key's queue: behind the key's earlier events, or for a runner.
    Queued,
    /// The backlog is full; the event is held outside the backlog until it drains.
    Held,
    /// The offset was already received (a redelivery after a seek); the event is dropped.
    Duplicate,
    /// The partition is being revoked; the event is dropped (it stays uncommitted).
    Revoked,
}

/// What a runner does after an event of its key finished.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Go on with the same key: it has more queued and no other key waits for a runner.
    Same,
    /// Serve this key next: it waited for a runner (the runner's own key, if it has more,
    /// now waits in its place).
    Switch(Key),
    /// Park: nothing waits for a runner. The runner stays one of the partition's runners and
    /// waits for a wake, then asks [`PartitionWork::take_ready`] for its key.
    Park,
    /// Stop: the partition was revoked.
    Stop,
}

/// What the engine must do after an event finished.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Keys that became active by admitting held events and got a new runner: start one for
    /// each.
    pub start: Vec<Key>,
    /// Parked runners owed a wake for keys that became active by admitting held events.
    pub wake: usize,
    /// The backlog drained enough: resume the partition in Kafka.
    pub resume: bool,
    /// The partition is revoked and nothing runs any more: wake whoever waits for the drain.
    pub drained: bool,
}

/// The work of one assigned partition; `T` is what waits in the key queues.
#[derive(Debug)]
pub struct PartitionWork<T> {
    generation: u64,
    max_backlog: usize,
    tracker: OffsetTracker,
    keys: KeyMap<Key, VecDeque<T>>,
    /// Queues of keys that became idle, reused for keys that become active: most keys hold one
    /// event at a time, so a fresh queue per key cost an allocation and a free per record.
    spare: Vec<VecDeque<T>>,
    /// Active keys without a runner, in the order they are served.
    ready: VecDeque<Key>,
    /// Runners serving this assignment, parked ones included.
    runners: usize,
    /// Runners parked with no key and not yet owed a wake: each key that becomes active while
    /// one is parked goes to `ready` and takes one wake.
    parked: usize,
    max_runners: usize,
    held: VecDeque<T>,
    backlog: usize,
    running: usize,
    paused: bool,
    pause_pending: bool,
    revoked: bool,
}

impl<T: Keyed> PartitionWork<T> {
    /// Fresh work for a newly assigned partition. `generation` distinguishes this assignment
    /// from earlier ones of the same partition, so runners of a revoked assignment cannot
    /// touch a later one. `max_backlog` (>= 1) bounds queued plus running events;
    /// `max_runners` (>= 1) bounds the runners serving its keys.
    #[must_use]
    pub fn new(generation: u64, max_backlog: usize, max_runners: usize) -> Self {
        Self {
            generation,
            max_backlog: max_backlog.max(1),
            tracker: OffsetTracker::new(),
            keys: KeyMap::default(),
            spare: Vec::new(),
            ready: VecDeque::new(),
            runners: 0,
            parked: 0,
            max_runners: max_runners.max(1),
            held: VecDeque::new(),
            backlog: 0,
            running: 0,
            paused: false,
            pause_pending: false,
            revoked: false,
        }
    }

    /// This assignment's generation.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Offers a received event: admits it into its key's queue, or holds it when the backlog is
    /// full.
    pub fn offer(&mut self, event: T) -> Offer {
        if self.revoked {
            return Offer::Revoked;
        }
        if let Some(offset) = event.offset()
            && !self.tracker.receive(offset)
        {
            return Offer::Duplicate;
        }
        if !self.held.is_empty() || self.backlog >= self.max_backlog {
            self.held.push_back(event);
            self.pause();
            return Offer::Held;
        }
        let offer = self.admit(event);
        if self.backlog >= self.max_backlog {
            self.pause();
        }
        offer
    }

    /// Offers a due timer: admitted at once, even when the backlog is full. A timer has no
    /// offset to hold back and is bounded by its manager; holding it behind records would let
    /// a busy partition delay its timers without limit.
    pub fn offer_timer(&mut self, event: T) -> Offer {
        if self.revoked {
            return Offer::Revoked;
        }
        self.admit(event)
    }

    fn pause(&mut self) {
        if !self.paused {
            self.paused = true;
            self.pause_pending = true;
        }
    }

    /// True once after the partition became paused (its backlog filled up): the caller pauses
    /// it in Kafka.
    pub fn take_pause(&mut self) -> bool {
        std::mem::take(&mut self.pause_pending)
    }

    fn admit(&mut self, event: T) -> Offer {
        self.backlog += 1;
        match self.keys.entry(event.key().clone()) {
            Entry::Occupied(mut queue) => {
                queue.get_mut().push_back(event);
                Offer::Queued
            }
            Entry::Vacant(slot) => {
                let key = slot.key().clone();
                let mut queue = self.spare.pop().unwrap_or_default();
                queue.push_back(event);
                slot.insert(queue);
                if self.parked > 0 {
                    self.parked -= 1;
                    self.ready.push_back(key);
                    Offer::WakeRunner
                } else if self.runners < self.max_runners {
                    self.runners += 1;
                    Offer::StartRunner(key)
                } else {
                    self.ready.push_back(key);
                    Offer::Queued
                }
            }
        }
    }

    /// Records a received offset that produces no event (an undecodable record) as done at
    /// once, so it neither occupies the backlog nor blocks the watermark.
    pub fn skip(&mut self, offset: Offset) {
        if self.tracker.receive(offset) {
            self.tracker.complete(offset);
        }
    }

    /// The runner of `key` takes the key's next event. `None` when the partition was revoked
    /// (the runner stops) or the queue is empty, which the runner then settles with
    /// [`Self::after_event`] like the end of an event.
    pub fn next_for(&mut self, key: &Key) -> Option<T> {
        if self.revoked {
            return None;
        }
        let event = self.keys.get_mut(key)?.pop_front()?;
        self.running += 1;
        Some(event)
    }

    /// What the runner of `key` does next, after an event of the key finished (and after
    /// [`Self::finish`] recorded it). A key with nothing more queued becomes idle. Decided under
    /// the same lock as the finish, so the runner never asks for an admission permit it would
    /// not use, and an event offered concurrently is either seen here or wakes or starts a
    /// runner.
    pub fn after_event(&mut self, key: &Key) -> Next {
        if self.revoked {
            return Next::Stop;
        }
        let more = self.keys.get(key).is_some_and(|queue| !queue.is_empty());
        if !more
            && let Some(queue) = self.keys.remove(key)
            && self.spare.len() < SPARE_QUEUES
            && queue.capacity() <= SPARE_QUEUE_CAPACITY
        {
            self.spare.push(queue);
        }
        match self.ready.pop_front() {
            Some(next) => {
                if more {
                    self.ready.push_back(key.clone());
                }
                Next::Switch(next)
            }
            None if more => Next::Same,
            None => {
                self.parked += 1;
                Next::Park
            }
        }
    }

    /// What a parked runner serves after a wake: the front `ready` key, or [`Next::Park`]
    /// again when a busy runner took it first, or [`Next::Stop`] once the partition was
    /// revoked.
    pub fn take_ready(&mut self) -> Next {
        if self.revoked {
            return Next::Stop;
        }
        if let Some(key) = self.ready.pop_front() {
            return Next::Switch(key);
        }
        self.parked += 1;
        Next::Park
    }

    /// Records that an event taken with [`Self::next_for`] finished (successfully or given up
    /// by the failure policy: either way its offset may be committed).
    pub fn finish(&mut self, offset: Option<Offset>) -> Finished {
        self.running = self.running.saturating_sub(1);
        self.backlog = self.backlog.saturating_sub(1);
        // A handler that finishes during a revocation's drain still counts: its offset is part
        // of the final commit.
        if let Some(offset) = offset {
            self.tracker.complete(offset);
        }
        let mut finished = Finished::default();
        if self.revoked {
            finished.drained = self.running == 0;
            return finished;
        }
        while self.backlog < self.max_backlog
            && let Some(event) = self.held.pop_front()
        {
            match self.admit(event) {
                Offer::StartRunner(key) => finished.start.push(key),
                Offer::WakeRunner => finished.wake += 1,
                Offer::Queued | Offer::Held | Offer::Duplicate | Offer::Revoked => {}
            }
        }
        // Resume only once half the backlog is free: resuming at the first free slot would
        // pause again at once, and every pause makes librdkafka drop and refetch its buffer.
        if self.paused && self.held.is_empty() && self.backlog <= self.max_backlog / 2 {
            self.paused = false;
            finished.resume = true;
        }
        finished
    }

    /// Stops dispatching: queued and held events are dropped (their offsets stay uncommitted,
    /// so the next owner handles them). Returns true when nothing is running any more.
    pub fn revoke(&mut self) -> bool {
        self.revoked = true;
        self.keys.clear();
        self.ready.clear();
        self.held.clear();
        self.backlog = self.running;
        self.running == 0
    }

    /// The position to commit: every earlier offset is done.
    #[must_use]
    pub fn committable(&self) -> Option<Offset> {
        self.tracker.committable()
    }

    /// How many more events are admitted before the backlog is full; 0 while paused.
    #[must_use]
    pub fn room(&self) -> usize {
        if self.paused || self.revoked || !self.held.is_empty() {
            0
        } else {
            self.max_backlog.saturating_sub(self.backlog)
        }
    }

    /// Events queued or running (held events excluded).
    #[must_use]
    pub fn backlog(&self) -> usize {
        self.backlog
    }

    /// Handlers running now.
    #[must_use]
    pub fn running(&self) -> usize {
        self.running
    }

    /// Events received but waiting for the backlog to drain.
    #[must_use]
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// True while the partition is paused in Kafka because its backlog is full.
    #[must_use]
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// True when nothing is queued, running or held.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.backlog == 0 && self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use prosody_api::{Headers, Message, Partition, Timestamp, Topic};
    use serde_json::json;

    use super::*;
    use crate::event::Event;

    fn event(key: &str, offset: i64) -> Event {
        Event::Message(Message {
            topic: Topic::from("t"),
            partition: Partition(0),
            offset: Offset(offset),
            timestamp: Timestamp::from_millis(0),
            key: Key::from(key),
            payload: json!({ "n": offset }).into(),
            headers: Headers::new(),
        })
    }

    fn work(max_backlog: usize) -> PartitionWork<Event> {
        PartitionWork::new(1, max_backlog, 100)
    }

    #[test]
    fn a_finished_key_with_nothing_queued_is_released_at_once() {
        let mut work = work(10);
        let a = Key::from("a");
        work.offer(event("a", 0));
        assert_eq!(work.next_for(&a).and_then(|e| e.offset()), Some(Offset(0)));
        work.offer(event("a", 1));
        work.finish(Some(Offset(0)));
        assert_eq!(
            work.after_event(&a),
            Next::Same,
            "offset 1 waits: the runner goes on"
        );
        assert_eq!(work.next_for(&a).and_then(|e| e.offset()), Some(Offset(1)));
        work.finish(Some(Offset(1)));
        assert_eq!(
            work.after_event(&a),
            Next::Park,
            "nothing queued: the key is idle and its runner parks"
        );
        assert_eq!(
            work.offer(event("a", 2)),
            Offer::WakeRunner,
            "an idle key's next event goes to the parked runner"
        );
        assert_eq!(work.take_ready(), Next::Switch(a.clone()));
        work.revoke();
        assert_eq!(
            work.after_event(&a),
            Next::Stop,
            "a revoked partition runs nothing"
        );
    }

    #[test]
    fn one_runner_per_key_in_offer_order() {
        let mut work = work(10);
        assert_eq!(
            work.offer(event("a", 0)),
            Offer::StartRunner(Key::from("a"))
        );
        assert_eq!(
            work.offer(event("b", 1)),
            Offer::StartRunner(Key::from("b"))
        );
        assert_eq!(work.offer(event("a", 2)), Offer::Queued);
        let a = Key::from("a");
        assert_eq!(work.next_for(&a).and_then(|e| e.offset()), Some(Offset(0)));
        assert_eq!(
            work.offer(event("a", 3)),
            Offer::Queued,
            "a is still active"
        );
        work.finish(Some(Offset(0)));
        assert_eq!(work.after_event(&a), Next::Same);
        assert_eq!(work.next_for(&a).and_then(|e| e.offset()), Some(Offset(2)));
        work.finish(Some(Offset(2)));
        assert_eq!(work.after_event(&a), Next::Same);
        assert_eq!(work.next_for(&a).and_then(|e| e.offset()), Some(Offset(3)));
        work.finish(Some(Offset(3)));
        assert_eq!(work.next_for(&a), None, "queue empty");
        assert_eq!(work.after_event(&a), Next::Park, "the runner parks");
        assert_eq!(
            work.offer(event("a", 4)),
            Offer::WakeRunner,
            "idle key starts again, on the parked runner"
        );
        assert_eq!(
            work.committable(),
            Some(Offset(1)),
            "b (offset 1) still pending"
        );
    }

    #[test]
    fn full_backlog_holds_pauses_once_and_resumes_at_half() {
        let mut work = work(4);
        for offset in 0..4 {
            let offer = work.offer(event(&format!("k{offset}"), offset));
            assert!(matches!(offer, Offer::StartRunner(_)));
            assert_eq!(
                work.take_pause(),
                offset == 3,
                "pauses when the backlog fills"
            );
        }
        assert_eq!(work.room(), 0);
        assert_eq!(work.offer(event("k9", 4)), Offer::Held);
        assert_eq!(work.offer(event("k9", 5)), Offer::Held);
        assert!(!work.take_pause(), "already paused");
        assert!(work.is_paused());
        assert_eq!(work.backlog(), 4);

        let k0 = Key::from("k0");
        work.next_for(&k0);
        let finished = work.finish(Some(Offset(0)));
        assert_eq!(
            finished.start,
            vec![Key::from("k9")],
            "one held event admitted"
        );
        assert!(!finished.resume, "still held events");
        assert_eq!(work.backlog(), 4);
        assert_eq!(work.held(), 1);

        for key in ["k1", "k2"] {
            work.next_for(&Key::from(key));
        }
        let finished = work.finish(Some(Offset(1)));
        assert!(
            finished.start.is_empty(),
            "k9 already active: queued behind it"
        );
        assert!(!finished.resume, "backlog 4 of 4");
        let finished = work.finish(Some(Offset(2)));
        assert!(!finished.resume, "backlog 3 of 4: above half");
        work.next_for(&Key::from("k3"));
        let finished = work.finish(Some(Offset(3)));
        assert!(finished.resume, "backlog 2 of 4: resume");
        assert!(!work.is_paused());
        assert_eq!(work.committable(), Some(Offset(4)));
    }

    #[test]
    fn revoke_drops_queued_and_held_and_reports_drain() {
        let mut work = work(2);
        work.offer(event("a", 0));
        work.offer(event("a", 1));
        work.offer(event("b", 2));
        let a = Key::from("a");
        work.next_for(&a);
        assert!(!work.revoke(), "a is running");
        assert_eq!(work.offer(event("c", 3)), Offer::Revoked);
        assert_eq!(work.next_for(&a), None, "no more dispatch after revoke");
        let finished = work.finish(Some(Offset(0)));
        assert!(finished.drained);
        assert_eq!(
            work.committable(),
            Some(Offset(1)),
            "the drained handler's offset commits; dropped ones stay uncommitted"
        );
    }

    #[test]
    fn runners_are_capped_and_waiting_keys_take_turns() {
        let mut work = PartitionWork::new(1, 100, 2);
        let [a, b, c, d] = ["a", "b", "c", "d"].map(Key::from);
        assert_eq!(work.offer(event("a", 0)), Offer::StartRunner(a.clone()));
        assert_eq!(work.offer(event("b", 1)), Offer::StartRunner(b.clone()));
        for (key, offset) in [("c", 2), ("d", 3), ("a", 4)] {
            assert_eq!(work.offer(event(key, offset)), Offer::Queued, "{key}");
        }
        // The first runner's key has more, but c and d wait: it serves c, and a waits last.
        assert_eq!(work.next_for(&a).and_then(|e| e.offset()), Some(Offset(0)));
        work.finish(Some(Offset(0)));
        assert_eq!(work.after_event(&a), Next::Switch(c.clone()));
        // The second runner's key is done: it serves d instead of stopping.
        assert_eq!(work.next_for(&b).and_then(|e| e.offset()), Some(Offset(1)));
        work.finish(Some(Offset(1)));
        assert_eq!(work.after_event(&b), Next::Switch(d.clone()));
        assert_eq!(work.next_for(&c).and_then(|e| e.offset()), Some(Offset(2)));
        work.finish(Some(Offset(2)));
        assert_eq!(
            work.after_event(&c),
            Next::Switch(a.clone()),
            "a's turn again"
        );
        assert_eq!(work.next_for(&d).and_then(|e| e.offset()), Some(Offset(3)));
        work.finish(Some(Offset(3)));
        assert_eq!(work.after_event(&d), Next::Park, "nothing waits");
        assert_eq!(
            work.offer(event("c", 5)),
            Offer::WakeRunner,
            "the parked runner serves the next active key"
        );
        assert_eq!(work.take_ready(), Next::Switch(c));
        assert_eq!(work.next_for(&a).and_then(|e| e.offset()), Some(Offset(4)));
        work.finish(Some(Offset(4)));
        assert_eq!(work.after_event(&a), Next::Park);
        assert_eq!(
            work.committable(),
            Some(Offset(5)),
            "c's offset 5 is pending"
        );
    }

    #[test]
    fn parked_runners_are_woken_for_new_keys_before_new_runners_start() {
        let mut work = PartitionWork::new(1, 3, 4);
        let [a, b, c, d] = ["a", "b", "c", "d"].map(Key::from);
        assert_eq!(work.offer(event("a", 0)), Offer::StartRunner(a.clone()));
        assert_eq!(work.offer(event("b", 1)), Offer::StartRunner(b.clone()));
        work.next_for(&a);
        work.finish(Some(Offset(0)));
        assert_eq!(work.after_event(&a), Next::Park);
        assert_eq!(
            work.offer(event("c", 2)),
            Offer::WakeRunner,
            "a parked runner is used before a third one starts"
        );
        assert_eq!(work.offer(event("d", 3)), Offer::StartRunner(d.clone()));
        // b's runner finishes first and takes c; the woken runner finds nothing and parks
        // again, owed no wake until another key becomes active.
        work.next_for(&b);
        work.finish(Some(Offset(1)));
        assert_eq!(work.after_event(&b), Next::Switch(c.clone()));
        assert_eq!(work.take_ready(), Next::Park);
        // A held event admitted by a finish wakes the parked runner too.
        assert_eq!(
            work.offer(event("d", 4)),
            Offer::Queued,
            "the backlog is full"
        );
        assert_eq!(work.offer(event("a", 5)), Offer::Held);
        work.next_for(&c);
        let finished = work.finish(Some(Offset(2)));
        assert_eq!((finished.start, finished.wake), (vec![], 1));
        assert_eq!(work.take_ready(), Next::Switch(a));
        work.revoke();
        assert_eq!(work.take_ready(), Next::Stop, "revoked: parked runners end");
        assert_eq!(work.after_event(&d), Next::Stop);
    }

    #[test]
    fn a_revocation_forgets_keys_waiting_for_a_runner() {
        let mut work = PartitionWork::new(1, 100, 1);
        let a = Key::from("a");
        assert_eq!(work.offer(event("a", 0)), Offer::StartRunner(a.clone()));
        assert_eq!(work.offer(event("b", 1)), Offer::Queued);
        work.next_for(&a);
        work.revoke();
        work.finish(Some(Offset(0)));
        assert_eq!(work.after_event(&a), Next::Stop, "b is not served");
        assert_eq!(work.committable(), Some(Offset(1)));
    }

    #[test]
    fn duplicates_after_seek_are_dropped() {
        let mut work = work(4);
        work.offer(event("a", 5));
        assert_eq!(work.offer(event("a", 5)), Offer::Duplicate);
        assert_eq!(work.offer(event("a", 4)), Offer::Duplicate);
    }
}
