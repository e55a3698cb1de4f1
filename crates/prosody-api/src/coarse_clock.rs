//! Clocks read at the kernel's tick resolution (a few milliseconds), for bookkeeping judged
//! in seconds: stall detection, failure-rate windows, TTL expiry.
//!
//! A precise clock read costs about 30 ns here (the vDSO reads the TSC and scales it); with a
//! dozen reads per record it was the largest single cost in the consumer's profile. The
//! coarse clocks return the time of the last tick, kept by the kernel in memory the vDSO
//! maps, for about 6 ns. Durations measured in microseconds (a handler's run time in
//! telemetry) still need the precise clock; a deadline judged on this clock adds a tick
//! ([`CoarseInstant::tick`]) so it never fires early.

use std::ops::Add;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crate::clock::Clock;

/// A reading of a monotonic clock at tick resolution: never goes back, and lags the precise
/// monotonic clock by at most one tick. Only differences between readings mean anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CoarseInstant(Duration);

impl CoarseInstant {
    /// The current reading.
    #[must_use]
    pub fn now() -> Self {
        Self(read::monotonic())
    }

    /// Time from `earlier` to `self`, zero when `earlier` is later.
    #[must_use]
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// How far a reading may lag the precise clock: the kernel's tick (the coarse clock's
    /// resolution), asked once.
    #[must_use]
    pub fn tick() -> Duration {
        static TICK: OnceLock<Duration> = OnceLock::new();
        *TICK.get_or_init(read::tick)
    }
}

/// Later by the duration, saturating at the end of representable time.
impl Add<Duration> for CoarseInstant {
    type Output = Self;

    fn add(self, later: Duration) -> Self {
        Self(self.0.saturating_add(later))
    }
}

/// The wall clock at tick resolution: for TTL expiry, which is judged in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoarseSystemClock;

impl Clock for CoarseSystemClock {
    fn now(&self) -> SystemTime {
        read::wall()
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
mod read {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use rustix::time::{ClockId, Timespec, clock_getres, clock_gettime};

    pub(super) fn monotonic() -> Duration {
        duration(clock_gettime(ClockId::MonotonicCoarse))
    }

    pub(super) fn wall() -> SystemTime {
        UNIX_EPOCH + duration(clock_gettime(ClockId::RealtimeCoarse))
    }

    pub(super) fn tick() -> Duration {
        duration(clock_getres(ClockId::MonotonicCoarse))
    }

    /// The kernel keeps both fields in range; out-of-range values (a wall clock set before
    /// the epoch) clamp to zero.
    fn duration(time: Timespec) -> Duration {
        Duration::new(
            u64::try_from(time.tv_sec).unwrap_or(0),
            u32::try_from(time.tv_nsec).unwrap_or(0).min(999_999_999),
        )
    }
}

/// Elsewhere there is no coarse clock to ask for: the precise clocks stand in.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
mod read {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant, SystemTime};

    pub(super) fn monotonic() -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }

    pub(super) fn wall() -> SystemTime {
        SystemTime::now()
    }

    pub(super) fn tick() -> Duration {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// One tick is at most 10 ms on common kernels (`HZ=100`); the bound leaves room for a
    /// busy machine.
    const TICK_BOUND: Duration = Duration::from_millis(50);

    #[test]
    fn monotonic_readings_track_the_precise_clock_within_a_tick() {
        let coarse_start = CoarseInstant::now();
        let precise_start = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let coarse = CoarseInstant::now().saturating_duration_since(coarse_start);
        let precise = precise_start.elapsed();
        assert!(coarse + TICK_BOUND >= precise, "{coarse:?} vs {precise:?}");
        assert!(coarse <= precise + TICK_BOUND, "{coarse:?} vs {precise:?}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_tick_is_the_kernels() {
        let tick = CoarseInstant::tick();
        assert!(tick > Duration::ZERO && tick <= TICK_BOUND, "{tick:?}");
    }

    #[test]
    fn monotonic_readings_never_go_back() {
        let mut last = CoarseInstant::now();
        for _ in 0..10_000 {
            let now = CoarseInstant::now();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn wall_clock_is_within_a_tick_of_the_system_time() {
        let coarse = CoarseSystemClock.now();
        let precise = SystemTime::now();
        let apart = precise
            .duration_since(coarse)
            .or_else(|error| Ok::<_, ()>(error.duration()))
            .unwrap_or_default();
        assert!(apart <= TICK_BOUND, "{apart:?}");
    }

    #[test]
    fn adding_moves_later_and_saturates() {
        let now = CoarseInstant::now();
        let later = now + Duration::from_secs(5);
        assert_eq!(later.saturating_duration_since(now), Duration::from_secs(5));
        assert_eq!(now.saturating_duration_since(later), Duration::ZERO);
        assert!(now + Duration::MAX >= later);
    }
}
