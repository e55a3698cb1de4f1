//! The `DeferStore` conformance suite against the memory backend.

use storage_memory::MemoryDeferStore;

prosody_api::defer_store_conformance!(|_clock| async { MemoryDeferStore::new() });
