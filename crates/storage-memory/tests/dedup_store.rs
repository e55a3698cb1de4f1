//! The `DedupStore` conformance suite against the memory backend.

use storage_memory::MemoryDedupStore;

prosody_api::dedup_store_conformance!(|clock| async move { MemoryDedupStore::new(clock) });
