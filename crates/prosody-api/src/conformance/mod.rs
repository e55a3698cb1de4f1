//! The storage conformance suite (feature `conformance`).
//!
//! Every storage backend runs the same cases, so "memory, `RocksDB` and Cassandra behave
//! the same" is a tested fact rather than a hope (the `object_store` approach). For each trait there
//! are example-based cases (one behaviour each, named after it) and model-based properties:
//! random operation sequences applied to the store and to a small reference model, compared
//! after every step, with shrinking to a minimal failing sequence.
//!
//! Each case is a plain `async fn(&factory, &Options)` in the trait's module ([`timer`],
//! [`defer`], [`dedup`], [`state`], [`published`]); it panics on a conformance failure, which is
//! how a test reports one. The `*_conformance!` macros (see the crate docs) expand into one
//! `#[test]` per case inside a module named after the trait, so `cargo test` names every case
//! `<trait>::<case>` and counts them per trait.
//!
//! Every case builds its own store through the factory, with its own [`ManualClock`], and uses
//! fresh consumer-group/subsystem names, so cases can share one backing database and a rerun
//! never sees data of an earlier run.
//!
//! The factory must create its connections inside the future it returns: each test drives its
//! case on its own Tokio runtime ([`block_on`]).

// The suite is test code compiled as a library so backends can call it: panicking on a failed
// expectation is how it reports, so the panic-related lints of library code do not apply.
#![allow(
    clippy::missing_panics_doc,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::too_many_lines
)]

pub mod dedup;
pub mod defer;
pub mod published;
pub mod state;
pub mod timer;

mod macros;
mod model;
mod scenario;
mod support;

use std::future::Future;

use crate::clock::ManualClock;

/// Tuning of a conformance run.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// Cases per model-based property (default 256). A slow backend may pass fewer.
    pub cases: u32,
    /// Size of the "large value" written by the large-value cases (default 1 MiB).
    pub large_value_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            cases: 256,
            large_value_bytes: 1024 * 1024,
        }
    }
}

impl Options {
    /// Sets [`Options::cases`].
    #[must_use]
    pub fn with_cases(mut self, cases: u32) -> Self {
        self.cases = cases;
        self
    }

    /// Sets [`Options::large_value_bytes`].
    #[must_use]
    pub fn with_large_value_bytes(mut self, bytes: usize) -> Self {
        self.large_value_bytes = bytes;
        self
    }
}

/// Builds a store for one conformance case. Implemented by every
/// `Fn(ManualClock) -> impl Future` (use [`factory`] to give a closure its argument type).
pub trait StoreFactory {
    /// What the factory builds: a store, or for [`published`] a pair of stores.
    type Store;

    /// Builds a store whose TTL clock is `clock`.
    fn create(&self, clock: ManualClock) -> impl Future<Output = Self::Store>;
}

impl<F, Fut> StoreFactory for F
where
    F: Fn(ManualClock) -> Fut,
    Fut: Future,
{
    type Store = Fut::Output;

    fn create(&self, clock: ManualClock) -> impl Future<Output = Self::Store> {
        self(clock)
    }
}

/// Identity function that gives a closure the factory signature, so `|clock| ...` needs no
/// type annotation.
pub fn factory<F, Fut>(f: F) -> F
where
    F: Fn(ManualClock) -> Fut,
    Fut: Future,
{
    f
}

/// Runs a case to completion on a fresh Tokio runtime (used by the generated tests).
pub fn block_on<F: Future>(case: F) -> F::Output {
    support::block_on_impl(case)
}
