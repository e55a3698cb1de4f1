//! Readers of partition queues: each assigned partition's librdkafka queue is read by a task on
//! the async runtime, so the records of different partitions are taken from librdkafka,
//! captured and offered to the engine on every worker at once. Reading them all on the poll
//! thread made that thread a serial stage every record passed through (about a third of a
//! record's cost), and left the workers waiting for it.
//!
//! A reader runs when its queue becomes non-empty (librdkafka's callback) and when its
//! partition has room again (the engine's resume), and reads what the partition has room for.
//! At most one read of a partition runs at a time, so its records reach the engine in offset
//! order; a signal that arrives during a read makes the read go on rather than being lost.
//!
//! A reader starts inactive: records of a new assignment may have reached the consumer's main
//! queue before the partition's queue was split off, and the poll thread offers those first,
//! then activates the reader. Closing a reader waits for a read in progress and releases the
//! queue, which holds the consumer: no record is offered after the close (the revocation that
//! follows drains what was offered), and the consumer is never closed from a runtime worker
//! by a task that held on to the queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::ConsumerContext;
use rdkafka::consumer::base_consumer::PartitionQueue;
use tokio::runtime::Handle;
use tracing::{error, warn};

use super::engine::Engine;
use super::topic_partition::TopicPartition;
use super::work::Work;
use crate::event::Event;
use crate::kafka::decode::{DecodeLimits, capture, reject};

/// Records read in one go before the reader yields its worker to other tasks.
const BATCH: usize = 256;

/// No read is scheduled or running.
const IDLE: u8 = 0;
/// A read task is spawned and has not started.
const SCHEDULED: u8 = 1;
/// A read is running.
const READING: u8 = 2;
/// A read is running and was signalled since it started: it reads once more before idling.
const SIGNALLED: u8 = 3;

/// The reader of one assigned partition's queue.
pub struct PartitionReader<C: ConsumerContext + 'static> {
    partition: TopicPartition,
    engine: Engine,
    limits: DecodeLimits,
    runtime: Handle,
    active: AtomicBool,
    state: AtomicU8,
    /// The queue, `None` once closed. Locked for the whole of a read.
    queue: Mutex<Option<PartitionQueue<C>>>,
    /// What a read fills and offers, kept from read to read: a full batch is tens of
    /// kilobytes, which glibc serves from its slow path (consolidating its free lists first)
    /// when it is allocated anew for every read.
    batch: Mutex<Vec<Work>>,
}

impl<C: ConsumerContext + 'static> PartitionReader<C> {
    /// An inactive reader of `partition`; give it its queue with [`Self::attach`].
    #[must_use]
    pub fn new(
        partition: TopicPartition,
        engine: Engine,
        limits: DecodeLimits,
        runtime: Handle,
    ) -> Arc<Self> {
        Arc::new(Self {
            partition,
            engine,
            limits,
            runtime,
            active: AtomicBool::new(false),
            state: AtomicU8::new(IDLE),
            queue: Mutex::new(None),
            batch: Mutex::new(Vec::new()),
        })
    }

    /// Gives the reader its queue and has librdkafka signal the reader whenever the queue
    /// becomes non-empty. The reader still reads nothing until [`Self::activate`].
    pub fn attach(self: &Arc<Self>, mut queue: PartitionQueue<C>) {
        let reader = Arc::downgrade(self);
        queue.set_nonempty_callback(move || {
            if let Some(reader) = reader.upgrade() {
                reader.signal();
            }
        });
        *self.queue.lock() = Some(queue);
    }

    /// Starts reading, once: what is queued now and whatever arrives later. Calling it on an
    /// active reader does nothing.
    pub fn activate(self: &Arc<Self>) {
        if !self.active.swap(true, Ordering::AcqRel) {
            self.signal();
        }
    }

    /// There may be something to read: reads unless a read is about to run or is running, in
    /// which case that read goes on. Ignored before [`Self::activate`].
    pub fn signal(self: &Arc<Self>) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let (next, spawn) = match state {
                IDLE => (SCHEDULED, true),
                READING => (SIGNALLED, false),
                // Scheduled (it has not read yet) or already signalled: that read covers this.
                _ => return,
            };
            match self
                .state
                .compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if spawn {
                        let reader = self.clone();
                        self.runtime.spawn(async move { reader.run().await });
                    }
                    return;
                }
                Err(now) => state = now,
            }
        }
    }

    /// Stops reading for good: waits for a read in progress and releases the queue. Must not
    /// be called on a runtime worker while that worker's own read could be pending (the poll
    /// thread calls it).
    pub fn close(&self) {
        self.active.store(false, Ordering::Release);
        drop(self.queue.lock().take());
    }

    async fn run(self: Arc<Self>) {
        self.state.store(READING, Ordering::Release);
        loop {
            let filled = {
                let queue = self.queue.lock();
                let Some(queue) = queue.as_ref() else {
                    // Closed: stay busy so no read is scheduled again.
                    return;
                };
                self.read(queue)
            };
            if filled {
                // More may be waiting: let other tasks run first, then read on.
                tokio::task::yield_now().await;
                continue;
            }
            // Nothing more to read (or no room): idle, unless signalled meanwhile.
            match self
                .state
                .compare_exchange(READING, IDLE, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(_) => self.state.store(READING, Ordering::Release),
            }
        }
    }

    /// Reads what the partition has room for, up to a batch, and offers it. True when it read
    /// all it had room for (there may be more). A record that cannot be captured is offered in its
    /// place as a rejected event for the failure policy.
    fn read(&self, queue: &PartitionQueue<C>) -> bool {
        let partition = &self.partition;
        let room = self.engine.room(partition).min(BATCH);
        let mut batch = self.batch.lock();
        batch.reserve(room);
        let mut received = 0;
        while received < room {
            match queue.poll(Duration::ZERO) {
                Some(Ok(record)) => {
                    received += 1;
                    match capture(&record, &partition.topic, &self.limits) {
                        Ok(captured) => batch.push(Work::Record(captured)),
                        Err(problem) => {
                            error!(%partition, %problem,
                                "record rejected: cannot decode; the mode's failure policy routes it");
                            // Queued in its place so its offset commits only once the policy ran.
                            let rejected = reject(&record, &problem, &self.limits);
                            batch.push(Work::Event(Event::Rejected(Box::new(rejected))));
                        }
                    }
                }
                Some(Err(error)) => warn!(%partition, %error, "partition error"),
                None => break,
            }
        }
        if !batch.is_empty() {
            self.engine.offer_batch(partition, &mut batch);
        }
        // Stopped at the limit rather than at an empty queue. No room at all means the
        // partition is paused, and its resume signals the reader.
        room > 0 && received == room
    }
}
