//! In-memory implementation of every Prosody storage trait, used by mock mode and unit tests.
//!
//! | store | trait |
//! |---|---|
//! | [`MemoryTimerStore`] | [`TimerStore`](prosody_api::storage::TimerStore) |
//! | [`MemoryDeferStore`] | [`DeferStore`](prosody_api::storage::DeferStore) |
//! | [`MemoryDedupStore`] | [`DedupStore`](prosody_api::storage::DedupStore) |
//! | [`MemoryStateStore`] | [`StateStore`](prosody_api::storage::StateStore) and [`PublishedStateView`](prosody_api::storage::PublishedStateView) |
//!
//! Each store is a cheap handle (`Clone` shares the data) over locks that a call holds for
//! all it reads and writes, which makes every call atomic with respect to every other: the
//! strongest reading of each trait's concurrency contract. Calls never await while holding a
//! lock. (The dedup store splits its records over shards by record, which changes nothing for
//! its calls: each reads or writes one record.)
//!
//! Memory is bounded the way the spec bounds the data: maps by their keyset limit, deques by
//! their capacity, dedup records and keyed state by their TTL (expired data is swept as the
//! store grows, so it does not accumulate); empty keys and partitions are dropped (the dedup
//! store keeps a partition's empty shards, a few KiB, for the store's life).
//!
//! Every store passes the `prosody-api` conformance suite; this crate's `tests/` show the few
//! lines that run it:
//!
//! ```
//! use prosody_api::conformance::{Options, block_on, factory, state};
//! use storage_memory::MemoryStateStore;
//!
//! prosody_api::state_store_conformance!(|clock| async move { MemoryStateStore::new(clock) });
//! prosody_api::published_state_conformance!(
//!     |clock| async move {
//!         let store = MemoryStateStore::new(clock);
//!         (store.clone(), store)
//!     },
//!     Options::default().with_cases(64)
//! );
//!
//! // One case driven directly:
//! fn main() {
//!     let memory = factory(|clock| async move { MemoryStateStore::new(clock) });
//!     block_on(state::deque_capacity_evicts_the_oldest(&memory, &Options::default()));
//! }
//! ```

mod dedup;
mod defer;
mod fingerprints;
mod state;
mod sweep;
mod timer;

use std::sync::Arc;

use prosody_api::{Clock, SlabSize};

pub use dedup::MemoryDedupStore;
pub use defer::MemoryDeferStore;
pub use state::MemoryStateStore;
pub use timer::MemoryTimerStore;

/// One of each store over one clock: what mock mode wires into the pipeline.
#[derive(Clone, Debug)]
pub struct MemoryStorage {
    /// Timers.
    pub timers: MemoryTimerStore,
    /// Deferred messages and timers.
    pub defer: MemoryDeferStore,
    /// Dedup records.
    pub dedup: MemoryDedupStore,
    /// Keyed state; also the published-state view.
    pub state: MemoryStateStore,
}

impl MemoryStorage {
    /// Stores judging TTL by `clock` and bucketing timers by `slab_size`.
    pub fn new(clock: impl Clock + 'static, slab_size: SlabSize) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        Self {
            timers: MemoryTimerStore::new(slab_size),
            defer: MemoryDeferStore::new(),
            dedup: MemoryDedupStore::new(Arc::clone(&clock)),
            state: MemoryStateStore::new(clock),
        }
    }
}
