//! Types and traits shared by every Prosody crate: records, the handler contract, error
//! classification, a clock, and the storage traits. No Kafka client and no database driver live
//! here, so the pipeline and every storage backend depend on this crate and never on each
//! other.
//!
//! - [`key`], [`record`], [`timer`]: identifiers, [`Message`], [`ExciseMessage`], [`Timer`].
//! - [`handler`], [`context`]: [`EventHandler`] and the per-event [`EventContext`].
//! - [`error`]: [`ClassifyError`] (transient by default), [`StorageError`], [`ContextError`].
//! - [`clock`]: [`Clock`], [`SystemClock`], [`ManualClock`].
//! - [`coarse_clock`]: [`CoarseInstant`], [`CoarseSystemClock`]: tick-resolution time for
//!   bookkeeping judged in seconds.
//! - [`storage`]: one trait per storage concern, with documented contracts.
//! - `conformance` (feature `conformance`): the suite every storage backend runs.
//!
//! # Running the conformance suite from a backend crate
//!
//! Add `prosody-api = { workspace = true, features = ["conformance"] }` to the backend's
//! `[dev-dependencies]` and write one test file per trait, so `cargo test` reports a count per
//! trait. Each macro expands into a module named after the trait with one `#[test]` per
//! conformance case, so test names read `<trait>::<case>`. The factory receives the
//! [`ManualClock`] the store must judge TTL by and returns a store (anything implementing the
//! trait). The macros are [`timer_store_conformance!`], [`defer_store_conformance!`],
//! [`dedup_store_conformance!`], [`state_store_conformance!`] and
//! [`published_state_conformance!`] (whose factory returns a `(StateStore, PublishedStateView)`
//! pair over the same data). The same cases are plain async functions in `conformance::*` for
//! callers that prefer to drive them directly.
#![cfg_attr(feature = "conformance", doc = include_str!("conformance/USAGE.md"))]

pub mod clock;
pub mod coarse_clock;
pub mod context;
pub mod digest;
pub mod error;
pub mod handler;
pub mod key;
pub mod payload;
pub mod record;
pub mod storage;
pub mod timer;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use clock::{Clock, ManualClock, SystemClock};
pub use coarse_clock::{CoarseInstant, CoarseSystemClock};
pub use context::{
    Cancellation, DequeState, EventContext, KeyedStateContext, MapState, StagedCollection,
    TimerContext, ValueState,
};
pub use error::{
    ClassifyError, ContextError, ErrorClass, HandlerError, StorageError, StorageErrorKind,
};
pub use handler::EventHandler;
pub use key::{CollectionName, ConsumerGroup, Key, Offset, Partition, Subsystem, Topic};
pub use payload::{InvalidPayload, Payload};
pub use record::{ExciseMessage, Headers, Message, Timestamp};
pub use timer::{SlabId, SlabSize, Timer, TimerKind, TimerTime};
