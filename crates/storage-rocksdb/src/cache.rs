//! The local disk cache for keyed state: a [`StateStore`] that serves point reads from
//! `RocksDB` and writes through to a durable store (Cassandra in production).
//!
//! # What the cache knows, and why it never fills on a read
//!
//! A cached entry is *knowledge* about one point of a cell — the value, one map entry, the
//! deque bounds or one deque item — either "present with this content until this expiry" or
//! "absent". It is learnt from this client's own commits only: after the durable store
//! accepted a batch, the batch's effects are written to the cache in one `WriteBatch`. The
//! durable store's reads do not return expiry instants, so a value filled from a read could
//! outlive its TTL in the cache; learning from commits keeps expiry exact. The pipeline's usual
//! shape — read, change, write the same cell — therefore reads from the durable store once per
//! cell and owner, and from the cache afterwards.
//!
//! Expiry is computed from the clock read *before* the durable commit, so a cached entry
//! never outlives the durable one (which was stamped a moment later); an entry the cache
//! considers expired is simply unknown, and the read asks the durable store, which decides.
//!
//! Ops whose full effect the cache cannot know forget instead of guessing: clearing a map
//! forgets its cached entries, and new deque bounds forget the deque's cached items (the
//! durable store removed the ones outside the bounds). Scans always go to the durable store.
//! A batch whose outcome is unknown (a `Backend` error) forgets every cell it touched.
//!
//! # Ownership
//!
//! The cache is correct only for cells no other client writes, that is for keys of partitions
//! this client owns. [`CachedStateStore::invalidate`] must be called when partitions are
//! revoked: it drops every cached entry (which partition a key belongs to depends on the
//! producer's partitioner, which the cache cannot know, so it drops them all), and a commit
//! that raced with it does not repopulate the cache. A later owner of the partition — and this
//! client, if it gets the partition back — therefore reads the durable store first.
//!
//! # Bounds and lifetime
//!
//! The cache holds at most about `capacity_bytes` of encoded entries: past that it is dropped
//! whole (cheap: one range deletion) and learns again. Its content is worthless after a
//! restart (another owner may have changed the data meanwhile), so it is wiped on open and
//! written without a write-ahead log. The directory is locked like a [`crate::RocksStore`]'s.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use prosody_api::storage::{DequeBounds, ScanRequest, StateOp, StateScope, StateStore, StateWrite};
use prosody_api::{Clock, Key, StorageError, StorageErrorKind};
use rocksdb::{BlockBasedOptions, Cache, DB, Options, WriteBatch, WriteOptions};
use serde_json::Value;
use tempfile::TempDir;

use crate::error::{OpenError, backend, corrupt};
use crate::keys::{Cell, prefix_end};
use crate::lock::DirLock;
use crate::state::codec::{decode_bounds, encode_bounds, encode_json};
use crate::ttl::{self, live, millis};

/// Sub-directory of the cache's database inside its (locked) directory.
const DB_DIR: &str = "state-cache";

/// Most bytes of `RocksDB` block cache the state cache uses, whatever its capacity.
const MAX_BLOCK_CACHE: u64 = 256 * 1024 * 1024;

/// Knowledge of one point, as stored: an empty value means "known absent"; otherwise the
/// crate's expiry header and the payload.
const ABSENT: &[u8] = &[];

/// A [`StateStore`] caching point reads of `durable` in a local `RocksDB` (see the module docs).
///
/// Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct CachedStateStore {
    inner: Arc<Inner>,
}

/// Field order is drop order: the database closes before the lock is released and before a
/// temporary directory is removed.
struct Inner {
    db: DB,
    durable: Arc<dyn StateStore>,
    clock: Arc<dyn Clock>,
    write_options: WriteOptions,
    /// Bumped by every invalidation; a commit that saw another value at its start does not
    /// write to the cache.
    generation: AtomicU64,
    /// Approximate bytes written since the last wipe.
    bytes: AtomicU64,
    capacity_bytes: u64,
    dir: PathBuf,
    _lock: DirLock,
    _temporary: Option<TempDir>,
}

impl CachedStateStore {
    /// Opens the cache in `dir` (a fresh temporary directory removed when the last clone drops
    /// when `None`), wiping what an earlier run left there, in front of `durable`.
    ///
    /// # Errors
    /// [`OpenError::Locked`] when another live client holds `dir`, or an I/O or `RocksDB`
    /// failure naming the directory.
    pub fn open(
        dir: Option<&Path>,
        durable: Arc<dyn StateStore>,
        capacity_bytes: u64,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, OpenError> {
        let (dir, temporary) = if let Some(dir) = dir {
            (dir.to_path_buf(), None)
        } else {
            let temporary = tempfile::Builder::new()
                .prefix("prosody-state-cache-")
                .tempdir()
                .map_err(|source| OpenError::Io {
                    dir: std::env::temp_dir(),
                    action: "create a temporary directory",
                    source,
                })?;
            (temporary.path().to_path_buf(), Some(temporary))
        };
        std::fs::create_dir_all(&dir).map_err(|source| OpenError::Io {
            dir: dir.clone(),
            action: "create the directory",
            source,
        })?;
        let lock = DirLock::acquire(&dir)?;
        let db_dir = dir.join(DB_DIR);
        // Wiped on open: entries of a previous run may be stale (see the module docs).
        match std::fs::remove_dir_all(&db_dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(OpenError::Io {
                    dir: db_dir,
                    action: "wipe the previous state cache",
                    source,
                });
            }
        }
        let mut options = Options::default();
        options.create_if_missing(true);
        let mut table = BlockBasedOptions::default();
        let block_cache =
            usize::try_from(capacity_bytes.min(MAX_BLOCK_CACHE)).unwrap_or(usize::MAX);
        table.set_block_cache(&Cache::new_lru_cache(block_cache));
        options.set_block_based_table_factory(&table);
        let db = DB::open(&options, &db_dir).map_err(|source| OpenError::Rocks {
            dir: db_dir.clone(),
            source,
        })?;
        let mut write_options = WriteOptions::default();
        write_options.disable_wal(true);
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                durable,
                clock,
                write_options,
                generation: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                capacity_bytes,
                dir,
                _lock: lock,
                _temporary: temporary,
            }),
        })
    }

    /// The cache's directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }

    /// The store the cache writes through to.
    #[must_use]
    pub fn durable(&self) -> &Arc<dyn StateStore> {
        &self.inner.durable
    }

    /// Drops every cached entry; call it when partitions are revoked (see the module docs).
    /// Commits running meanwhile do not write their effects to the cache.
    ///
    /// # Errors
    /// A `RocksDB` failure: entries may remain, so the caller must stop using the cache.
    pub fn invalidate(&self) -> Result<(), StorageError> {
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        self.inner.wipe()
    }
}

impl fmt::Debug for CachedStateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedStateStore")
            .field("dir", &self.inner.dir)
            .field("capacity_bytes", &self.inner.capacity_bytes)
            .field("durable", &self.inner.durable)
            .finish_non_exhaustive()
    }
}

/// A read's answer from the cache: unknown (ask the durable store), or known present or absent.
enum Cached<T> {
    Unknown,
    Known(Option<T>),
}

/// What the cache knows about one point.
#[derive(Clone, Copy)]
enum Known<'a> {
    /// Nothing (never learnt, forgotten, or expired in the cache's judgement).
    Unknown,
    /// Known absent.
    Absent,
    /// Known present.
    Present(&'a [u8]),
}

impl Inner {
    fn wipe(&self) -> Result<(), StorageError> {
        const OP: &str = "state_cache.wipe";
        self.bytes.store(0, Ordering::SeqCst);
        let mut batch = WriteBatch::default();
        // Every key starts with a namespace tag byte below 0xff.
        batch.delete_range(&[][..], &[0xff_u8][..]);
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|error| backend(OP, error))
    }

    fn now(&self) -> u64 {
        millis(self.clock.now())
    }

    /// Reads one point and judges it.
    fn lookup<T>(
        &self,
        operation: &'static str,
        key: &[u8],
        judge: impl FnOnce(Known<'_>) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let stored = self
            .db
            .get_pinned(key)
            .map_err(|error| backend(operation, error))?;
        match stored.as_deref() {
            None => judge(Known::Unknown),
            Some(ABSENT) => judge(Known::Absent),
            Some(stored) => {
                let (expiry, payload) = ttl::decode(stored)
                    .ok_or_else(|| corrupt(operation, "a state-cache entry without header"))?;
                if live(expiry, self.now()) {
                    judge(Known::Present(payload))
                } else {
                    judge(Known::Unknown)
                }
            }
        }
    }

    fn json(operation: &'static str, known: Known<'_>) -> Result<Cached<Value>, StorageError> {
        match known {
            Known::Unknown => Ok(Cached::Unknown),
            Known::Absent => Ok(Cached::Known(None)),
            Known::Present(payload) => serde_json::from_slice(payload)
                .map(|value| Cached::Known(Some(value)))
                .map_err(|error| corrupt(operation, error)),
        }
    }

    /// Writes the effects of a committed batch, unless an invalidation happened since
    /// `generation` was read.
    fn learn(&self, writes: &[StateWrite], now: u64, generation: u64) -> Result<(), StorageError> {
        const OP: &str = "state_cache.learn";
        let mut batch = WriteBatch::default();
        for write in writes {
            let cell = Cell::new(&write.scope, &write.key);
            match &write.op {
                StateOp::PutValue { value, ttl } => {
                    batch.put(
                        cell.value().as_bytes(),
                        present_json(OP, value, expiry_at(*ttl, now))?,
                    );
                }
                StateOp::DeleteValue => batch.put(cell.value().as_bytes(), ABSENT),
                StateOp::PutMapEntry {
                    entry, value, ttl, ..
                } => batch.put(
                    cell.map_entry(entry).as_bytes(),
                    present_json(OP, value, expiry_at(*ttl, now))?,
                ),
                StateOp::DeleteMapEntry { entry } => {
                    batch.put(cell.map_entry(entry).as_bytes(), ABSENT);
                }
                StateOp::ClearMap => delete_prefix(&mut batch, cell.map().as_bytes()),
                StateOp::SetDequeBounds {
                    bounds,
                    ttl,
                    capacity,
                } => {
                    let bounds = match capacity {
                        Some(capacity) if bounds.len() > u64::from(capacity.get()) => {
                            DequeBounds::new(
                                bounds.tail.saturating_sub(i64::from(capacity.get())),
                                bounds.tail,
                            )
                        }
                        _ => *bounds,
                    };
                    delete_prefix(&mut batch, cell.items().as_bytes());
                    batch.put(
                        cell.bounds().as_bytes(),
                        encode_bounds(expiry_at(*ttl, now), bounds),
                    );
                }
                StateOp::PutDequeItem {
                    position,
                    item,
                    ttl,
                } => batch.put(
                    cell.item(*position).as_bytes(),
                    present_json(OP, item, expiry_at(*ttl, now))?,
                ),
                StateOp::ClearDeque => {
                    delete_prefix(&mut batch, cell.items().as_bytes());
                    batch.put(cell.bounds().as_bytes(), ABSENT);
                }
            }
        }
        self.commit(OP, batch, generation)
    }

    /// Forgets every cell `writes` touch.
    fn forget(&self, writes: &[StateWrite]) -> Result<(), StorageError> {
        const OP: &str = "state_cache.forget";
        let mut batch = WriteBatch::default();
        for write in writes {
            delete_prefix(&mut batch, Cell::new(&write.scope, &write.key).as_bytes());
        }
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|error| backend(OP, error))
    }

    fn commit(
        &self,
        operation: &'static str,
        batch: WriteBatch,
        generation: u64,
    ) -> Result<(), StorageError> {
        let size = u64::try_from(batch.size_in_bytes()).unwrap_or(u64::MAX);
        if self
            .bytes
            .fetch_add(size, Ordering::SeqCst)
            .saturating_add(size)
            > self.capacity_bytes
        {
            // Bounded by dropping everything: cheap, and the cache relearns from commits.
            return self.wipe();
        }
        // Checked just before the write: an invalidation from here on wipes after this write
        // (it bumps first, then deletes), so the entries never outlive it.
        if self.generation.load(Ordering::SeqCst) != generation {
            return Ok(());
        }
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|error| backend(operation, error))
    }
}

fn expiry_at(ttl: Option<prosody_api::storage::Ttl>, now: u64) -> u64 {
    ttl.map_or(ttl::NEVER, |ttl| {
        now.saturating_add(u64::from(ttl.as_secs()) * 1000)
    })
}

fn present_json(
    operation: &'static str,
    value: &Value,
    expiry: u64,
) -> Result<Vec<u8>, StorageError> {
    encode_json(operation, expiry, value)
}

fn delete_prefix(batch: &mut WriteBatch, prefix: &[u8]) {
    match prefix_end(prefix) {
        Some(end) => batch.delete_range(prefix, end.as_slice()),
        None => batch.delete_range(prefix, &[0xff_u8; 1][..]),
    }
}

#[async_trait]
impl StateStore for CachedStateStore {
    async fn get_value(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<Value>, StorageError> {
        const OP: &str = "state_cache.get_value";
        let cell = Cell::new(scope, key);
        let known = self
            .inner
            .lookup(OP, cell.value().as_bytes(), |known| Inner::json(OP, known))?;
        match known {
            Cached::Known(value) => Ok(value),
            Cached::Unknown => self.inner.durable.get_value(scope, key).await,
        }
    }

    async fn get_map_entries(
        &self,
        scope: &StateScope,
        key: &Key,
        entries: &[String],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        const OP: &str = "state_cache.get_map_entries";
        let cell = Cell::new(scope, key);
        let mut found = Vec::with_capacity(entries.len());
        let mut missing = Vec::new();
        for (index, entry) in entries.iter().enumerate() {
            let known = self
                .inner
                .lookup(OP, cell.map_entry(entry).as_bytes(), |known| {
                    Inner::json(OP, known)
                })?;
            match known {
                Cached::Known(value) => found.push(value),
                Cached::Unknown => {
                    missing.push(index);
                    found.push(None);
                }
            }
        }
        if !missing.is_empty() {
            let asked: Vec<String> = missing
                .iter()
                .map(|&index| entries[index].clone())
                .collect();
            let read = self
                .inner
                .durable
                .get_map_entries(scope, key, &asked)
                .await?;
            for (index, value) in missing.into_iter().zip(read) {
                found[index] = value;
            }
        }
        Ok(found)
    }

    async fn scan_map(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<String>,
    ) -> Result<Vec<(String, Value)>, StorageError> {
        self.inner.durable.scan_map(scope, key, scan).await
    }

    async fn get_deque_bounds(
        &self,
        scope: &StateScope,
        key: &Key,
    ) -> Result<Option<DequeBounds>, StorageError> {
        const OP: &str = "state_cache.get_deque_bounds";
        match self.cached_bounds(OP, &Cell::new(scope, key))? {
            Cached::Known(bounds) => Ok(bounds),
            Cached::Unknown => self.inner.durable.get_deque_bounds(scope, key).await,
        }
    }

    async fn get_deque_items(
        &self,
        scope: &StateScope,
        key: &Key,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, StorageError> {
        const OP: &str = "state_cache.get_deque_items";
        let cell = Cell::new(scope, key);
        let bounds = match self.cached_bounds(OP, &cell)? {
            Cached::Unknown => {
                return self
                    .inner
                    .durable
                    .get_deque_items(scope, key, positions)
                    .await;
            }
            Cached::Known(None) => return Ok(vec![None; positions.len()]),
            Cached::Known(Some(bounds)) => bounds,
        };
        let mut found = Vec::with_capacity(positions.len());
        let mut missing = Vec::new();
        for (index, &position) in positions.iter().enumerate() {
            if !bounds.contains(position) {
                found.push(None);
                continue;
            }
            let known = self
                .inner
                .lookup(OP, cell.item(position).as_bytes(), |known| {
                    Inner::json(OP, known)
                })?;
            match known {
                Cached::Known(value) => found.push(value),
                Cached::Unknown => {
                    missing.push(index);
                    found.push(None);
                }
            }
        }
        if !missing.is_empty() {
            let asked: Vec<i64> = missing.iter().map(|&index| positions[index]).collect();
            let read = self
                .inner
                .durable
                .get_deque_items(scope, key, &asked)
                .await?;
            for (index, value) in missing.into_iter().zip(read) {
                found[index] = value;
            }
        }
        Ok(found)
    }

    async fn scan_deque(
        &self,
        scope: &StateScope,
        key: &Key,
        scan: &ScanRequest<i64>,
    ) -> Result<Vec<(i64, Value)>, StorageError> {
        self.inner.durable.scan_deque(scope, key, scan).await
    }

    async fn apply(&self, writes: &[StateWrite]) -> Result<(), StorageError> {
        if writes.is_empty() {
            return Ok(());
        }
        let generation = self.inner.generation.load(Ordering::SeqCst);
        // Before the durable commit, so cached expiry is never later than the durable one.
        let now = self.inner.now();
        match self.inner.durable.apply(writes).await {
            Ok(()) => {
                if self.inner.learn(writes, now, generation).is_err() {
                    // The durable commit stands, and a cache that could not learn it must not
                    // serve what it knew before: forgetting is enough (only a failure to
                    // forget as well is the caller's problem).
                    self.inner.forget(writes)?;
                }
                Ok(())
            }
            Err(error) => {
                if matches!(
                    error.kind(),
                    StorageErrorKind::LimitExceeded | StorageErrorKind::InvalidRequest
                ) {
                    // Nothing was applied: what the cache knows still holds.
                    return Err(error);
                }
                // The outcome is unknown: forget every touched cell.
                self.inner.forget(writes)?;
                Err(error)
            }
        }
    }
}

impl CachedStateStore {
    /// The cached bounds of the deque of `cell`.
    fn cached_bounds(
        &self,
        operation: &'static str,
        cell: &Cell,
    ) -> Result<Cached<DequeBounds>, StorageError> {
        self.inner
            .lookup(operation, cell.bounds().as_bytes(), |known| match known {
                Known::Unknown => Ok(Cached::Unknown),
                Known::Absent => Ok(Cached::Known(None)),
                Known::Present(payload) => {
                    // `decode_bounds` reads a whole stored value; rebuild it from the payload.
                    let stored = ttl::encode(ttl::NEVER, payload);
                    decode_bounds(operation, &stored, 0).map(Cached::Known)
                }
            })
    }
}
