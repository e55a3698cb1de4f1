//! Crash durability: a child process commits timers, deferred work, a dedup record and a state
//! batch, reports that every call returned, and is killed with `SIGKILL` (no destructor, no
//! flush, no clean close). A store opened afterwards on the same directory reads all of it.
//!
//! The child is this test binary re-executed with only the ignored
//! `child_commits_then_waits_to_be_killed` test selected and the directory in an environment
//! variable. It reports readiness with a marker line on its stdout (a pipe the parent reads,
//! so no polling or sleeping) and then blocks reading its stdin, which the parent never
//! writes, until it is killed.
//!
//! The child writes without `fsync` (`with_sync_writes(false)`), the weaker setting: a killed
//! process leaves its WAL records in the OS page cache, so they survive. (Power loss is not
//! covered by this test; synced writes are the default for that.)

// The helpers below are test code outside `#[test]` functions (shared by the two halves of the
// test), where panicking on an error is how they fail.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::num::{NonZeroU16, NonZeroU32};
use std::process::{Command, Stdio};

use prosody_api::storage::{
    DedupRecord, DedupStore, DeferStore, DeferredMessage, DeferredTimer, DequeBounds,
    PartitionScope, ScanDirection, ScanRequest, StateOp, StateScope, StateStore, StateWrite,
    StoredTimer, TimerStore, Ttl,
};
use prosody_api::{Key, ManualClock, Offset, Partition, SlabSize, TimerKind, TimerTime};
use serde_json::json;
use storage_rocksdb::{OpenError, RocksOptions, RocksStore};

const DIR_VARIABLE: &str = "PROSODY_ROCKSDB_CRASH_DIR";
const READY: &str = "PROSODY-CRASH-CHILD-READY";
const CHILD_TEST: &str = "child_commits_then_waits_to_be_killed";

fn options() -> RocksOptions {
    // A fixed clock, so the TTL'd data is judged live the same way in both processes.
    RocksOptions::new()
        .with_clock(ManualClock::new())
        .with_sync_writes(false)
}

fn scope() -> PartitionScope {
    PartitionScope::new("crash-group", "crash-topic", Partition(3))
}

fn state() -> StateScope {
    StateScope::group("crash-group", "crash-collection")
}

fn t(secs: u64) -> TimerTime {
    TimerTime::from_secs(secs)
}

fn dedup_record() -> DedupRecord<'static> {
    DedupRecord::new("k1", "message-id", "1")
}

/// Everything the child commits.
async fn commit_everything(store: &RocksStore) {
    let (scope, k1, k2) = (scope(), Key::from("k1"), Key::from("k2"));
    let app = TimerKind::Application;
    for secs in [1_000, 5_000, 9_000] {
        store.schedule(&scope, &k1, app, t(secs)).await.unwrap();
    }
    store.unschedule(&scope, &k1, app, t(5_000)).await.unwrap();
    store
        .clear_and_schedule(&scope, &k2, TimerKind::DeferRetry, t(7_200))
        .await
        .unwrap();
    store
        .defer_message(
            &scope,
            &k2,
            DeferredMessage {
                offset: Offset(41),
                retry_count: 2,
            },
        )
        .await
        .unwrap();
    store
        .defer_timer(
            &scope,
            &k2,
            DeferredTimer {
                time: t(7_000),
                retry_count: 1,
            },
        )
        .await
        .unwrap();
    store
        .insert(&scope, &dedup_record(), Ttl::from_secs(3600).unwrap())
        .await
        .unwrap();
    let write = |op| StateWrite::new(state(), "k1", op);
    store
        .apply(&[
            write(StateOp::PutValue {
                value: json!({"count": 3}),
                ttl: None,
            }),
            write(StateOp::PutMapEntry {
                entry: "a".into(),
                value: json!(1),
                ttl: Ttl::from_secs(3600),
                keyset_limit: NonZeroU16::new(128),
            }),
            write(StateOp::PutMapEntry {
                entry: "b".into(),
                value: json!([true]),
                ttl: None,
                keyset_limit: None,
            }),
            write(StateOp::SetDequeBounds {
                bounds: DequeBounds::new(-1, 2),
                ttl: None,
                capacity: NonZeroU32::new(10),
            }),
            write(StateOp::PutDequeItem {
                position: -1,
                item: json!("front"),
                ttl: None,
            }),
            write(StateOp::PutDequeItem {
                position: 1,
                item: json!("back"),
                ttl: None,
            }),
        ])
        .await
        .unwrap();
}

/// Asserts that a store reads everything [`commit_everything`] committed.
async fn assert_everything(store: &RocksStore) {
    let (scope, k1, k2) = (scope(), Key::from("k1"), Key::from("k2"));
    let app = TimerKind::Application;
    assert_eq!(
        store.scheduled(&scope, &k1, app).await.unwrap(),
        vec![t(1_000), t(9_000)]
    );
    assert_eq!(
        store
            .scheduled(&scope, &k2, TimerKind::DeferRetry)
            .await
            .unwrap(),
        vec![t(7_200)]
    );
    let slab = t(7_200).slab(SlabSize::DEFAULT);
    assert_eq!(
        store.slab(&scope, slab).await.unwrap(),
        vec![
            StoredTimer {
                time: t(7_200),
                key: k2.clone(),
                kind: TimerKind::DeferRetry
            },
            StoredTimer {
                time: t(9_000),
                key: k1.clone(),
                kind: app
            },
        ]
    );
    assert_eq!(
        store.slabs(&scope, slab).await.unwrap(),
        vec![t(1_000).slab(SlabSize::DEFAULT), slab]
    );
    assert_eq!(
        store.deferred_messages(&scope, &k2).await.unwrap(),
        vec![DeferredMessage {
            offset: Offset(41),
            retry_count: 2
        }]
    );
    assert_eq!(
        store.deferred_timers(&scope, &k2).await.unwrap(),
        vec![DeferredTimer {
            time: t(7_000),
            retry_count: 1
        }]
    );
    assert!(store.contains(&scope, &dedup_record()).await.unwrap());
    assert_eq!(
        store.get_value(&state(), &k1).await.unwrap(),
        Some(json!({"count": 3}))
    );
    let limit = NonZeroU32::new(10).unwrap();
    assert_eq!(
        store
            .scan_map(
                &state(),
                &k1,
                &ScanRequest::first(ScanDirection::Forward, limit)
            )
            .await
            .unwrap(),
        vec![("a".to_owned(), json!(1)), ("b".to_owned(), json!([true]))]
    );
    assert_eq!(
        store.get_deque_bounds(&state(), &k1).await.unwrap(),
        Some(DequeBounds::new(-1, 2))
    );
    assert_eq!(
        store
            .scan_deque(
                &state(),
                &k1,
                &ScanRequest::first(ScanDirection::Backward, limit)
            )
            .await
            .unwrap(),
        vec![(1, json!("back")), (-1, json!("front"))]
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
#[ignore = "the child half of crash_leaves_every_committed_write_readable, which runs it"]
fn child_commits_then_waits_to_be_killed() {
    let Ok(dir) = std::env::var(DIR_VARIABLE) else {
        // Selected by hand without a parent: nothing to do.
        return;
    };
    let store = RocksStore::open(&dir, &options()).unwrap();
    runtime().block_on(commit_everything(&store));
    println!("{READY}");
    // Blocks until the parent kills this process; it never writes to our stdin.
    let mut never = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut never);
    panic!("the parent closed stdin instead of killing the child");
}

#[test]
fn crash_leaves_every_committed_write_readable() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            CHILD_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_VARIABLE, dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(line) => {
                if line.unwrap().contains(READY) {
                    break;
                }
            }
            None => panic!("the child exited before committing: {:?}", child.wait()),
        }
    }

    // While the child lives, its directory is locked, and the error names it.
    match RocksStore::open(dir.path(), &options()) {
        Err(OpenError::Locked { holder, .. }) => assert_eq!(holder, Some(child.id())),
        other => panic!("expected the child's lock, got {other:?}"),
    }

    child.kill().unwrap();
    let status = child.wait().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }
    assert!(!status.success());

    let store = RocksStore::open(dir.path(), &options()).expect("reopen after the crash");
    runtime().block_on(assert_everything(&store));
}
