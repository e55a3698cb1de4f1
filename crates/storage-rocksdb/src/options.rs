//! [`RocksOptions`]: how a store is opened.

use std::sync::Arc;
use std::time::Duration;

use prosody_api::{Clock, SlabSize, SystemClock};

/// Options of [`crate::RocksStore::open`]. Defaults suit a durable single-node deployment:
/// the system clock, one-hour slabs, a 64 MiB block cache, 64 MiB of memtables, synced writes.
#[derive(Clone, Debug)]
pub struct RocksOptions {
    clock: Arc<dyn Clock>,
    slab_size: SlabSize,
    block_cache_bytes: usize,
    write_buffer_bytes: usize,
    sync_writes: bool,
    expiry_grace: Duration,
}

impl Default for RocksOptions {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            slab_size: SlabSize::DEFAULT,
            block_cache_bytes: 64 * 1024 * 1024,
            write_buffer_bytes: 64 * 1024 * 1024,
            sync_writes: true,
            expiry_grace: Duration::from_secs(3600),
        }
    }
}

impl RocksOptions {
    /// The defaults.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The clock TTL expiry is judged by, on reads and in compaction (default: the system
    /// clock).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The timer slab size (default one hour, the spec's `slabSizeMs`). It is recorded in the
    /// directory on first open; opening it again with another size fails, because timers would
    /// be looked up in the wrong slabs.
    #[must_use]
    pub fn with_slab_size(mut self, slab_size: SlabSize) -> Self {
        self.slab_size = slab_size;
        self
    }

    /// Capacity of the block cache shared by every column family, index and filter blocks
    /// included (default 64 MiB). This bounds read-side memory.
    #[must_use]
    pub fn with_block_cache_bytes(mut self, bytes: usize) -> Self {
        self.block_cache_bytes = bytes;
        self
    }

    /// Total memtable memory across column families before they are flushed (default 64 MiB).
    /// This bounds write-side memory.
    #[must_use]
    pub fn with_write_buffer_bytes(mut self, bytes: usize) -> Self {
        self.write_buffer_bytes = bytes;
        self
    }

    /// Whether every write waits for its WAL record to reach the disk (`fsync`), default
    /// `true`.
    ///
    /// The write-ahead log is always on, so a write that returned survives a crash of the
    /// process (even `SIGKILL`): the record is in the OS page cache and `RocksDB` replays it on
    /// the next open. Only an OS crash or power loss can lose unsynced records. Synced writes
    /// are the default because the pipeline commits Kafka offsets after state and timers are
    /// written: a write lost after its offset was committed is never replayed. Turn it off for
    /// data that is rebuilt anyway (a local cache in front of Cassandra) or when the disk or
    /// its controller already guarantees persistence. Synced writes run on Tokio's blocking
    /// pool so an `fsync` never stalls an async worker; concurrent writers share one `fsync`
    /// (`RocksDB` group commit). Dedup records are never synced, whatever this says: losing
    /// one can only let a redelivered message be handled again (see the `dedup` module).
    #[must_use]
    pub fn with_sync_writes(mut self, sync: bool) -> Self {
        self.sync_writes = sync;
        self
    }

    /// How long after its expiry an entry may be dropped by compaction (default one hour).
    /// Reads hide an entry from its expiry on; compaction waits this much longer so a clock
    /// stepped back by less than this never sees a live entry disappear. See the crate docs on
    /// expiry.
    #[must_use]
    pub fn with_expiry_grace(mut self, grace: Duration) -> Self {
        self.expiry_grace = grace;
        self
    }

    /// The clock.
    #[must_use]
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The timer slab size.
    #[must_use]
    pub fn slab_size(&self) -> SlabSize {
        self.slab_size
    }

    /// The block cache capacity in bytes.
    #[must_use]
    pub fn block_cache_bytes(&self) -> usize {
        self.block_cache_bytes
    }

    /// The memtable budget in bytes.
    #[must_use]
    pub fn write_buffer_bytes(&self) -> usize {
        self.write_buffer_bytes
    }

    /// Whether writes are synced.
    #[must_use]
    pub fn sync_writes(&self) -> bool {
        self.sync_writes
    }

    /// The compaction grace after expiry.
    #[must_use]
    pub fn expiry_grace(&self) -> Duration {
        self.expiry_grace
    }
}
