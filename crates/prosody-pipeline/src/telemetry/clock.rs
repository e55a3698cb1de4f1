//! When lifecycle events happen: one cheap monotonic reading per event on the handler's thread,
//! turned into wall-clock time by the sender thread.
//!
//! A record's two events took four clock readings (the wall clock for each event's timestamp,
//! the monotonic clock around the handler for its run time), 32-34 ns each here: about half of
//! what emitting cost a worker. Now each event reads the clock once, through `quanta` (the
//! processor's time-stamp counter, scaled; 14 ns here, falling back to the operating system's
//! monotonic clock where the processor does not say the counter is invariant), the run time is
//! the difference of a record's two readings, and the sender, which has time to spare, works out
//! the wall time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A moment on the monotonic clock: ordered, and cheap to read on a handler's thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Moment(quanta::Instant);

impl Moment {
    /// Now.
    #[must_use]
    pub fn now() -> Self {
        Self(quanta::Instant::now())
    }

    /// Time from `earlier` to this moment (zero if `earlier` is later).
    #[must_use]
    pub fn since(self, earlier: Self) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }

    /// Reads the clock once, so the first handler does not wait while `quanta` calibrates the
    /// counter against the operating system's clock.
    pub fn calibrate() {
        let _ = Self::now();
    }
}

/// The wall-clock time of one moment, from which the wall-clock time of moments near it is
/// worked out. The sender takes a fresh one every turn, so a change of the system clock shows
/// within a turn.
#[derive(Clone, Copy, Debug)]
pub struct WallAnchor {
    moment: Moment,
    wall_ns: u64,
}

impl WallAnchor {
    /// Both clocks, now.
    #[must_use]
    pub fn now() -> Self {
        let moment = Moment::now();
        let wall_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
        Self { moment, wall_ns }
    }

    /// The moment this anchor was read at.
    #[must_use]
    pub fn moment(&self) -> Moment {
        self.moment
    }

    /// Milliseconds since the Unix epoch at `moment`.
    #[must_use]
    pub fn wall_ms(&self, moment: Moment) -> u64 {
        let wall_ns = if moment >= self.moment {
            let after = u64::try_from(moment.since(self.moment).as_nanos()).unwrap_or(u64::MAX);
            self.wall_ns.saturating_add(after)
        } else {
            let before = u64::try_from(self.moment.since(moment).as_nanos()).unwrap_or(u64::MAX);
            self.wall_ns.saturating_sub(before)
        };
        wall_ns / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_ordered_and_their_differences_are_durations() {
        let first = Moment::now();
        std::thread::sleep(Duration::from_millis(2));
        let second = Moment::now();
        assert!(second > first);
        assert!(second.since(first) >= Duration::from_millis(2));
        assert_eq!(first.since(second), Duration::ZERO);
    }

    #[test]
    fn an_anchor_gives_wall_time_before_and_after_its_moment() {
        let before = Moment::now();
        std::thread::sleep(Duration::from_millis(5));
        let anchor = WallAnchor::now();
        std::thread::sleep(Duration::from_millis(5));
        let after = Moment::now();
        let wall_now_ms = u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        let at_anchor = anchor.wall_ms(anchor.moment());
        assert!(anchor.wall_ms(before) + 5 <= at_anchor);
        assert!(anchor.wall_ms(after) >= at_anchor + 5);
        // The counter's calibration may be off by a little: a millisecond of slack.
        assert!(anchor.wall_ms(after) <= wall_now_ms + 1);
        assert!(wall_now_ms - anchor.wall_ms(after) < 1_000);
    }
}
