//! One live store per directory: a second store on the same directory fails with a message
//! naming the directory and the holder, and the directory is free again once the first closes.
//! (The crash test checks the same across processes, with the holder's pid being the child's.)

use prosody_api::SlabSize;
use storage_rocksdb::{OpenError, RocksOptions, RocksStore};

#[test]
fn a_second_store_on_a_directory_fails_naming_the_directory_and_the_holder() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = RocksOptions::new().with_sync_writes(false);
    let first = RocksStore::open(dir.path(), &options).expect("the first store opens");

    let error = RocksStore::open(dir.path(), &options).expect_err("the second store must fail");
    let message = error.to_string();
    assert!(
        matches!(&error, OpenError::Locked { dir: locked, holder: Some(pid) }
            if locked == dir.path() && *pid == std::process::id()),
        "{error:?}"
    );
    assert!(
        message.contains(&dir.path().display().to_string()),
        "{message}"
    );
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );

    // A clone is the same store, not a second client: it keeps the directory locked.
    let clone = first.clone();
    drop(first);
    assert!(matches!(
        RocksStore::open(dir.path(), &options),
        Err(OpenError::Locked { .. })
    ));
    drop(clone);
    RocksStore::open(dir.path(), &options).expect("the directory is free once the store closed");
}

#[test]
fn a_directory_reopened_with_another_slab_size_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let hourly = RocksOptions::new().with_sync_writes(false);
    drop(RocksStore::open(dir.path(), &hourly).expect("open"));
    let minutely = hourly
        .clone()
        .with_slab_size(SlabSize::from_secs(60).expect("a positive slab size"));
    let error = RocksStore::open(dir.path(), &minutely).expect_err("another slab size");
    assert!(
        matches!(
            error,
            OpenError::SlabSizeMismatch {
                stored: 3600,
                requested: 60,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("3600 s"), "{error}");
    RocksStore::open(dir.path(), &hourly).expect("the original slab size still opens");
}
