//! Timer times, slabs and the [`Timer`] a handler receives.
//!
//! Timers have one-second precision (the spec's contract), so a time is a whole number of
//! seconds since the Unix epoch: scheduling the same second twice is naturally one timer, and
//! every backend can store the time as one integer.
//!
//! Durable timers are bucketed in *slabs*: slab id = time / slab size. A partition owner loads
//! only the slabs of the near future instead of scanning every timer. The slab size is fixed per
//! store instance ([`crate::storage::TimerStore::slab_size`]) rather than passed per call,
//! because it decides the durable layout: reading with a different size than was written with
//! would miss timers.

use std::fmt;
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::key::Key;

/// A timer's due time: whole seconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TimerTime(u64);

impl TimerTime {
    /// The latest time every backend can store: backends may keep times as signed 64-bit
    /// integers (Cassandra `bigint`).
    pub const MAX: Self = Self(i64::MAX.unsigned_abs());

    /// A time from whole seconds since the Unix epoch.
    #[must_use]
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs)
    }

    /// Whole seconds since the Unix epoch.
    #[must_use]
    pub const fn as_secs(self) -> u64 {
        self.0
    }

    /// Truncates a [`SystemTime`] to its second; instants before the epoch clamp to zero, since
    /// a timer in the past fires immediately either way.
    #[must_use]
    pub fn from_system_time(time: SystemTime) -> Self {
        Self(
            time.duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_secs()),
        )
    }

    /// The same instant as a [`SystemTime`].
    #[must_use]
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.0)
    }

    /// The slab this time falls in.
    #[must_use]
    pub fn slab(self, size: SlabSize) -> SlabId {
        SlabId(self.0 / u64::from(size.as_secs()))
    }
}

impl fmt::Display for TimerTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", self.0)
    }
}

/// The width of a timer slab in seconds (at least one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlabSize(NonZeroU32);

impl SlabSize {
    /// One hour, the spec's default `slabSizeMs`.
    pub const DEFAULT: Self = match NonZeroU32::new(3600) {
        Some(secs) => Self(secs),
        None => panic!("3600 is not zero"),
    };

    /// A slab size of `secs` seconds.
    #[must_use]
    pub const fn new(secs: NonZeroU32) -> Self {
        Self(secs)
    }

    /// A slab size of `secs` seconds, or `None` for zero.
    #[must_use]
    pub const fn from_secs(secs: u32) -> Option<Self> {
        match NonZeroU32::new(secs) {
            Some(secs) => Some(Self(secs)),
            None => None,
        }
    }

    /// The width in seconds.
    #[must_use]
    pub const fn as_secs(self) -> u32 {
        self.0.get()
    }
}

impl Default for SlabSize {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A slab number: `time / slab size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SlabId(pub u64);

impl SlabId {
    /// The first second of this slab.
    #[must_use]
    pub fn start(self, size: SlabSize) -> TimerTime {
        TimerTime(self.0.saturating_mul(u64::from(size.as_secs())))
    }

    /// The first second after this slab (exclusive end).
    #[must_use]
    pub fn end(self, size: SlabSize) -> TimerTime {
        TimerTime(
            self.0
                .saturating_add(1)
                .saturating_mul(u64::from(size.as_secs())),
        )
    }
}

/// Who owns a stored timer. Internal defer-retry timers share the timer store with the
/// application's timers so one loader fires both in key order, but they must never show up in
/// (or be cleared by) the application's `scheduled()`/`clear_scheduled()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TimerKind {
    /// Scheduled by a handler through the timers API.
    Application,
    /// Scheduled by the defer middleware to retry a deferred message or timer of the key.
    DeferRetry,
}

impl TimerKind {
    /// Every kind, for backends that iterate kinds.
    pub const ALL: [Self; 2] = [Self::Application, Self::DeferRetry];

    /// A stable one-byte code for durable encodings.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Application => 0,
            Self::DeferRetry => 1,
        }
    }

    /// The kind of a [`TimerKind::code`]; `None` for unknown codes.
    #[must_use]
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::Application),
            1 => Some(Self::DeferRetry),
            _ => None,
        }
    }
}

/// A timer that fired, as given to [`crate::EventHandler::on_timer`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Timer {
    /// The key the timer was scheduled for.
    pub key: Key,
    /// The second it was scheduled for (it fires at or after this time).
    pub time: TimerTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_boundaries_are_start_inclusive_end_exclusive() {
        let size = SlabSize::from_secs(60).unwrap();
        assert_eq!(TimerTime::from_secs(59).slab(size), SlabId(0));
        assert_eq!(TimerTime::from_secs(60).slab(size), SlabId(1));
        assert_eq!(SlabId(1).start(size), TimerTime::from_secs(60));
        assert_eq!(SlabId(1).end(size), TimerTime::from_secs(120));
    }

    #[test]
    fn system_time_truncates_to_the_second() {
        let time = UNIX_EPOCH + Duration::from_millis(5_999);
        assert_eq!(TimerTime::from_system_time(time), TimerTime::from_secs(5));
        assert_eq!(
            TimerTime::from_system_time(UNIX_EPOCH - Duration::from_secs(1)),
            TimerTime::from_secs(0)
        );
    }

    #[test]
    fn kind_codes_round_trip() {
        for kind in TimerKind::ALL {
            assert_eq!(TimerKind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(TimerKind::from_code(9), None);
    }
}
