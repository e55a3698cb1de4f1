//! An attempt's deadline (the handler timeout) on the pipeline's tick-resolution clock.
//!
//! Every attempt gets a deadline, and nearly every attempt ends long before it: the deadline is
//! set for each and looked at by few (a handler asking `should_cancel` or waiting for
//! cancellation). On the precise clock, setting it was a read of the TSC per attempt, ~20 ns on
//! the test machine's VM; on the coarse clock it is a read of the kernel's last tick. To never
//! fire early despite a reading that lags by up to a tick, the deadline is one tick later than
//! the timeout asks: it fires between the timeout and two ticks past it (8 ms at `HZ=250`).
//!
//! The clock is the [`Clock`] the layer was given, so tests judge deadlines on tokio's paused
//! time.

use std::fmt;
use std::time::Duration;

use prosody_api::CoarseInstant;

use crate::consumer::CancelWatch;
use crate::monotonic::Clock;

/// True once `cancel` fired or `deadline` passed: when an attempt counts as cancelled, for the
/// middleware's tasks and the handler's context alike.
#[must_use]
pub fn cancelled_or_past(cancel: &CancelWatch, deadline: Option<Deadline<'_>>) -> bool {
    cancel.is_cancelled() || deadline.is_some_and(|deadline| deadline.passed())
}

/// Resolves once `cancel` fires or `deadline` passes.
pub async fn until_cancelled_or_past(cancel: &CancelWatch, deadline: Option<Deadline<'_>>) {
    match deadline {
        Some(deadline) => tokio::select! {
            () = cancel.cancelled() => {}
            () = deadline.reached() => {}
        },
        None => cancel.cancelled().await,
    }
}

/// When an attempt counts as cancelled, and the clock that says whether that time has come.
#[derive(Clone, Copy)]
pub struct Deadline<'a> {
    at: CoarseInstant,
    clock: &'a dyn Clock,
}

impl<'a> Deadline<'a> {
    /// `timeout` from `started` (a reading of `clock`), plus the clock's tick.
    #[must_use]
    pub fn new(started: CoarseInstant, timeout: Duration, clock: &'a dyn Clock) -> Self {
        Self {
            at: started + timeout + clock.tick(),
            clock,
        }
    }

    /// The earlier of the two.
    #[must_use]
    pub fn earliest(self, other: Self) -> Self {
        if other.at < self.at { other } else { self }
    }

    /// True once the deadline has passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.clock.now() >= self.at
    }

    /// Resolves once the deadline has passed. A timer wakes it; since the clock's reading
    /// lags, the timer may end a tick before [`passed`](Self::passed) agrees, and a short
    /// second one follows.
    pub async fn reached(&self) {
        loop {
            let now = self.clock.now();
            if now >= self.at {
                return;
            }
            tokio::time::sleep(self.at.saturating_duration_since(now)).await;
        }
    }
}

impl fmt::Debug for Deadline<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let left = self.at.saturating_duration_since(self.clock.now());
        formatter
            .debug_struct("Deadline")
            .field("left", &left)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monotonic::{ManualClock, TokioClock};

    #[test]
    fn passes_at_the_timeout_on_an_exact_clock() {
        let clock = ManualClock::new();
        let deadline = Deadline::new(clock.now(), Duration::from_millis(100), &clock);
        clock.advance(Duration::from_millis(99));
        assert!(!deadline.passed());
        clock.advance(Duration::from_millis(1));
        assert!(deadline.passed());
    }

    #[test]
    fn the_earliest_of_two_is_the_earlier() {
        let clock = ManualClock::new();
        let late = Deadline::new(clock.now(), Duration::from_secs(2), &clock);
        let early = Deadline::new(clock.now(), Duration::from_secs(1), &clock);
        clock.advance(Duration::from_secs(1));
        assert!(late.earliest(early).passed());
        assert!(early.earliest(late).passed());
        assert!(!late.earliest(late).passed());
    }

    #[tokio::test(start_paused = true)]
    async fn is_reached_at_the_timeout_on_tokios_clock() {
        let clock = TokioClock::new();
        let started = tokio::time::Instant::now();
        Deadline::new(clock.now(), Duration::from_millis(250), &clock)
            .reached()
            .await;
        assert_eq!(started.elapsed(), Duration::from_millis(250));
    }

    /// A clock like the coarse one: its readings hold still between ticks, so a reading lags
    /// the time it is read at by up to a tick.
    #[derive(Debug)]
    struct SteppedClock {
        base: CoarseInstant,
        real: ManualClock,
        tick: Duration,
    }

    impl SteppedClock {
        fn real(&self) -> Duration {
            self.real.now().saturating_duration_since(self.base)
        }
    }

    impl Clock for SteppedClock {
        fn now(&self) -> CoarseInstant {
            let tick = self.tick.as_nanos();
            let stepped = self.real().as_nanos() / tick * tick;
            self.base + Duration::from_nanos(u64::try_from(stepped).expect("a short test"))
        }

        fn tick(&self) -> Duration {
            self.tick
        }
    }

    #[test]
    fn never_passes_before_the_timeout_on_a_clock_that_lags() {
        let real = ManualClock::new();
        let clock = SteppedClock {
            base: real.now(),
            real,
            tick: Duration::from_millis(4),
        };
        let timeout = Duration::from_millis(10);
        // Started just before a tick: the reading says 0 ms where 3.9 ms have passed.
        clock.real.advance(Duration::from_micros(3_900));
        let started = clock.real();
        let deadline = Deadline::new(clock.now(), timeout, &clock);
        let mut passed_at = None;
        for _ in 0..200 {
            clock.real.advance(Duration::from_micros(100));
            if deadline.passed() {
                passed_at = Some(clock.real());
                break;
            }
        }
        let waited = passed_at
            .expect("passed within 20 ms")
            .saturating_sub(started);
        assert!(waited >= timeout, "{waited:?}");
        assert!(waited <= timeout + 2 * clock.tick, "{waited:?}");
    }
}
