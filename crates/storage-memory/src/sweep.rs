//! Amortized sweeping of expired data.
//!
//! Expired entries are invisible on read immediately, but must also be dropped or a store that
//! sees many short-lived keys grows without bound. Sweeping every write would cost O(n) each
//! time; sweeping when the store has doubled since the last sweep costs O(1) amortized and keeps
//! at most about twice the live data.

/// When to sweep next.
#[derive(Debug)]
pub struct SweepSchedule {
    next_at: usize,
    minimum: usize,
}

/// Below this many entries a sweep is not worth it.
const MIN_SWEEP_LEN: usize = 1024;

impl SweepSchedule {
    /// The fewest entries a store sweeps at (a store in parts divides it between them).
    pub const MINIMUM: usize = MIN_SWEEP_LEN;

    pub const fn new() -> Self {
        Self::with_minimum(MIN_SWEEP_LEN)
    }

    /// A schedule that never sweeps fewer than `minimum` entries.
    pub const fn with_minimum(minimum: usize) -> Self {
        Self {
            next_at: minimum,
            minimum,
        }
    }

    /// True when a store of `len` entries should sweep now.
    pub fn due(&self, len: usize) -> bool {
        len >= self.next_at
    }

    /// Records that a sweep left `len` entries.
    pub fn swept(&mut self, len: usize) {
        self.next_at = len.saturating_mul(2).max(self.minimum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_again_only_after_doubling() {
        let mut schedule = SweepSchedule::new();
        assert!(!schedule.due(MIN_SWEEP_LEN - 1));
        assert!(schedule.due(MIN_SWEEP_LEN));
        schedule.swept(5000);
        assert!(!schedule.due(9999));
        assert!(schedule.due(10_000));
        schedule.swept(0);
        assert!(schedule.due(MIN_SWEEP_LEN));
    }
}
