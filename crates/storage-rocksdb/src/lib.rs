//! Embedded durable storage backend on `RocksDB`, and the local cache for keyed state.
