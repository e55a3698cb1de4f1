//! The monotonic time the pipeline's bookkeeping is judged by (stall detection, failure-rate
//! windows): read at tick resolution, since it is read once or more per record and judged in
//! seconds ([`CoarseInstant`]), and injectable so that bookkeeping is tested without sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prosody_api::CoarseInstant;

/// A source of monotonic time at tick resolution.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> CoarseInstant;
}

/// The real monotonic clock at tick resolution ([`CoarseInstant::now`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> CoarseInstant {
        CoarseInstant::now()
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
