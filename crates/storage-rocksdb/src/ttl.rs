//! Expiry: the header of every value that can expire, and the compaction filter that reclaims
//! expired entries.
//!
//! # Reads decide, compaction only reclaims
//!
//! Each expiring value starts with its expiry instant (milliseconds since the epoch on the
//! store's [`Clock`]), and every read compares it with that clock. Expiry is therefore exact and
//! testable with a manual clock, and it does not depend on when compaction runs (`RocksDB`'s own
//! TTL mode judges by the wall clock and by write time, which is neither).
//!
//! The compaction filter only frees space. It must never drop an entry a read would still call
//! live, so it judges by the **same clock** the store reads with (not the system clock: a store
//! opened with a clock behind the wall clock would otherwise lose live data), and only drops
//! entries that expired at least a grace period ago, so a clock stepped backwards by less than
//! the grace (an NTP correction, a test rewinding its manual clock) never resurrects an entry
//! that compaction already removed. The cost of the grace is keeping dead bytes that long.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prosody_api::Clock;
use prosody_api::storage::Ttl;
use rocksdb::compaction_filter::Decision;

/// Version byte of the value header, so a future layout can be told apart.
const FORMAT: u8 = 1;

/// Header length: format byte and expiry.
pub const HEADER_LEN: usize = 9;

/// Expiry of an entry that never expires.
pub const NEVER: u64 = u64::MAX;

/// Milliseconds since the epoch; instants before it clamp to zero.
pub fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The expiry of an entry written at `now` with `ttl`.
pub fn expiry(ttl: Option<Ttl>, now: SystemTime) -> u64 {
    ttl.map_or(NEVER, |ttl| millis(ttl.expires_at(now)))
}

/// True while `now` is before `expiry`: live one millisecond before, expired exactly at it.
pub fn live(expiry: u64, now: u64) -> bool {
    now < expiry
}

/// `header | payload`.
pub fn encode(expiry: u64, payload: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(HEADER_LEN + payload.len());
    value.push(FORMAT);
    value.extend_from_slice(&expiry.to_be_bytes());
    value.extend_from_slice(payload);
    value
}

/// Splits a stored value into its expiry and payload; `None` for a value this crate did not
/// write.
pub fn decode(value: &[u8]) -> Option<(u64, &[u8])> {
    let (&format, rest) = value.split_first()?;
    let (expiry, payload) = rest.split_first_chunk::<8>()?;
    (format == FORMAT).then(|| (u64::from_be_bytes(*expiry), payload))
}

/// The compaction filter of the families whose values carry the header (see the module docs).
pub fn compaction_filter(
    clock: Arc<dyn Clock>,
    grace: Duration,
) -> impl FnMut(u32, &[u8], &[u8]) -> Decision + Send + 'static {
    let grace = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    move |_level, _key, value| match decode(value) {
        Some((expiry, _))
            if expiry != NEVER && expiry.saturating_add(grace) <= millis(clock.now()) =>
        {
            Decision::Remove
        }
        _ => Decision::Keep,
    }
}

#[cfg(test)]
mod tests {
    use prosody_api::ManualClock;

    use super::*;

    #[test]
    fn header_round_trips() {
        let value = encode(42, b"payload");
        assert_eq!(decode(&value), Some((42, &b"payload"[..])));
        assert_eq!(decode(b"short"), None);
        assert_eq!(decode(&[9; 12]), None, "unknown format");
    }

    #[test]
    fn expiry_is_exclusive() {
        assert!(live(10, 9));
        assert!(!live(10, 10));
        assert!(live(NEVER, u64::MAX - 1));
    }

    #[test]
    fn filter_keeps_entries_until_the_grace_has_passed_on_the_store_clock() {
        let clock = ManualClock::new();
        let now = millis(clock.now());
        let grace = Duration::from_secs(60);
        let mut filter = compaction_filter(Arc::new(clock.clone()), grace);
        let expired_now = encode(now, b"x");
        assert!(matches!(filter(0, b"k", &expired_now), Decision::Keep));
        clock.advance(grace);
        assert!(matches!(filter(0, b"k", &expired_now), Decision::Remove));
        assert!(matches!(
            filter(0, b"k", &encode(NEVER, b"x")),
            Decision::Keep
        ));
        assert!(matches!(filter(0, b"k", b"foreign"), Decision::Keep));
    }
}
