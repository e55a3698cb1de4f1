//! The keyed-state store the state suites run on, chosen by `PROSODY_TEST_STATE_BACKEND`
//! (`memory`, the default, or `rocksdb`). One place to swap, so the suites can run on every
//! backend once the client selects backends itself.

use std::sync::Arc;

use prosody::api::SystemClock;
use prosody::api::storage::StateStore;

/// A fresh store of the selected backend.
pub fn state_store() -> Arc<dyn StateStore> {
    match std::env::var("PROSODY_TEST_STATE_BACKEND").as_deref() {
        Ok("rocksdb") => Arc::new(
            storage_rocksdb::RocksStore::open_temporary(&storage_rocksdb::RocksOptions::new())
                .expect("temporary RocksDB store"),
        ),
        Ok("memory") | Err(_) => Arc::new(storage_memory::MemoryStateStore::new(SystemClock)),
        Ok(other) => panic!("PROSODY_TEST_STATE_BACKEND={other}: expected memory or rocksdb"),
    }
}
