//! The `DedupStore` conformance suite against the real Cassandra (`scripts/services up`).

mod common;

use prosody_api::conformance::Options;

prosody_api::dedup_store_conformance!(
    crate::factory!(common::Shared::new()),
    Options::default().with_cases(64)
);
