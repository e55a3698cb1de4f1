//! The `PublishedStateView` conformance suite against the memory backend.

use storage_memory::MemoryStateStore;

prosody_api::published_state_conformance!(|clock| async move {
    let store = MemoryStateStore::new(clock);
    (store.clone(), store)
});
