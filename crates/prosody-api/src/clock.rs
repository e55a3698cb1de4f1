//! Time sources. Stores judge TTL expiry against a [`Clock`] instead of reading the system time
//! themselves, so tests (and the conformance suite) can move time forward with a
//! [`ManualClock`] and check expiry without sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The operating system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to. Clones share one time, so a test keeps a clone and
/// advances the clock a store was built with.
#[derive(Clone, Debug)]
pub struct ManualClock {
    /// Milliseconds since the Unix epoch; an atomic rather than a lock so reading the time can
    /// neither block nor fail.
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// The default start: 2024-01-01T00:00:00Z, a fixed instant so test output is reproducible.
    pub const DEFAULT_START_SECS: u64 = 1_704_067_200;

    /// A clock at [`ManualClock::DEFAULT_START_SECS`].
    #[must_use]
    pub fn new() -> Self {
        Self::at(UNIX_EPOCH + Duration::from_secs(Self::DEFAULT_START_SECS))
    }

    /// A clock at `time` (millisecond precision; instants before the epoch clamp to it).
    #[must_use]
    pub fn at(time: SystemTime) -> Self {
        Self {
            millis: Arc::new(AtomicU64::new(to_millis(time))),
        }
    }

    /// Moves the clock to `time`; it may go backwards, which lets tests model clock skew.
    pub fn set(&self, time: SystemTime) {
        self.millis.store(to_millis(time), Ordering::SeqCst);
    }

    /// Moves the clock forward by `by` (millisecond precision).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .millis
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.millis.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

fn to_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let clock = ManualClock::new();
        let shared = clock.clone();
        let start = clock.now();
        assert_eq!(clock.now(), start);
        shared.advance(Duration::from_secs(90));
        assert_eq!(clock.now(), start + Duration::from_secs(90));
        clock.set(start);
        assert_eq!(shared.now(), start);
    }

    #[test]
    fn system_clock_is_after_the_manual_default_start() {
        assert!(SystemClock.now() > ManualClock::new().now());
    }
}
