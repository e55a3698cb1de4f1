//! Watermark offset tracking for one partition.
//!
//! Records of a partition finish out of order (different keys run concurrently), but Kafka
//! stores one committed position per partition. Committing offset `N + 1` claims that every
//! record up to `N` is done, so the committable position is the lowest offset still pending, or
//! one past the highest offset seen when nothing is pending. Anything else could lose a record
//! on restart.

use std::collections::VecDeque;

use prosody_api::Offset;

/// Tracks which offsets of one partition are received but not yet done.
///
/// Offsets must be received in increasing order (Kafka delivers a partition in order); gaps
/// (compacted or transactional records) are fine.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Received offsets in increasing order, each with its done flag. The front is always
    /// pending: done offsets at the front are popped as soon as they complete.
    window: VecDeque<(Offset, bool)>,
    /// One past the highest offset received, or the initial position when nothing arrived.
    next: Option<Offset>,
}

impl OffsetTracker {
    /// Where `offset` sits in the window. Offsets are usually contiguous, so its distance from
    /// the front finds it at once; a gap (compaction, transaction markers) falls back to a
    /// binary search.
    fn index_of(&self, offset: Offset) -> Option<usize> {
        let front = self.window.front()?.0;
        let guess = usize::try_from(offset.0.checked_sub(front.0)?).ok()?;
        if self.window.get(guess).is_some_and(|(at, _)| *at == offset) {
            return Some(guess);
        }
        self.window
            .binary_search_by_key(&offset, |(pending, _)| *pending)
            .ok()
    }

    /// An empty tracker.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `offset` was received and is pending. Returns false (and ignores it) when
    /// the offset is not above every offset already received, which happens only after a seek
    /// back; the caller must not process such a record twice.
    pub fn receive(&mut self, offset: Offset) -> bool {
        if self.next.is_some_and(|next| offset < next) {
            return false;
        }
        self.window.push_back((offset, false));
        self.next = Some(Offset(offset.0 + 1));
        true
    }

    /// Marks `offset` done. Returns false when it was not pending (unknown or already done).
    pub fn complete(&mut self, offset: Offset) -> bool {
        let Some(index) = self.index_of(offset) else {
            return false;
        };
        let entry = &mut self.window[index];
        if entry.1 {
            return false;
        }
        entry.1 = true;
        while self.window.front().is_some_and(|(_, done)| *done) {
            self.window.pop_front();
        }
        true
    }

    /// The position to commit: every offset below it is done. `None` before any record.
    #[must_use]
    pub fn committable(&self) -> Option<Offset> {
        self.window.front().map(|(offset, _)| *offset).or(self.next)
    }

    /// Number of offsets received and not yet done.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.window.iter().filter(|(_, done)| !done).count()
    }

    /// True when every received offset is done.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.window.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn watermark_waits_for_the_lowest_pending_offset() {
        let mut tracker = OffsetTracker::new();
        assert_eq!(tracker.committable(), None);
        for offset in 10..15 {
            assert!(tracker.receive(Offset(offset)));
        }
        assert_eq!(tracker.committable(), Some(Offset(10)));
        assert!(tracker.complete(Offset(12)));
        assert!(tracker.complete(Offset(11)));
        assert_eq!(tracker.committable(), Some(Offset(10)), "10 still pending");
        assert!(tracker.complete(Offset(10)));
        assert_eq!(tracker.committable(), Some(Offset(13)));
        assert!(tracker.complete(Offset(13)));
        assert!(tracker.complete(Offset(14)));
        assert_eq!(tracker.committable(), Some(Offset(15)));
        assert!(tracker.is_idle());
    }

    #[test]
    fn gaps_and_duplicates() {
        let mut tracker = OffsetTracker::new();
        assert!(tracker.receive(Offset(3)));
        assert!(tracker.receive(Offset(7)));
        assert!(!tracker.receive(Offset(7)), "a repeated offset is refused");
        assert!(
            !tracker.receive(Offset(5)),
            "an offset below the highest is refused"
        );
        assert!(tracker.complete(Offset(7)));
        assert!(!tracker.complete(Offset(7)), "completing twice is refused");
        assert!(!tracker.complete(Offset(5)), "never received");
        assert_eq!(tracker.committable(), Some(Offset(3)));
        assert_eq!(tracker.pending(), 1);
        assert!(tracker.complete(Offset(3)));
        assert_eq!(tracker.committable(), Some(Offset(8)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever order offsets complete in, and whatever gaps they have, the committable position is exactly the lowest
        /// offset not yet done (or one past the last when all are done).
        #[test]
        fn committable_is_lowest_not_done(
            count in 1_usize..60,
            order in proptest::collection::vec(any::<prop::sample::Index>(), 60),
            // Mostly contiguous, as Kafka delivers, with gaps: both ways of finding an offset.
            steps in proptest::collection::vec(prop_oneof![3 => Just(1_i64), 1 => 2_i64..5], 60),
        ) {
            let mut tracker = OffsetTracker::new();
            let offsets: Vec<i64> = steps[..count]
                .iter()
                .scan(0_i64, |next, step| {
                    *next += step;
                    Some(*next)
                })
                .collect();
            for offset in &offsets {
                tracker.receive(Offset(*offset));
            }
            let mut remaining = offsets.clone();
            for index in order.iter().take(count) {
                let offset = remaining.remove(index.index(remaining.len()));
                prop_assert!(tracker.complete(Offset(offset)));
                let expected = remaining.iter().min().copied().unwrap_or(offsets[count - 1] + 1);
                prop_assert_eq!(tracker.committable(), Some(Offset(expected)));
            }
        }
    }
}
