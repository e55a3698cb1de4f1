//! The `TimerStore` conformance suite against the real Cassandra (`scripts/services up`).

mod common;

use prosody_api::conformance::Options;

prosody_api::timer_store_conformance!(
    crate::factory!(common::Shared::new()),
    Options::default().with_cases(64)
);

// The smallest slab size the suite supports, so slab edges are hit often.
mod small_slabs {
    use prosody_api::SlabSize;
    use prosody_api::conformance::Options;
    use prosody_api::conformance::timer::MIN_SLAB_SECS;

    use super::common;

    prosody_api::timer_store_conformance!(
        crate::factory!(common::Shared::with_slab_size(
            SlabSize::from_secs(MIN_SLAB_SECS).unwrap_or_default()
        )),
        Options::default().with_cases(64)
    );
}
