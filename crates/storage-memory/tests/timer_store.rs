//! The `TimerStore` conformance suite against the memory backend.

use prosody_api::SlabSize;
use storage_memory::MemoryTimerStore;

prosody_api::timer_store_conformance!(|_clock| async { MemoryTimerStore::new(SlabSize::DEFAULT) });

// The same suite with the smallest slab size it supports, so slab edges are hit often.
mod small_slabs {
    use prosody_api::SlabSize;
    use prosody_api::conformance::timer::MIN_SLAB_SECS;
    use storage_memory::MemoryTimerStore;

    prosody_api::timer_store_conformance!(|_clock| async {
        MemoryTimerStore::new(SlabSize::from_secs(MIN_SLAB_SECS).unwrap_or_default())
    });
}
