//! [`FingerprintTable`]: record fingerprints and their expiry, laid out for the dedup layer's
//! lookup-then-insert.
//!
//! The dedup layer looks a record up before its handler runs and inserts it after. In a
//! general hash table (hashbrown) the lookup of a new record reads the compact control bytes,
//! which stay cached, and the insert then writes a slot in a cold cache line: the insert waited
//! for that line while holding its shard's lock, and releasing the lock stalled until the write
//! landed (most of the insert's time in the consumer's profile, one miss per record). Here the
//! lookup that misses knows the slot the insert will fill and starts fetching its line, so the
//! miss overlaps the handler instead of stalling the insert.
//!
//! The layout is hashbrown's idea in small: a tag byte per slot (empty, or seven bits of the
//! fingerprint), eight to a word compared at once, and the records in an array of their own,
//! sixteen bytes each so four share a line and none straddles two: a record's fingerprint and its
//! expiry are in one line, which the lookup that misses fetches and the insert then writes. A
//! record keeps the fingerprint's low 64 bits (the tag keeps its top seven, and the store's shard
//! stands for four more): two fingerprints alike in those 75 bits are one record to the table, a
//! chance of 2^-55 per lookup among a million records held, where the fingerprint's other bits
//! would have cost the table half as much again (a second array or line per record, 24 or 32
//! bytes per slot instead of 16). Records are never removed one by one: a sweep rebuilds the
//! table from the records it keeps. So a probe may stop at the first group with an empty slot: an
//! insert fills the first empty slot along its probe, and nothing empties a slot behind it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Slots per tag word.
const GROUP: usize = 8;

/// Groups of a table's first allocation.
const MIN_GROUPS: usize = 2;

/// Each byte's lowest bit.
const LOW_BITS: u64 = 0x0101_0101_0101_0101;
/// Each byte's highest bit: set in the tag of a filled slot.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// What a filled slot holds: a record.
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
struct Record {
    /// The fingerprint's low 64 bits.
    fingerprint: u64,
    /// Nanoseconds since the Unix epoch.
    expiry: u64,
}

/// A filled slot's record and its tag: everything a rebuild needs to place it again.
#[derive(Clone, Copy)]
struct Held {
    tag: u8,
    record: Record,
}

/// Where a probe for a fingerprint ended.
enum Probe {
    /// The slot holding it.
    Found(usize),
    /// The slot an insert of it would fill.
    Absent(usize),
}

/// Record fingerprints (keyed digests: their bits are uniform) with their expiry.
pub struct FingerprintTable {
    /// A tag byte per slot, eight to a word; a power of two of words, or none before the first
    /// insert.
    tags: Box<[u64]>,
    /// The record of each slot whose tag is set.
    records: Box<[Record]>,
    len: usize,
    /// No record expires before this (nanoseconds since the Unix epoch): a sweep that would
    /// find nothing expired costs no scan.
    earliest: u64,
}

impl Default for FingerprintTable {
    fn default() -> Self {
        Self {
            tags: Box::default(),
            records: Box::default(),
            len: 0,
            earliest: u64::MAX,
        }
    }
}

impl std::fmt::Debug for FingerprintTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintTable")
            .field("len", &self.len)
            .field("slots", &self.records.len())
            .finish_non_exhaustive()
    }
}

/// `time` as nanoseconds since the Unix epoch: 0 before it, the largest value past year 2554.
fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

fn time(nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(nanos)
}

/// The tag of a filled slot: the fingerprint's top seven bits (the home group comes from its
/// low bits, the store's shard from the high half's low bits).
fn tag(fingerprint: u128) -> u8 {
    let top = (fingerprint >> 121) as u8;
    top | 0x80
}

/// The fingerprint's bits a record keeps.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a record keeps the low half"
)]
fn low(fingerprint: u128) -> u64 {
    fingerprint as u64
}

/// The first group of a probe for a fingerprint with these low bits, before masking.
fn home(low: u64) -> usize {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the mask keeps fewer bits than a usize has"
    )]
    let home = low as usize;
    home
}

/// The high bit of each byte of `word` that equals `tag`, exactly: a record keeps only part
/// of the fingerprint, so a slot with another tag must never be taken for a candidate.
fn matching(word: u64, tag: u8) -> u64 {
    let zero_where_equal = word ^ (LOW_BITS * u64::from(tag));
    // A byte's low seven bits plus 0x7f carry into its high bit unless they are all zero, and
    // never into the next byte.
    let low_seven_nonzero = (zero_where_equal & !HIGH_BITS) + !HIGH_BITS;
    !(low_seven_nonzero | zero_where_equal) & HIGH_BITS
}

/// The high bit of each empty byte of `word`.
fn empty(word: u64) -> u64 {
    !word & HIGH_BITS
}

/// The slot within its group of the lowest byte flagged in `bits`.
fn first(bits: u64) -> usize {
    (bits.trailing_zeros() / 8) as usize
}

/// Starts fetching `entry`'s line, without waiting for it: for writing where the build enables
/// `prfchw`, else for reading (what the default x86-64 target compiles to), which still brings a
/// line no other core holds in exclusively, so the write after it needs no second transfer.
#[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
fn prefetch_for_write<T>(slot: &T) {
    safe_arch::prefetch_et0(slot);
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
fn prefetch_for_write<T>(_slot: &T) {}

impl FingerprintTable {
    /// Records held, expired or not.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The expiry of `fingerprint`'s record, expired or not. When there is none, the slot an
    /// insert of it would fill starts coming into the cache for writing.
    pub fn get(&self, fingerprint: u128) -> Option<SystemTime> {
        match self.probe(fingerprint)? {
            Probe::Found(slot) => Some(time(self.records[slot].expiry)),
            Probe::Absent(slot) => {
                prefetch_for_write(&self.records[slot]);
                None
            }
        }
    }

    /// Holds `fingerprint`'s record until `expiry`, replacing its earlier expiry.
    pub fn insert(&mut self, fingerprint: u128, expiry: SystemTime) {
        let expiry = nanos(expiry);
        self.earliest = self.earliest.min(expiry);
        let held = Held {
            tag: tag(fingerprint),
            record: Record {
                fingerprint: low(fingerprint),
                expiry,
            },
        };
        match self.probe(fingerprint) {
            Some(Probe::Found(slot)) => self.records[slot].expiry = expiry,
            Some(Probe::Absent(slot)) if !self.must_grow() => {
                self.fill(slot, held);
                self.len += 1;
            }
            _ => {
                // Growing moves every record: the probe is repeated in the new slots.
                self.rebuild(self.tags.len().max(MIN_GROUPS / 2) * 2);
                self.place(held);
                self.len += 1;
            }
        }
    }

    /// Drops the records expired at `now` (an expiry at or before it); the table shrinks with
    /// them.
    pub fn remove_expired(&mut self, now: SystemTime) {
        let now = nanos(now);
        if now < self.earliest {
            return;
        }
        let kept: Vec<Held> = self
            .held()
            .filter(|held| now < held.record.expiry)
            .collect();
        *self = Self::default();
        if kept.is_empty() {
            return;
        }
        self.len = kept.len();
        self.earliest = kept
            .iter()
            .map(|held| held.record.expiry)
            .min()
            .unwrap_or(u64::MAX);
        self.allocate(Self::groups_for(kept.len()));
        for held in kept {
            self.place(held);
        }
    }

    /// Every filled slot's record, with its tag.
    fn held(&self) -> impl Iterator<Item = Held> + '_ {
        self.tags
            .iter()
            .enumerate()
            .flat_map(move |(group, &word)| {
                let mut filled = word & HIGH_BITS;
                std::iter::from_fn(move || {
                    (filled != 0).then(|| {
                        let within = first(filled);
                        filled &= filled - 1;
                        Held {
                            tag: word.to_le_bytes()[within],
                            record: self.records[group * GROUP + within],
                        }
                    })
                })
            })
    }

    /// Where `fingerprint` is or would go; none before the first allocation.
    fn probe(&self, fingerprint: u128) -> Option<Probe> {
        if self.tags.is_empty() {
            return None;
        }
        let mask = self.tags.len() - 1;
        let tag = tag(fingerprint);
        let low = low(fingerprint);
        let mut group = home(low) & mask;
        loop {
            let word = self.tags[group];
            let mut candidates = matching(word, tag);
            while candidates != 0 {
                let slot = group * GROUP + first(candidates);
                if self.records[slot].fingerprint == low {
                    return Some(Probe::Found(slot));
                }
                candidates &= candidates - 1;
            }
            let free = empty(word);
            if free != 0 {
                return Some(Probe::Absent(group * GROUP + first(free)));
            }
            group = (group + 1) & mask;
        }
    }

    /// Whether one more record would fill more than seven eighths of the slots.
    fn must_grow(&self) -> bool {
        (self.len + 1) * 8 > self.records.len() * 7
    }

    /// Groups for `len` records at most half loaded (a power of two).
    fn groups_for(len: usize) -> usize {
        len.div_ceil(GROUP)
            .saturating_mul(2)
            .next_power_of_two()
            .max(MIN_GROUPS)
    }

    fn allocate(&mut self, groups: usize) {
        self.tags = vec![0; groups].into_boxed_slice();
        self.records = vec![Record::default(); groups * GROUP].into_boxed_slice();
    }

    /// Moves every record into `groups` new groups.
    fn rebuild(&mut self, groups: usize) {
        let old = std::mem::take(self);
        self.len = old.len;
        self.earliest = old.earliest;
        self.allocate(groups);
        for held in old.held() {
            self.place(held);
        }
    }

    /// Puts a record known to be absent in the first empty slot of its probe.
    fn place(&mut self, held: Held) {
        let mask = self.tags.len() - 1;
        let mut group = home(held.record.fingerprint) & mask;
        loop {
            let free = empty(self.tags[group]);
            if free != 0 {
                self.fill(group * GROUP + first(free), held);
                return;
            }
            group = (group + 1) & mask;
        }
    }

    fn fill(&mut self, slot: usize, held: Held) {
        self.tags[slot / GROUP] |= u64::from(held.tag) << (8 * (slot % GROUP));
        self.records[slot] = held.record;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    /// An operation on a table and on its model.
    #[derive(Clone, Debug)]
    enum Op {
        Insert { fingerprint: u128, expiry: u64 },
        RemoveExpired { now: u64 },
    }

    /// Fingerprints from a small pool that share home groups and tags (the bits that differ are
    /// above those that choose a group, within the 64 a record keeps), so probes run long,
    /// candidates collide on tags and reinserts replace.
    fn fingerprint() -> impl Strategy<Value = u128> {
        (0u128..4, 0u128..2, 0u128..64)
            .prop_map(|(home, tag, rest)| home | (rest << 32) | (tag << 121))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (fingerprint(), 0u64..50)
                .prop_map(|(fingerprint, expiry)| Op::Insert { fingerprint, expiry }),
            1 => (0u64..50).prop_map(|now| Op::RemoveExpired { now }),
        ]
    }

    proptest! {
        /// Whatever the operations, the table answers every fingerprint as a map would: a
        /// wrong "held" would skip a message, a wrong "absent" would handle it twice.
        #[test]
        fn answers_like_a_map(ops in proptest::collection::vec(op(), 0..400)) {
            let mut table = FingerprintTable::default();
            let mut model: HashMap<u128, u64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert { fingerprint, expiry } => {
                        table.insert(fingerprint, at(expiry));
                        model.insert(fingerprint, expiry);
                    }
                    Op::RemoveExpired { now } => {
                        table.remove_expired(at(now));
                        model.retain(|_, expiry| now < *expiry);
                    }
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for home in 0u128..4 {
                for tag in 0u128..2 {
                    for rest in 0u128..64 {
                        let fingerprint = home | (rest << 32) | (tag << 121);
                        prop_assert_eq!(
                            table.get(fingerprint),
                            model.get(&fingerprint).map(|&expiry| at(expiry))
                        );
                    }
                }
            }
        }
    }

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    /// Fingerprints that all start their probe in the same group, most with the same tag.
    fn colliding(n: u128) -> impl Iterator<Item = u128> {
        (1..=n).map(|i| (i << 32) | (u128::from(i % 3 == 0) << 127))
    }

    #[test]
    fn holds_what_was_inserted_through_growth() {
        let mut table = FingerprintTable::default();
        assert_eq!(table.get(7), None);
        let mut expected = HashMap::new();
        for i in 0..10_000u128 {
            // Spread like digests, plus runs that share a home bucket.
            let fingerprint = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)) ^ (i % 3);
            table.insert(fingerprint, at(u64::try_from(i).unwrap()));
            expected.insert(fingerprint, at(u64::try_from(i).unwrap()));
        }
        assert_eq!(table.len(), expected.len());
        for (fingerprint, expiry) in &expected {
            assert_eq!(table.get(*fingerprint), Some(*expiry));
        }
        assert_eq!(table.get(0xdead_beef), None);
    }

    #[test]
    fn probes_past_full_buckets() {
        let mut table = FingerprintTable::default();
        for fingerprint in colliding(40) {
            table.insert(fingerprint, at(1));
        }
        for fingerprint in colliding(40) {
            assert_eq!(table.get(fingerprint), Some(at(1)));
        }
        assert_eq!(table.get(41 << 32), None);
        assert_eq!(table.len(), 40);
    }

    #[test]
    fn tag_matching_is_exact() {
        for position in 0..GROUP {
            for byte in 0..=u8::MAX {
                // The other bytes hold neighbours of the byte, the values a carry would confuse.
                let word = u64::from_le_bytes(std::array::from_fn(|at| {
                    if at == position {
                        byte
                    } else {
                        byte.wrapping_add(1)
                    }
                }));
                for tag in 0..=u8::MAX {
                    let expected = if byte == tag {
                        0x80 << (8 * position)
                    } else {
                        0
                    };
                    let others = if byte.wrapping_add(1) == tag {
                        HIGH_BITS & !(0x80 << (8 * position))
                    } else {
                        0
                    };
                    assert_eq!(matching(word, tag), expected | others, "{word:#x} {tag:#x}");
                }
            }
        }
    }

    #[test]
    fn records_alike_in_their_low_bits_but_not_their_tags_are_two() {
        let mut table = FingerprintTable::default();
        let neighbour_tags = 1u128 << 121;
        table.insert(7, at(1));
        table.insert(7 | neighbour_tags, at(2));
        assert_eq!(table.len(), 2);
        assert_eq!(table.get(7), Some(at(1)));
        assert_eq!(table.get(7 | neighbour_tags), Some(at(2)));
        assert_eq!(table.get(7 | (2 << 121)), None);
    }

    #[test]
    fn reinserting_replaces_the_expiry() {
        let mut table = FingerprintTable::default();
        table.insert(5, at(10));
        table.insert(5, at(20));
        assert_eq!(table.len(), 1);
        assert_eq!(table.get(5), Some(at(20)));
    }

    #[test]
    fn removing_expired_keeps_the_rest_and_shrinks() {
        let mut table = FingerprintTable::default();
        for fingerprint in 0..1000u128 {
            table.insert(
                fingerprint,
                at(10 + u64::try_from(fingerprint % 2).unwrap()),
            );
        }
        let before = table.records.len();
        table.remove_expired(at(9));
        assert_eq!(table.len(), 1000, "nothing expired yet");
        table.remove_expired(at(10));
        assert_eq!(table.len(), 500);
        assert!(table.records.len() < before);
        for fingerprint in 0..1000u128 {
            let expected = (fingerprint % 2 == 1).then(|| at(11));
            assert_eq!(table.get(fingerprint), expected, "{fingerprint}");
        }
        table.remove_expired(at(10));
        assert_eq!(table.len(), 500, "the earliest expiry moved on");
        table.remove_expired(at(11));
        assert_eq!(table.len(), 0);
        assert_eq!(table.get(1), None);
        table.insert(1, at(3));
        assert_eq!(table.get(1), Some(at(3)));
    }

    #[test]
    fn expiries_keep_nanoseconds_and_clamp_at_the_epoch() {
        let mut table = FingerprintTable::default();
        let precise = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        table.insert(1, precise);
        table.insert(2, UNIX_EPOCH - Duration::from_secs(1));
        assert_eq!(table.get(1), Some(precise));
        assert_eq!(table.get(2), Some(UNIX_EPOCH));
    }
}
