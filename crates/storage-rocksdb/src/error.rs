//! Errors: [`OpenError`] for opening a store, and the mapping of `RocksDB` failures onto
//! [`StorageError`] for the trait calls.

use std::path::PathBuf;

use prosody_api::{SlabSize, StorageError, StorageErrorKind};

/// Why [`crate::RocksStore::open`] failed. Each message names the directory, so a
/// misconfigured `stateCacheDir` is found from the message alone.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another live store holds the directory.
    #[error(
        "storage directory {} is locked by another live client ({}); every client needs its own directory",
        dir.display(),
        holder.map_or_else(|| "holder pid unknown".to_owned(), |pid| format!("pid {pid}"))
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The process id of the holder, when it could be read from the lock file.
        holder: Option<u32>,
    },
    /// The directory was written with another timer slab size; reading it with this one would
    /// miss timers.
    #[error(
        "storage directory {} holds timers bucketed in slabs of {stored} s, but this store was opened with {requested} s; open it with slab size {stored} s or use a fresh directory",
        dir.display()
    )]
    SlabSizeMismatch {
        /// The directory.
        dir: PathBuf,
        /// The slab size the directory was created with, in seconds.
        stored: u32,
        /// The slab size asked for, in seconds.
        requested: u32,
    },
    /// A file-system operation failed.
    #[error("storage directory {}: cannot {action}: {source}", dir.display())]
    Io {
        /// The directory.
        dir: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// `RocksDB` refused to open or initialise the database.
    #[error("storage directory {}: RocksDB: {source}", dir.display())]
    Rocks {
        /// The directory.
        dir: PathBuf,
        /// The failure.
        #[source]
        source: rocksdb::Error,
    },
}

impl OpenError {
    pub(crate) fn slab_mismatch(dir: PathBuf, stored: u32, requested: SlabSize) -> Self {
        Self::SlabSizeMismatch {
            dir,
            stored,
            requested: requested.as_secs(),
        }
    }
}

/// A `RocksDB` failure during `operation`: a backend error, transient by default (I/O, a busy
/// database), carrying the original error as its source.
pub fn backend(operation: &'static str, error: rocksdb::Error) -> StorageError {
    StorageError::backend(operation, format!("RocksDB: {error}")).with_source(error)
}

/// Stored bytes this crate cannot read back: corruption or a foreign writer. Permanent: a
/// retry reads the same bytes.
pub fn corrupt(operation: &'static str, what: impl std::fmt::Display) -> StorageError {
    StorageError::new(
        operation,
        StorageErrorKind::Corrupt,
        format!("unreadable stored data: {what}"),
    )
}
