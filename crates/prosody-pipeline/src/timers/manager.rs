//! The timer manager of one assigned partition: a task that loads slabs near now into a
//! [`TimerQueue`], sleeps until the next timer is due, and fires due timers into the engine's
//! key queues through a [`TimerSink`].
//!
//! It never removes a timer from the store: the dispatch does, when the timer's event
//! completes (see [`super::StagedTimers::commit`]), so a timer whose handler failed or was cut
//! short by a revocation stays stored for the next attempt or the next owner.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use prosody_api::storage::{PartitionScope, StoredTimer, TimerStore};
use prosody_api::{Clock, Key, StorageError, Timer, TimerTime};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::queue::{LoadEnd, LoadPlan, TimerQueue, TimerWrite};
use super::{QueueStats, TimerSettings, TimerSink};
use crate::consumer::TopicPartition;
use crate::event::FiredTimer;

/// The shared state of one partition's manager: its queue, and the signals of its task.
pub(crate) struct PartitionTimers {
    partition: TopicPartition,
    scope: PartitionScope,
    queue: Mutex<TimerQueue>,
    wake: Notify,
    stop: CancellationToken,
    settings: TimerSettings,
}

impl PartitionTimers {
    pub(crate) fn new(
        partition: TopicPartition,
        scope: PartitionScope,
        store: &dyn TimerStore,
        settings: TimerSettings,
    ) -> Self {
        Self {
            queue: Mutex::new(TimerQueue::new(store.slab_size(), settings.capacity)),
            partition,
            scope,
            wake: Notify::new(),
            stop: CancellationToken::new(),
            settings,
        }
    }

    /// Mirrors a write that landed in the store.
    pub(crate) fn apply(&self, key: &Key, write: &TimerWrite) {
        self.queue.lock().apply(key, write);
        self.wake.notify_one();
    }

    pub(crate) fn is_live(&self, timer: &StoredTimer) -> bool {
        self.queue.lock().is_live(timer)
    }

    pub(crate) fn finished(&self, timer: &StoredTimer, done: bool) {
        self.queue.lock().finished(timer, done);
        self.wake.notify_one();
    }

    /// Stops firing at once; the task ends at its next await.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    pub(crate) fn stats(&self) -> QueueStats {
        let queue = self.queue.lock();
        QueueStats {
            pending: queue.pending(),
            in_flight: queue.in_flight(),
            frontier: queue.frontier(),
            truncated: queue.is_truncated(),
            loading: queue.is_loading(),
        }
    }

    /// The manager's task: runs until stopped or until the engine no longer takes its timers.
    pub(crate) async fn run(
        self: Arc<Self>,
        store: Arc<dyn TimerStore>,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn TimerSink>,
    ) {
        let mut failures = 0_u32;
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            let now = TimerTime::from_system_time(clock.now());
            let plan = self.queue.lock().begin_load(now);
            if let Some(plan) = plan {
                let started = Instant::now();
                let loading = self.load(store.as_ref(), &plan);
                let (end, failure) = tokio::select! {
                    biased;
                    () = self.stop.cancelled() => return,
                    loaded = loading => loaded,
                };
                self.queue.lock().end_load(end);
                if let Some(error) = failure {
                    failures = failures.saturating_add(1);
                    let delay = retry_delay(failures);
                    warn!(partition = %self.partition, %error, retry_in = ?delay,
                        "loading timers failed");
                    if !self.sleep(delay).await {
                        return;
                    }
                } else {
                    failures = 0;
                    debug!(partition = %self.partition, from = plan.from.0,
                        through = plan.through.0, ?end, elapsed = ?started.elapsed(),
                        stats = ?self.stats(), "timers loaded");
                }
                continue;
            }
            let due = self.queue.lock().take_due(now, self.settings.max_in_flight);
            for timer in due {
                if !sink.fire(self.fired(timer)) {
                    // The engine dropped the partition: a revocation is stopping this task.
                    return;
                }
            }
            // Never longer than the recheck interval: the clock may jump (NTP), and a missed
            // wake-up must not delay timers for long.
            let delay = self
                .next_wake()
                .map_or(self.settings.recheck_interval, |wake_at| {
                    wake_at
                        .duration_since(clock.now())
                        .unwrap_or(Duration::ZERO)
                })
                .min(self.settings.recheck_interval);
            if !self.sleep(delay).await {
                return;
            }
        }
    }

    fn fired(&self, timer: StoredTimer) -> FiredTimer {
        FiredTimer {
            topic: self.partition.topic.clone(),
            partition: self.partition.partition,
            kind: timer.kind,
            timer: Timer {
                key: timer.key,
                time: timer.time,
            },
        }
    }

    /// The earlier of the next due timer and the start of the frontier slab (when the next
    /// slab must be read); `None` when there is neither.
    fn next_wake(&self) -> Option<SystemTime> {
        let queue = self.queue.lock();
        let due = queue.next_due(self.settings.max_in_flight);
        let advance = queue
            .frontier()
            .map(|frontier| frontier.start(queue.slab_size()));
        [due, advance]
            .into_iter()
            .flatten()
            .min()
            .map(TimerTime::to_system_time)
    }

    /// Sleeps for `delay` or until woken; false when stopped.
    async fn sleep(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => false,
            () = self.wake.notified() => true,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// Reads the plan's slabs in order, merging each, until done, full, or failed.
    async fn load(
        &self,
        store: &dyn TimerStore,
        plan: &LoadPlan,
    ) -> (LoadEnd, Option<StorageError>) {
        let slabs = match store.slabs(&self.scope, plan.through).await {
            Ok(slabs) => slabs,
            Err(error) => return (LoadEnd::StoppedAt(plan.from), Some(error)),
        };
        for slab in slabs.into_iter().filter(|slab| *slab >= plan.from) {
            let listed = match store.slab(&self.scope, slab).await {
                Ok(listed) => listed,
                Err(error) => return (LoadEnd::StoppedAt(slab), Some(error)),
            };
            if !self.queue.lock().merge(listed) {
                let next = prosody_api::SlabId(slab.0.saturating_add(1));
                return (LoadEnd::StoppedAt(next), None);
            }
        }
        (LoadEnd::Complete, None)
    }
}

/// Exponential from 100 ms, capped at 30 s: a store outage must not spin, and a short blip
/// must not stall timers for long.
fn retry_delay(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(9);
    Duration::from_millis(100 << exponent).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_and_cap() {
        assert_eq!(retry_delay(1), Duration::from_millis(100));
        assert_eq!(retry_delay(2), Duration::from_millis(200));
        assert_eq!(retry_delay(50), Duration::from_secs(30));
    }
}
