//! The monotonic time the pipeline's bookkeeping is judged by (stall detection, failure-rate
//! windows, the run time the fair scheduler and monopolization charge): read at tick
//! resolution, since it is read once or more per record and judged over many records
//! ([`CoarseInstant`]), and injectable so that bookkeeping is tested without sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prosody_api::CoarseInstant;

/// A source of monotonic time at tick resolution.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> CoarseInstant;

    /// How far a reading may lag the time it stands for: a deadline judged on this clock
    /// adds it so it never fires early. Zero for a clock that is exact.
    fn tick(&self) -> Duration {
        Duration::ZERO
    }
}

/// The real monotonic clock at tick resolution ([`CoarseInstant::now`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> CoarseInstant {
        CoarseInstant::now()
    }

    fn tick(&self) -> Duration {
        CoarseInstant::tick()
    }
}

/// A clock that only moves when told to; for tests of anything that reads a [`Clock`].
#[derive(Debug)]
pub struct ManualClock {
    base: CoarseInstant,
    offset_nanos: AtomicU64,
}

impl ManualClock {
    /// A clock frozen at the moment of its creation.
    #[must_use]
    pub fn new() -> Self {
        Self {
            base: CoarseInstant::now(),
            offset_nanos: AtomicU64::new(0),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.offset_nanos
            .fetch_add(duration_nanos(by), Ordering::AcqRel);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> CoarseInstant {
        self.base + Duration::from_nanos(self.offset_nanos.load(Ordering::Acquire))
    }
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Tokio's clock as a [`Clock`]: under paused time (`start_paused` tests) it moves as tokio's
/// does, so bookkeeping sees the run times a test sleeps through.
#[cfg(test)]
#[derive(Debug)]
pub struct TokioClock {
    base: CoarseInstant,
    origin: tokio::time::Instant,
}

#[cfg(test)]
impl TokioClock {
    /// A clock reading tokio's time from now on.
    #[must_use]
    pub fn new() -> Self {
        Self {
            base: CoarseInstant::now(),
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(test)]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
impl Clock for TokioClock {
    fn now(&self) -> CoarseInstant {
        self.base + self.origin.elapsed()
    }
}
