//! An embedded, durable implementation of every Prosody storage trait on `RocksDB`: the backend
//! for single-node deployments that have Kafka but no Cassandra, and the engine of the local
//! state cache.
//!
//! ```no_run
//! use prosody_api::SlabSize;
//! use storage_rocksdb::{RocksOptions, RocksStore};
//!
//! # fn main() -> Result<(), storage_rocksdb::OpenError> {
//! let store = RocksStore::open("/var/lib/prosody", &RocksOptions::new())?;
//! // One store is every trait: hand clones to the pipeline as `Arc<dyn TimerStore>`, etc.
//! # let _ = store;
//! # Ok(())
//! # }
//! ```
//!
//! [`CachedStateStore`] is the other use: a local cache of keyed state in front of a durable
//! store (Cassandra), see its module docs.
//!
//! # Layout
//!
//! One column family per concern (timers by key, timers by time, deferred work, dedup
//! records, keyed state, and a small `meta` family), all sharing one bounded block cache and
//! one memtable budget. Keys use an order-preserving encoding (escaped, terminated strings;
//! big-endian integers, signed ones with the sign bit flipped) so every listing is a bounded
//! range scan, forward or backward; the keyspace module documents every key.
//!
//! # Atomicity and durability
//!
//! Every trait call that writes commits one `WriteBatch`: a handler's staged state writes
//! become visible all at once or not at all, and a timer's two index entries never disagree.
//! The write-ahead log is always on. Writes are synced (`fsync` before returning) by default;
//! see [`RocksOptions::with_sync_writes`] for why, and for what an unsynced write survives
//! (a process crash, including `SIGKILL`) and what it does not (power loss). Dedup records are
//! the exception: never synced, since a lost one only lets a redelivery be handled again, and
//! the pipeline writes one per handled message.
//!
//! # Threads
//!
//! `RocksDB` calls block. Reads run on the calling task: a hot read takes microseconds, less
//! than a hand-off to a thread pool would add. Synced writes wait for an `fsync`, so they run on
//! Tokio's blocking pool and never stall an async worker; unsynced writes run inline.
//! Read-check-write operations (a batch with a keyset limit or deque bounds, clearing a key's
//! timers) hold a lock stripe per cell or timer key from their read to their commit.
//!
//! # Expiry
//!
//! Values that can expire (dedup records, keyed state) start with their expiry instant on the
//! store's [`Clock`](prosody_api::Clock), and reads compare it with that clock, so expiry is
//! exact and independent of compaction. A compaction filter reclaims the space of expired
//! entries, judging by the same clock and only once an entry has been expired for the expiry
//! grace ([`RocksOptions::with_expiry_grace`]): it never drops an entry a read would still
//! return, even if the clock steps back by less than the grace.
//!
//! # The directory lock
//!
//! One live store per directory. The lock is an OS advisory lock on `prosody.lock`, which
//! holds the holder's pid, so a second store fails with [`OpenError::Locked`] naming the
//! directory and the holder; the OS releases it when the holder exits or is killed.

mod cache;
mod dedup;
mod defer;
mod error;
mod families;
mod keys;
mod lock;
mod options;
mod published;
mod state;
mod store;
mod timer;
mod ttl;

pub use cache::CachedStateStore;
pub use error::OpenError;
pub use lock::LOCK_FILE;
pub use options::RocksOptions;
pub use store::RocksStore;
