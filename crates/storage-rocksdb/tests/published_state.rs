//! The `PublishedStateView` conformance suite against `RocksDB`: the suite writes through the
//! store's `StateStore` side and reads through its published view of the same database.

use storage_rocksdb::{RocksOptions, RocksStore};

prosody_api::published_state_conformance!(|clock| async move {
    let store =
        RocksStore::open_temporary(&RocksOptions::new().with_clock(clock)).expect("open a store");
    (store.clone(), store)
});
