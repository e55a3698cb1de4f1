//! The `DeferStore` conformance suite against `RocksDB`.

use storage_rocksdb::{RocksOptions, RocksStore};

prosody_api::defer_store_conformance!(|clock| async move {
    RocksStore::open_temporary(&RocksOptions::new().with_clock(clock)).expect("open a store")
});
