//! State batches beyond what one logged batch may carry: several cells with megabyte values
//! go through the staged commit and still land whole; a rejected batch leaves nothing.

// Test helpers state expectations the way the tests do.
#![allow(clippy::expect_used)]

mod common;

use prosody_api::storage::{StateOp, StateScope, StateStore, StateWrite};
use prosody_api::{Key, ManualClock, StorageErrorKind};
use serde_json::json;

fn large(bytes: usize, seed: u8) -> serde_json::Value {
    let text: String = (0..bytes)
        .map(|index| char::from(b'a' + u8::try_from((index + usize::from(seed)) % 26).unwrap_or(0)))
        .collect();
    json!({ "blob": text })
}

fn group() -> String {
    common::fresh_keyspace("atomic-group")
}

#[tokio::test]
async fn a_multi_cell_batch_of_megabytes_commits_whole() {
    let store = common::Shared::new().store(ManualClock::new()).await;
    let group = group();
    let owned = StateScope::group(group.as_str(), "owned");
    let published = StateScope::subsystem(group.as_str(), "published");
    let key = Key::from("k");
    let big = large(1024 * 1024, 1);
    let other = large(1024 * 1024, 2);
    let mut batch = vec![
        StateWrite::new(
            owned.clone(),
            key.clone(),
            StateOp::PutValue {
                value: big.clone(),
                ttl: None,
            },
        ),
        StateWrite::new(
            published.clone(),
            key.clone(),
            StateOp::PutValue {
                value: other.clone(),
                ttl: None,
            },
        ),
    ];
    batch.extend((0..64).map(|index| {
        StateWrite::new(
            owned.clone(),
            key.clone(),
            StateOp::PutMapEntry {
                entry: format!("e{index:03}"),
                value: json!(index),
                ttl: None,
                keyset_limit: None,
            },
        )
    }));
    store.apply(&batch).await.expect("a large multi-cell batch");
    assert_eq!(
        store.get_value(&owned, &key).await.expect("read"),
        Some(big)
    );
    assert_eq!(
        store.get_value(&published, &key).await.expect("read"),
        Some(other)
    );
    let entries: Vec<String> = (0..64).map(|index| format!("e{index:03}")).collect();
    let read = store
        .get_map_entries(&owned, &key, &entries)
        .await
        .expect("read");
    assert!(read.iter().all(Option::is_some));
}

#[tokio::test]
async fn a_rejected_large_batch_writes_nothing() {
    let store = common::Shared::new().store(ManualClock::new()).await;
    let group = group();
    let first = StateScope::group(group.as_str(), "first");
    let second = StateScope::group(group.as_str(), "second");
    let key = Key::from("k");
    let batch = vec![
        StateWrite::new(
            first.clone(),
            key.clone(),
            StateOp::PutValue {
                value: large(512 * 1024, 3),
                ttl: None,
            },
        ),
        StateWrite::new(
            second.clone(),
            key.clone(),
            StateOp::PutDequeItem {
                position: 0,
                item: json!("no bounds"),
                ttl: None,
            },
        ),
    ];
    let error = store.apply(&batch).await.expect_err("rejected");
    assert_eq!(error.kind(), StorageErrorKind::InvalidRequest);
    assert_eq!(store.get_value(&first, &key).await.expect("read"), None);
}
