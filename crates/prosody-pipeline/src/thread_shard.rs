//! Which of [`SHARDS`] slots the calling thread writes to: for state that every worker updates
//! on every event and that is read far less often (counters, queues drained in batches).
//!
//! One slot shared by the workers moves its cache line between their cores on every update;
//! a slot per thread, each on a line of its own, stays in its core's cache. Threads are handed
//! slots in turn, so a handful of workers get one each; past [`SHARDS`] threads share (the
//! slots must be safe to share: atomics or locks).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Slots: more than the cores a consumer usually runs on.
pub const SHARDS: usize = 8;

/// Hands each thread its slot, in turn.
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The calling thread's slot, below [`SHARDS`].
#[must_use]
pub fn index() -> usize {
    SLOT.with(|slot| {
        slot.get().unwrap_or_else(|| {
            let assigned = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            slot.set(Some(assigned));
            assigned
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_slot_and_the_next_threads_get_others() {
        let mine = index();
        assert_eq!(index(), mine);
        let theirs: Vec<usize> = (0..SHARDS - 1)
            .map(|_| std::thread::spawn(index).join().unwrap())
            .collect();
        assert!(theirs.iter().all(|&slot| slot < SHARDS));
        // Handed in turn: threads started one after another get distinct slots (other tests'
        // threads may take turns in between, so only distinctness among these is checked).
        let mut distinct = theirs.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() >= (SHARDS - 1) / 2, "{theirs:?}");
    }
}
