//! The `TimerStore` conformance suite against `RocksDB`, with the default one-hour slabs and with
//! the smallest slabs the suite supports (so slab edges are hit often).

use prosody_api::SlabSize;
use storage_rocksdb::{RocksOptions, RocksStore};

prosody_api::timer_store_conformance!(|clock| async move {
    let options = RocksOptions::new()
        .with_clock(clock)
        .with_slab_size(SlabSize::DEFAULT);
    RocksStore::open_temporary(&options).expect("open a store")
});

mod small_slabs {
    use prosody_api::SlabSize;
    use prosody_api::conformance::timer::MIN_SLAB_SECS;
    use storage_rocksdb::{RocksOptions, RocksStore};

    prosody_api::timer_store_conformance!(|clock| async move {
        let size = SlabSize::from_secs(MIN_SLAB_SECS).expect("a positive slab size");
        let options = RocksOptions::new().with_clock(clock).with_slab_size(size);
        RocksStore::open_temporary(&options).expect("open a store")
    });
}
