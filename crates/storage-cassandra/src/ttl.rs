//! Logical expiry versus Cassandra's native TTL.
//!
//! Expiry is judged by the store's [`prosody_api::Clock`]: every entry with a TTL stores its
//! expiry instant (milliseconds since the epoch) in a column, and reads filter on it. That keeps
//! expiry exact to the millisecond, testable with a manual clock, and independent of the nodes'
//! clocks.
//!
//! Cassandra's native TTL only reclaims space. It is set so that it can never remove an entry
//! the store still considers live:
//! - an entry with a logical TTL gets `ttl + margin` (the margin absorbs clock skew between the
//!   client and the nodes), capped by the retention;
//! - an entry without one gets the retention: data not rewritten for that long is reclaimed,
//!   which is what `cassandraRetentionSeconds` means;
//! - a timer gets the time until it is due plus the retention, so a timer far in the future is
//!   never reclaimed before it fires (timers do not expire in the trait's contract);
//! - everything is capped at Cassandra's maximum TTL of 20 years;
//! - a TTL that would expire after 2038-01-19 is left out (no native TTL): Cassandra 5.0 in its
//!   default `storage_compatibility_mode: CASSANDRA_4` rejects such writes (CASSANDRA-14092).
//!   Only rows meant to outlive that date (a timer due in 12+ years) are affected, and they are
//!   still removed when unscheduled.
//!
//! The cap by retention is the one place where native TTL may cut a logical TTL short: a
//! retention shorter than a collection's `ttlSeconds` is a configuration choice that bounds all
//! data, and it is documented as such on the config field.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prosody_api::TimerTime;
use prosody_api::storage::Ttl;

use crate::config::MAX_TTL;

/// Computes native TTLs from logical ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TtlPolicy {
    retention: Duration,
    margin: Duration,
}

impl TtlPolicy {
    pub(crate) fn new(retention: Duration, margin: Duration) -> Self {
        Self { retention, margin }
    }

    /// Native TTL in seconds for an entry with logical TTL `logical`.
    pub(crate) fn native(self, logical: Option<Ttl>) -> i32 {
        let native = match logical {
            None => self.retention,
            Some(ttl) => (ttl.as_duration() + self.margin).min(self.retention),
        };
        seconds(native)
    }

    /// Native TTL in seconds for a row that must live until `due` (a timer, a slab) and then
    /// for the retention.
    pub(crate) fn until(self, due: TimerTime, now: TimerTime) -> i32 {
        let ahead = Duration::from_secs(due.as_secs().saturating_sub(now.as_secs()));
        seconds(ahead.saturating_add(self.retention))
    }

    /// Native TTL in seconds of rows without a logical TTL.
    pub(crate) fn retention(self) -> i32 {
        seconds(self.retention)
    }

    /// Native TTL of an index row written just before the rows it lists: an hour past
    /// [`Self::retention`], so it never expires before them.
    pub(crate) fn index_retention(self) -> i32 {
        seconds(self.retention.saturating_add(Duration::from_secs(3_600)))
    }
}

/// The latest expiration Cassandra accepts in its default compatibility mode (2038-01-19,
/// minus a day of safety for clock skew between this client and the nodes).
const LATEST_EXPIRATION_SECS: u64 = 2_147_483_646 - 86_400;

/// Whole seconds in `1 ..= MAX_TTL`, as the `int` CQL's `USING TTL` takes, or 0 (no native TTL)
/// when the expiration would fall after what Cassandra accepts.
fn seconds(duration: Duration) -> i32 {
    let secs = duration.min(MAX_TTL).as_secs().max(1);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    if now.saturating_add(secs) > LATEST_EXPIRATION_SECS {
        return 0;
    }
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Milliseconds since the epoch, the unit of every `expires_at` column.
pub(crate) fn millis(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    })
}

/// The `expires_at` column of an entry written at `now` with `ttl`.
pub(crate) fn expires_at(ttl: Option<Ttl>, now: SystemTime) -> Option<i64> {
    ttl.map(|ttl| millis(ttl.expires_at(now)))
}

/// True while an entry with this `expires_at` column is live at `now_millis`.
pub(crate) fn live(expires_at: Option<i64>, now_millis: i64) -> bool {
    expires_at.is_none_or(|at| now_millis < at)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn native_ttl_outlives_the_logical_one_within_the_retention() {
        let policy = TtlPolicy::new(Duration::from_secs(86_400), HOUR);
        assert_eq!(policy.native(Ttl::from_secs(10)), 3610);
        assert_eq!(policy.native(None), 86_400);
        assert_eq!(policy.native(Ttl::from_secs(90_000)), 86_400);
    }

    #[test]
    fn timers_live_until_due_plus_retention_capped_at_twenty_years() {
        let policy = TtlPolicy::new(HOUR, HOUR);
        let now = TimerTime::from_secs(1000);
        assert_eq!(policy.until(TimerTime::from_secs(1060), now), 3660);
        assert_eq!(policy.until(TimerTime::from_secs(940), now), 3600);
        assert_eq!(
            policy.until(TimerTime::MAX, now),
            0,
            "beyond 2038: no native TTL"
        );
    }

    #[test]
    fn liveness_is_exclusive_at_the_expiry() {
        assert!(live(None, i64::MAX));
        assert!(live(Some(10), 9));
        assert!(!live(Some(10), 10));
    }
}
