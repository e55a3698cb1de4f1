//! [`RocksStore`]: opening the database and the plumbing every trait implementation shares.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use prosody_api::{Clock, SlabSize, StorageError};
use rocksdb::{Cache, ColumnFamily, DB, DBRawIterator, ReadOptions, WriteBatch, WriteOptions};
use tempfile::TempDir;

use crate::error::{OpenError, backend};
use crate::families::{self, META};
use crate::keys::prefix_end;
use crate::lock::DirLock;
use crate::options::RocksOptions;

/// Meta key of the slab size the directory was created with.
const SLAB_SIZE_KEY: &[u8] = b"timer_slab_secs";

/// Number of lock stripes for read-check-write operations.
const STRIPES: usize = 64;

/// What a write waits for before it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// The store's setting ([`RocksOptions::with_sync_writes`]): for records whose loss after
    /// their offset was committed would lose work (timers, deferred records, keyed state).
    Configured,
    /// The write-ahead log in the OS page cache, never an `fsync`: for records whose loss can
    /// only let a duplicate through (dedup records). They survive a crash of the process; an OS
    /// crash may lose the last ones, after which a redelivered message is handled again, the
    /// at-least-once contract dedup only narrows.
    Buffered,
}

/// One `RocksDB` database implementing every Prosody storage trait: [`TimerStore`],
/// [`DeferStore`], [`DedupStore`], [`StateStore`] and [`PublishedStateView`].
///
/// A cheap handle: clones share the database, so one open store can be handed to the pipeline
/// as each of its `Arc<dyn ...>` stores. The directory is locked while any clone is alive and
/// released when the last one drops.
///
/// [`TimerStore`]: prosody_api::storage::TimerStore
/// [`DeferStore`]: prosody_api::storage::DeferStore
/// [`DedupStore`]: prosody_api::storage::DedupStore
/// [`StateStore`]: prosody_api::storage::StateStore
/// [`PublishedStateView`]: prosody_api::storage::PublishedStateView
#[derive(Clone)]
pub struct RocksStore {
    pub(crate) inner: Arc<Inner>,
}

/// Field order is drop order: the database closes before the directory lock is released, and
/// both before a temporary directory is removed.
pub(crate) struct Inner {
    pub(crate) db: DB,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) slab_size: SlabSize,
    write_options: WriteOptions,
    /// Write options of [`Durability::Buffered`] writes.
    buffered: WriteOptions,
    sync_writes: bool,
    stripes: Stripes,
    dir: PathBuf,
    _lock: DirLock,
    _temporary: Option<TempDir>,
}

impl RocksStore {
    /// Opens (creating if needed) the store in `dir`, locking the directory.
    ///
    /// # Errors
    ///
    /// [`OpenError::Locked`] when another live store holds `dir`;
    /// [`OpenError::SlabSizeMismatch`] when `dir` was created with another slab size;
    /// [`OpenError::Io`] or [`OpenError::Rocks`] when the directory or database cannot be
    /// opened.
    pub fn open(dir: impl AsRef<Path>, options: &RocksOptions) -> Result<Self, OpenError> {
        Self::open_in(dir.as_ref().to_path_buf(), options, None)
    }

    /// Opens a store in a fresh temporary directory that is deleted when the last clone of the
    /// store drops: the per-client default of `stateCacheDir`, and what tests use.
    ///
    /// # Errors
    ///
    /// As [`RocksStore::open`]; the temporary directory is created under the system's temporary
    /// directory.
    pub fn open_temporary(options: &RocksOptions) -> Result<Self, OpenError> {
        let temporary = tempfile::Builder::new()
            .prefix("prosody-rocksdb-")
            .tempdir()
            .map_err(|source| OpenError::Io {
                dir: std::env::temp_dir(),
                action: "create a temporary directory",
                source,
            })?;
        Self::open_in(temporary.path().to_path_buf(), options, Some(temporary))
    }

    fn open_in(
        dir: PathBuf,
        options: &RocksOptions,
        temporary: Option<TempDir>,
    ) -> Result<Self, OpenError> {
        std::fs::create_dir_all(&dir).map_err(|source| OpenError::Io {
            dir: dir.clone(),
            action: "create the directory",
            source,
        })?;
        let lock = DirLock::acquire(&dir)?;
        let cache = Cache::new_lru_cache(options.block_cache_bytes());
        let rocks = |source| OpenError::Rocks {
            dir: dir.clone(),
            source,
        };
        let db = DB::open_cf_descriptors(
            &families::db_options(options),
            &dir,
            families::descriptors(options, &cache),
        )
        .map_err(rocks)?;
        let mut write_options = WriteOptions::default();
        write_options.set_sync(options.sync_writes());
        let inner = Inner {
            db,
            clock: Arc::clone(options.clock()),
            slab_size: options.slab_size(),
            write_options,
            buffered: WriteOptions::default(),
            sync_writes: options.sync_writes(),
            stripes: Stripes::new(),
            dir,
            _lock: lock,
            _temporary: temporary,
        };
        inner.check_slab_size()?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The directory the store lives in.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }

    /// Runs a write. Synced writes wait for an `fsync`, so they run on Tokio's blocking pool
    /// (when there is a runtime) rather than stalling an async worker; unsynced writes only
    /// touch memory and the page cache, so handing them off would cost more than it saves.
    pub(crate) async fn write<T, F>(
        &self,
        operation: &'static str,
        write: F,
    ) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, StorageError> + Send + 'static,
    {
        if self.inner.sync_writes
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let inner = Arc::clone(&self.inner);
            runtime
                .spawn_blocking(move || write(&inner))
                .await
                .map_err(|error| {
                    StorageError::backend(operation, format!("the write task failed: {error}"))
                })?
        } else {
            write(&self.inner)
        }
    }
}

impl fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RocksStore")
            .field("dir", &self.inner.dir)
            .field("slab_size", &self.inner.slab_size)
            .field("sync_writes", &self.inner.sync_writes)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// A column family by name. They are all created at open, so a missing one means the
    /// database was changed underneath us.
    pub(crate) fn family(
        &self,
        operation: &'static str,
        name: &str,
    ) -> Result<&ColumnFamily, StorageError> {
        self.db.cf_handle(name).ok_or_else(|| {
            StorageError::backend(operation, format!("column family `{name}` is missing"))
        })
    }

    /// Commits a batch atomically with the given durability.
    pub(crate) fn commit(
        &self,
        operation: &'static str,
        batch: WriteBatch,
        durability: Durability,
    ) -> Result<(), StorageError> {
        if batch.is_empty() {
            return Ok(());
        }
        let options = match durability {
            Durability::Configured => &self.write_options,
            Durability::Buffered => &self.buffered,
        };
        self.db
            .write_opt(batch, options)
            .map_err(|error| backend(operation, error))
    }

    /// The store clock's current time in milliseconds.
    pub(crate) fn now_millis(&self) -> u64 {
        crate::ttl::millis(self.clock.now())
    }

    /// Locks the stripes of the given identities (in a fixed order, so two callers never wait
    /// on each other crosswise) for a read-check-write.
    pub(crate) fn lock<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<MutexGuard<'_, ()>> {
        self.stripes.lock(ids)
    }

    fn check_slab_size(&self) -> Result<(), OpenError> {
        let rocks = |source| OpenError::Rocks {
            dir: self.dir.clone(),
            source,
        };
        let Some(meta) = self.db.cf_handle(META) else {
            return Err(OpenError::Io {
                dir: self.dir.clone(),
                action: "find the meta column family",
                source: std::io::Error::other("missing column family"),
            });
        };
        let requested = self.slab_size.as_secs();
        if let Some(stored) = self.db.get_cf(meta, SLAB_SIZE_KEY).map_err(rocks)? {
            let stored = <[u8; 4]>::try_from(stored.as_slice()).map_or(0, u32::from_be_bytes);
            return if stored == requested {
                Ok(())
            } else {
                Err(OpenError::slab_mismatch(
                    self.dir.clone(),
                    stored,
                    self.slab_size,
                ))
            };
        }
        // A new directory: record the layout before any timer is written with it.
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        let mut batch = WriteBatch::default();
        batch.put_cf(meta, SLAB_SIZE_KEY, requested.to_be_bytes());
        self.db.write_opt(batch, &sync).map_err(rocks)
    }
}

/// Read options bounding an iterator to `[lower, upper)`.
pub(crate) fn range(lower: &[u8], upper: Option<Vec<u8>>) -> ReadOptions {
    let mut read = ReadOptions::default();
    read.set_iterate_lower_bound(lower.to_vec());
    if let Some(upper) = upper {
        read.set_iterate_upper_bound(upper);
    }
    read
}

/// Read options bounding an iterator to keys starting with `prefix`.
pub(crate) fn prefix(prefix: &[u8]) -> ReadOptions {
    range(prefix, prefix_end(prefix))
}

/// Fails with the iterator's error, if it stopped on one rather than at the end of its range.
pub(crate) fn finished(
    operation: &'static str,
    iterator: &DBRawIterator<'_>,
) -> Result<(), StorageError> {
    iterator.status().map_err(|error| backend(operation, error))
}

/// A fixed set of mutexes, one per hash bucket of identities: bounded memory however many keys
/// there are, and independent keys rarely contend.
struct Stripes(Box<[Mutex<()>; STRIPES]>);

impl Stripes {
    fn new() -> Self {
        Self(Box::new(std::array::from_fn(|_| Mutex::new(()))))
    }

    fn lock<'a>(&self, ids: impl IntoIterator<Item = &'a [u8]>) -> Vec<MutexGuard<'_, ()>> {
        let mut indexes: Vec<usize> = ids
            .into_iter()
            .map(|id| {
                let mut hasher = DefaultHasher::new();
                id.hash(&mut hasher);
                usize::try_from(hasher.finish() % STRIPES as u64).unwrap_or(0)
            })
            .collect();
        indexes.sort_unstable();
        indexes.dedup();
        indexes
            .into_iter()
            .map(|index| self.0[index].lock())
            .collect()
    }
}
