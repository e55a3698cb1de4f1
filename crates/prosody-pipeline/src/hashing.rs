//! The hasher of the pipeline's in-memory maps keyed by message key or partition, which are
//! looked up several times per event (key queues, scheduler, monopolization, defer cache).
//!
//! The standard library's `SipHash` was several percent of the consumer's CPU in profiles of the
//! throughput bench. foldhash is much cheaper on short strings and, seeded per map from a
//! random per-process seed, still keeps keys chosen by whoever produces the records from
//! being aimed at one bucket.

use std::collections::HashMap;

/// A `HashMap` with the pipeline's fast seeded hasher. Build it with `KeyMap::default()`.
pub type KeyMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
