//! The `StateStore` conformance suite against the memory backend.

use storage_memory::MemoryStateStore;

prosody_api::state_store_conformance!(|clock| async move { MemoryStateStore::new(clock) });
