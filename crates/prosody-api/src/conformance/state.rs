//! [`StateStore`] conformance cases.

use std::num::{NonZeroU16, NonZeroU32};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::model::{Model, Snapshot, Source, probe_entries};
use super::scenario::{COLLECTIONS, Focus, play, scenario_strategy};
use super::support::{check_property, fresh_group, large_value};
use super::{Options, StoreFactory};
use crate::clock::{Clock, ManualClock};
use crate::error::StorageErrorKind;
use crate::key::Key;
use crate::storage::{
    DequeBounds, ScanDirection, ScanRequest, StateOp, StateScope, StateStore, StateWrite, Ttl,
};

struct Fixture {
    store: Arc<dyn StateStore>,
    clock: ManualClock,
    scope: StateScope,
    key: Key,
}

impl Fixture {
    async fn open<F>(factory: &F) -> Self
    where
        F: StoreFactory<Store: StateStore + 'static>,
    {
        let clock = ManualClock::new();
        let store: Arc<dyn StateStore> = Arc::new(factory.create(clock.clone()).await);
        Self {
            store,
            clock,
            scope: StateScope::group(fresh_group(), "collection"),
            key: Key::from("key"),
        }
    }

    fn write(&self, op: StateOp) -> StateWrite {
        StateWrite::new(self.scope.clone(), self.key.clone(), op)
    }

    async fn apply(&self, ops: Vec<StateOp>) {
        let writes: Vec<StateWrite> = ops.into_iter().map(|op| self.write(op)).collect();
        self.store.apply(&writes).await.expect("apply");
    }

    async fn reject(&self, ops: Vec<StateOp>) -> StorageErrorKind {
        let writes: Vec<StateWrite> = ops.into_iter().map(|op| self.write(op)).collect();
        self.store
            .apply(&writes)
            .await
            .expect_err("the batch must be rejected")
            .kind()
    }

    async fn value(&self) -> Option<Value> {
        self.store
            .get_value(&self.scope, &self.key)
            .await
            .expect("get_value")
    }

    fn source(&self) -> Source<'_> {
        Source::Store(&*self.store, &self.scope)
    }

    async fn map(&self) -> Vec<(String, Value)> {
        self.source()
            .map_scan(&self.key, ScanDirection::Forward, limit(1000))
            .await
            .expect("scan_map")
    }

    async fn map_chunk(
        &self,
        direction: ScanDirection,
        after: Option<&str>,
        max: u32,
    ) -> Vec<String> {
        let scan = ScanRequest {
            direction,
            after: after.map(str::to_owned),
            limit: limit(max),
        };
        self.store
            .scan_map(&self.scope, &self.key, &scan)
            .await
            .expect("scan_map")
            .into_iter()
            .map(|(entry, _)| entry)
            .collect()
    }

    async fn bounds(&self) -> Option<DequeBounds> {
        self.store
            .get_deque_bounds(&self.scope, &self.key)
            .await
            .expect("get_deque_bounds")
    }

    async fn items(&self, positions: &[i64]) -> Vec<Option<Value>> {
        self.store
            .get_deque_items(&self.scope, &self.key, positions)
            .await
            .expect("get_deque_items")
    }

    async fn deque(&self) -> Vec<(i64, Value)> {
        self.source()
            .deque_scan(&self.key, ScanDirection::Forward, limit(1000))
            .await
            .expect("scan_deque")
    }

    async fn snapshot(&self) -> Snapshot {
        self.source()
            .snapshot(&self.key, &probe_entries(&["a", "b", "c"]))
            .await
            .expect("snapshot")
    }

    /// The ops the runtime stages for a push onto the current deque.
    async fn push(&self, item: Value, capacity: Option<u32>) {
        let current = self.bounds().await.unwrap_or(DequeBounds::new(0, 0));
        self.apply(push_ops(current, item, capacity)).await;
    }
}

fn push_ops(current: DequeBounds, item: Value, capacity: Option<u32>) -> Vec<StateOp> {
    vec![
        StateOp::SetDequeBounds {
            bounds: DequeBounds::new(current.head, current.tail + 1),
            ttl: None,
            capacity: capacity.and_then(NonZeroU32::new),
        },
        StateOp::PutDequeItem {
            position: current.tail,
            item,
            ttl: None,
        },
    ]
}

fn limit(max: u32) -> NonZeroU32 {
    NonZeroU32::new(max).expect("a positive limit")
}

fn ttl(secs: u32) -> Option<Ttl> {
    Ttl::from_secs(secs)
}

fn put(value: Value) -> StateOp {
    StateOp::PutValue { value, ttl: None }
}

fn entry(entry: &str, value: Value) -> StateOp {
    StateOp::PutMapEntry {
        entry: entry.to_owned(),
        value,
        ttl: None,
        keyset_limit: None,
    }
}

fn limited_entry(entry: &str, value: Value, keyset_limit: u16) -> StateOp {
    StateOp::PutMapEntry {
        entry: entry.to_owned(),
        value,
        ttl: None,
        keyset_limit: NonZeroU16::new(keyset_limit),
    }
}

fn bounds(head: i64, tail: i64) -> StateOp {
    StateOp::SetDequeBounds {
        bounds: DequeBounds::new(head, tail),
        ttl: None,
        capacity: None,
    }
}

fn item(position: i64, item: Value) -> StateOp {
    StateOp::PutDequeItem {
        position,
        item,
        ttl: None,
    }
}

fn entries(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
    pairs
        .iter()
        .map(|(entry, value)| ((*entry).to_owned(), value.clone()))
        .collect()
}

/// A cell that was never written has no value.
pub async fn value_absent_until_put<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    assert_eq!(fixture.value().await, None);
    fixture.apply(vec![put(json!(1))]).await;
    assert_eq!(fixture.value().await, Some(json!(1)));
}

/// A put replaces the value; a delete removes it and is a no-op when repeated.
pub async fn value_put_overwrites_and_delete_removes<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture.apply(vec![put(json!("first"))]).await;
    fixture.apply(vec![put(json!({"second": true}))]).await;
    assert_eq!(fixture.value().await, Some(json!({"second": true})));
    fixture.apply(vec![StateOp::DeleteValue]).await;
    assert_eq!(fixture.value().await, None);
    fixture.apply(vec![StateOp::DeleteValue]).await;
    assert_eq!(fixture.value().await, None);
}

/// Every JSON shape, including the "empty" ones and `null`, is stored as present and read back
/// equal, as a value, a map entry (also under the empty entry key) and a deque item.
pub async fn every_json_shape_round_trips<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let shapes = [
        Value::Null,
        json!(false),
        json!(true),
        json!(0),
        json!(-1.5),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(""),
        json!("\u{fc}n\u{ef}c\u{f8}d\u{e9} \u{1f389} \"quoted\" \\ \n"),
        json!([]),
        json!({}),
        json!({"nested": [1, {"deep": [null, "x"]}], "": ""}),
    ];
    for shape in &shapes {
        fixture
            .apply(vec![
                put(shape.clone()),
                entry("", shape.clone()),
                StateOp::ClearDeque,
                bounds(0, 1),
                item(0, shape.clone()),
            ])
            .await;
        assert_eq!(fixture.value().await.as_ref(), Some(shape));
        assert_eq!(fixture.map().await, entries(&[("", shape.clone())]));
        assert_eq!(fixture.items(&[0]).await, vec![Some(shape.clone())]);
    }
}

/// A value with a TTL is present one second before it elapses and absent exactly at it.
pub async fn value_expires_exactly_at_its_ttl<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture
        .apply(vec![StateOp::PutValue {
            value: json!(1),
            ttl: ttl(10),
        }])
        .await;
    fixture.clock.advance(Duration::from_secs(9));
    assert_eq!(fixture.value().await, Some(json!(1)));
    fixture.clock.advance(Duration::from_secs(1));
    assert_eq!(fixture.value().await, None);
}

/// Rewriting restarts the TTL; a write without TTL outlives a century.
pub async fn rewrite_restarts_ttl_and_no_ttl_never_expires<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let with_ttl = |value: Value| StateOp::PutValue {
        value,
        ttl: ttl(10),
    };
    fixture.apply(vec![with_ttl(json!(1))]).await;
    fixture.clock.advance(Duration::from_secs(8));
    fixture.apply(vec![with_ttl(json!(2))]).await;
    fixture.clock.advance(Duration::from_secs(8));
    assert_eq!(fixture.value().await, Some(json!(2)));
    fixture.clock.advance(Duration::from_secs(2));
    assert_eq!(fixture.value().await, None);
    fixture.apply(vec![put(json!(3))]).await;
    fixture
        .clock
        .advance(Duration::from_secs(100 * 365 * 24 * 3600));
    assert_eq!(fixture.value().await, Some(json!(3)));
}

/// `get_map_entries` answers in the order asked, absent entries as `None`, duplicates allowed.
pub async fn map_reads_present_and_absent_entries<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let read = |names: &[&str]| {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let fixture = &fixture;
        async move {
            fixture
                .store
                .get_map_entries(&fixture.scope, &fixture.key, &names)
                .await
                .expect("get_map_entries")
        }
    };
    assert_eq!(read(&["a"]).await, vec![None]);
    fixture
        .apply(vec![entry("a", json!(1)), entry("b", json!(2))])
        .await;
    assert_eq!(
        read(&["b", "x", "a", "b"]).await,
        vec![Some(json!(2)), None, Some(json!(1)), Some(json!(2))]
    );
    assert!(read(&[]).await.is_empty());
}

/// Scans order entry keys by their UTF-8 bytes; backward is the exact reverse.
pub async fn map_scan_orders_keys_by_bytes_both_directions<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let mut names = vec![
        "b",
        "a",
        "B",
        "\u{e4}",
        "aa",
        "",
        "z",
        "10",
        "9",
        "\u{1f389}",
        "a b",
        "A",
    ];
    fixture
        .apply(
            names
                .iter()
                .enumerate()
                .map(|(index, name)| entry(name, json!(index)))
                .collect(),
        )
        .await;
    names.sort_unstable();
    let forward: Vec<String> = fixture
        .map()
        .await
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(forward, names);
    let backward: Vec<String> = fixture
        .source()
        .map_scan(&fixture.key, ScanDirection::Backward, limit(5))
        .await
        .expect("scan")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    names.reverse();
    assert_eq!(backward, names);
}

/// Paging with every chunk size from 1 to past the end, in both directions, yields every entry
/// exactly once in order (chunk size and order are checked on each chunk).
pub async fn map_scan_chunks_page_without_gaps_or_repeats<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let names: Vec<String> = (0..10).map(|index| format!("entry-{index:02}")).collect();
    fixture
        .apply(names.iter().map(|name| entry(name, json!(name))).collect())
        .await;
    for max in 1..=11 {
        for direction in [ScanDirection::Forward, ScanDirection::Backward] {
            let scanned: Vec<String> = fixture
                .source()
                .map_scan(&fixture.key, direction, limit(max))
                .await
                .expect("scan")
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            let mut expected = names.clone();
            if direction == ScanDirection::Backward {
                expected.reverse();
            }
            assert_eq!(scanned, expected, "chunks of {max} {direction:?}");
        }
    }
    assert_eq!(
        fixture
            .map_chunk(ScanDirection::Forward, None, 3)
            .await
            .len(),
        3,
        "a first chunk with more entries remaining is full"
    );
}

/// A cursor is a position, not an entry: it may fall between, before or after the entries.
pub async fn map_scan_cursor_need_not_be_present<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture
        .apply(vec![
            entry("b", json!(1)),
            entry("d", json!(2)),
            entry("f", json!(3)),
        ])
        .await;
    let forward = ScanDirection::Forward;
    let backward = ScanDirection::Backward;
    assert_eq!(fixture.map_chunk(forward, Some("c"), 10).await, ["d", "f"]);
    assert_eq!(
        fixture.map_chunk(forward, Some(""), 10).await,
        ["b", "d", "f"]
    );
    assert_eq!(fixture.map_chunk(forward, Some("d"), 10).await, ["f"]);
    assert!(fixture.map_chunk(forward, Some("f"), 10).await.is_empty());
    assert!(fixture.map_chunk(forward, Some("g"), 10).await.is_empty());
    assert_eq!(fixture.map_chunk(backward, Some("c"), 10).await, ["b"]);
    assert!(fixture.map_chunk(backward, Some("a"), 10).await.is_empty());
    assert_eq!(fixture.map_chunk(backward, Some("z"), 2).await, ["f", "d"]);
}

/// Each map entry expires on its own TTL, in point reads and scans alike.
pub async fn map_entries_expire_individually<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let timed = |name: &str, secs: Option<u32>| StateOp::PutMapEntry {
        entry: name.to_owned(),
        value: json!(name),
        ttl: secs.and_then(Ttl::from_secs),
        keyset_limit: None,
    };
    fixture
        .apply(vec![
            timed("a", Some(5)),
            timed("b", Some(10)),
            timed("c", None),
        ])
        .await;
    fixture.clock.advance(Duration::from_secs(5));
    assert_eq!(
        fixture.map().await,
        entries(&[("b", json!("b")), ("c", json!("c"))])
    );
    assert_eq!(fixture.snapshot().await.map_points[0], None);
    fixture.clock.advance(Duration::from_secs(5));
    assert_eq!(fixture.map().await, entries(&[("c", json!("c"))]));
    assert_eq!(
        fixture.snapshot().await.map_backward,
        entries(&[("c", json!("c"))])
    );
}

/// Deleting an entry removes only it (absent entries are a no-op); clearing removes all.
pub async fn map_delete_and_clear<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture
        .apply(vec![
            entry("a", json!(1)),
            entry("b", json!(2)),
            entry("c", json!(3)),
        ])
        .await;
    fixture
        .apply(vec![
            StateOp::DeleteMapEntry { entry: "b".into() },
            StateOp::DeleteMapEntry { entry: "x".into() },
        ])
        .await;
    assert_eq!(
        fixture.map().await,
        entries(&[("a", json!(1)), ("c", json!(3))])
    );
    fixture.apply(vec![StateOp::ClearMap]).await;
    assert!(fixture.map().await.is_empty());
    fixture.apply(vec![entry("d", json!(4))]).await;
    assert_eq!(fixture.map().await, entries(&[("d", json!(4))]));
}

/// A map with the default keyset limit (128) holds exactly 128 entries, all scannable; one
/// more new entry is rejected without applying anything; overwrites, deletes and expiry free
/// or keep room as expected.
pub async fn map_keyset_holds_up_to_the_limit<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    const LIMIT: u16 = 128;
    let fixture = Fixture::open(factory).await;
    let names: Vec<String> = (0..LIMIT).map(|index| format!("k{index:04}")).collect();
    fixture
        .apply(
            names
                .iter()
                .map(|name| limited_entry(name, json!(name), LIMIT))
                .collect(),
        )
        .await;
    let scanned: Vec<String> = fixture
        .source()
        .map_scan(&fixture.key, ScanDirection::Forward, limit(50))
        .await
        .expect("scan")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(scanned, names, "every entry up to the limit is scannable");

    let kind = fixture
        .reject(vec![limited_entry("extra", json!(0), LIMIT)])
        .await;
    assert_eq!(kind, StorageErrorKind::LimitExceeded);
    assert_eq!(fixture.map().await.len(), usize::from(LIMIT));
    assert_eq!(
        fixture.map_chunk(ScanDirection::Backward, None, 1).await,
        [names[127].clone()]
    );

    fixture
        .apply(vec![limited_entry(&names[0], json!("overwritten"), LIMIT)])
        .await;
    fixture
        .apply(vec![
            StateOp::DeleteMapEntry {
                entry: names[1].clone(),
            },
            limited_entry("extra", json!(1), LIMIT),
        ])
        .await;
    assert_eq!(fixture.map().await.len(), usize::from(LIMIT));

    fixture
        .apply(vec![StateOp::PutMapEntry {
            entry: names[2].clone(),
            value: json!("short-lived"),
            ttl: ttl(5),
            keyset_limit: NonZeroU16::new(LIMIT),
        }])
        .await;
    fixture.clock.advance(Duration::from_secs(5));
    fixture
        .apply(vec![limited_entry("after-expiry", json!(2), LIMIT)])
        .await;
    let map = fixture.map().await;
    assert_eq!(map.len(), usize::from(LIMIT));
    assert!(map.iter().any(|(name, _)| name == "after-expiry"));
    assert!(!map.iter().any(|(name, _)| name == &names[2]));
}

/// A keyset overflow in the middle of a batch rejects the whole batch, including writes to other
/// collections and kinds before it.
pub async fn map_keyset_overflow_rejects_the_whole_batch<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture
        .apply(vec![
            limited_entry("a", json!(1), 2),
            limited_entry("b", json!(2), 2),
        ])
        .await;
    let other = StateScope::group(fresh_group(), "other");
    let batch = vec![
        StateWrite::new(other.clone(), fixture.key.clone(), put(json!("other"))),
        fixture.write(put(json!("mine"))),
        fixture.write(StateOp::DeleteMapEntry { entry: "a".into() }),
        fixture.write(limited_entry("a", json!(10), 2)),
        fixture.write(limited_entry("c", json!(3), 2)),
        fixture.write(bounds(0, 1)),
    ];
    let error = fixture
        .store
        .apply(&batch)
        .await
        .expect_err("overflow rejects");
    assert_eq!(error.kind(), StorageErrorKind::LimitExceeded);
    assert_eq!(fixture.value().await, None);
    assert_eq!(
        fixture
            .store
            .get_value(&other, &fixture.key)
            .await
            .expect("get_value"),
        None
    );
    assert_eq!(
        fixture.map().await,
        entries(&[("a", json!(1)), ("b", json!(2))])
    );
    assert_eq!(fixture.bounds().await, None);
}

/// Without a keyset limit a map holds more entries than the largest limit (4096) and scans
/// them all.
pub async fn unbounded_map_exceeds_the_largest_keyset_limit<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let count = 4097_usize;
    let names: Vec<String> = (0..count).map(|index| format!("{index:05}")).collect();
    for chunk in names.chunks(512) {
        fixture
            .apply(chunk.iter().map(|name| entry(name, json!(1))).collect())
            .await;
    }
    let scanned = fixture
        .source()
        .map_scan(&fixture.key, ScanDirection::Backward, limit(1000))
        .await
        .expect("scan");
    assert_eq!(scanned.len(), count);
    assert_eq!(scanned[0].0, names[count - 1]);
}

/// A deque that was never written has no bounds and no items; empty bounds are present.
pub async fn deque_absent_until_bounds_set<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    assert_eq!(fixture.bounds().await, None);
    assert!(fixture.deque().await.is_empty());
    assert_eq!(fixture.items(&[0, -1]).await, vec![None, None]);
    fixture.apply(vec![bounds(0, 0)]).await;
    assert_eq!(fixture.bounds().await, Some(DequeBounds::new(0, 0)));
    assert!(fixture.deque().await.is_empty());
}

/// Push and unshift as the runtime stages them: items live at negative and positive positions,
/// point reads outside the bounds are absent.
pub async fn deque_items_at_negative_and_positive_positions<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture.push(json!("a"), None).await;
    fixture.push(json!("b"), None).await;
    fixture
        .apply(vec![bounds(-1, 2), item(-1, json!("z"))])
        .await;
    assert_eq!(fixture.bounds().await, Some(DequeBounds::new(-1, 2)));
    assert_eq!(
        fixture.items(&[-1, 0, 1, 2, -2]).await,
        vec![
            Some(json!("z")),
            Some(json!("a")),
            Some(json!("b")),
            None,
            None
        ]
    );
    assert_eq!(
        fixture.deque().await,
        vec![(-1, json!("z")), (0, json!("a")), (1, json!("b"))]
    );
}

/// Deque scans page in both directions with every chunk size, from cursors inside and outside
/// the bounds.
pub async fn deque_scan_chunks_both_directions<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let mut ops = vec![bounds(-3, 4)];
    ops.extend((-3..4).map(|position| item(position, json!(position))));
    fixture.apply(ops).await;
    let all: Vec<(i64, Value)> = (-3..4)
        .map(|position| (position, json!(position)))
        .collect();
    for max in 1..=8 {
        assert_eq!(
            fixture
                .source()
                .deque_scan(&fixture.key, ScanDirection::Forward, limit(max))
                .await
                .expect("scan"),
            all
        );
        let mut reversed = all.clone();
        reversed.reverse();
        assert_eq!(
            fixture
                .source()
                .deque_scan(&fixture.key, ScanDirection::Backward, limit(max))
                .await
                .expect("scan"),
            reversed
        );
    }
    let chunk = |direction, after, max| {
        let fixture = &fixture;
        async move {
            fixture
                .store
                .scan_deque(
                    &fixture.scope,
                    &fixture.key,
                    &ScanRequest {
                        direction,
                        after,
                        limit: limit(max),
                    },
                )
                .await
                .expect("scan_deque")
                .into_iter()
                .map(|(position, _)| position)
                .collect::<Vec<i64>>()
        }
    };
    assert_eq!(chunk(ScanDirection::Forward, Some(-100), 2).await, [-3, -2]);
    assert_eq!(chunk(ScanDirection::Forward, Some(1), 10).await, [2, 3]);
    assert_eq!(chunk(ScanDirection::Backward, Some(100), 2).await, [3, 2]);
    assert_eq!(chunk(ScanDirection::Backward, Some(-2), 10).await, [-3]);
    assert!(chunk(ScanDirection::Forward, Some(3), 10).await.is_empty());
}

/// Narrowing the bounds (pop, shift) deletes the items outside them for good.
pub async fn deque_bounds_drop_items_outside<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let mut ops = vec![bounds(0, 5)];
    ops.extend((0..5).map(|position| item(position, json!(position))));
    fixture.apply(ops).await;
    fixture.apply(vec![bounds(1, 4)]).await;
    assert_eq!(
        fixture.deque().await,
        vec![(1, json!(1)), (2, json!(2)), (3, json!(3))]
    );
    fixture.apply(vec![bounds(0, 5)]).await;
    assert_eq!(
        fixture.items(&[0, 1, 4]).await,
        vec![None, Some(json!(1)), None],
        "dropped items stay dropped when the bounds grow back"
    );
}

/// Pushing past the capacity evicts from the front, oldest first; bounds set without a
/// capacity (unshift) never evict.
pub async fn deque_capacity_evicts_the_oldest<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    for index in 0..5 {
        fixture.push(json!(index), Some(3)).await;
    }
    assert_eq!(fixture.bounds().await, Some(DequeBounds::new(2, 5)));
    assert_eq!(
        fixture.deque().await,
        vec![(2, json!(2)), (3, json!(3)), (4, json!(4))]
    );
    assert_eq!(fixture.items(&[0, 1]).await, vec![None, None]);
    fixture
        .apply(vec![bounds(1, 5), item(1, json!("front"))])
        .await;
    assert_eq!(fixture.deque().await.len(), 4, "unshift does not evict");
    fixture.push(json!(5), Some(3)).await;
    assert_eq!(
        fixture.deque().await,
        vec![(3, json!(3)), (4, json!(4)), (5, json!(5))]
    );
    fixture.push(json!(6), Some(1)).await;
    assert_eq!(fixture.deque().await, vec![(6, json!(6))]);
}

/// An item outside the bounds, an item without bounds and inverted bounds are invalid
/// requests that reject their whole batch.
pub async fn deque_invalid_writes_reject_the_whole_batch<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let kind = fixture
        .reject(vec![put(json!(1)), item(0, json!("no bounds"))])
        .await;
    assert_eq!(kind, StorageErrorKind::InvalidRequest);
    assert_eq!(fixture.value().await, None);
    fixture.apply(vec![bounds(0, 1), item(0, json!("a"))]).await;
    let kind = fixture
        .reject(vec![StateOp::ClearMap, item(1, json!("beyond the tail"))])
        .await;
    assert_eq!(kind, StorageErrorKind::InvalidRequest);
    let kind = fixture.reject(vec![bounds(5, 2)]).await;
    assert_eq!(kind, StorageErrorKind::InvalidRequest);
    assert_eq!(fixture.deque().await, vec![(0, json!("a"))]);
    assert_eq!(fixture.bounds().await, Some(DequeBounds::new(0, 1)));
}

/// A batch that two writes would each reject fails with the error of the earlier one, as if
/// applied in order, even when the later one belongs to a key the batch touched first (found by
/// the model-based suite on Cassandra, which planned key by key).
pub async fn a_rejected_batch_reports_its_earliest_failing_write<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let other = Key::from("other");
    let on_other = |op| StateWrite::new(fixture.scope.clone(), other.clone(), op);
    fixture
        .store
        .apply(&[on_other(limited_entry("taken", json!(0), 1))])
        .await
        .expect("apply");
    let batch = [
        fixture.write(entry("fine", json!(1))),
        on_other(limited_entry("over the limit", json!(2), 1)),
        fixture.write(item(0, json!("no bounds"))),
    ];
    let error = fixture.store.apply(&batch).await.expect_err("rejected");
    assert_eq!(error.kind(), StorageErrorKind::LimitExceeded);
    assert!(
        fixture.map().await.is_empty(),
        "nothing of the batch applied"
    );
}

/// Items expire on their own TTL inside live bounds; when the bounds expire the whole deque is
/// gone, and items do not come back under new bounds.
pub async fn deque_items_and_bounds_expire<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture
        .apply(vec![
            StateOp::SetDequeBounds {
                bounds: DequeBounds::new(0, 2),
                ttl: ttl(10),
                capacity: None,
            },
            StateOp::PutDequeItem {
                position: 0,
                item: json!("short"),
                ttl: ttl(5),
            },
            item(1, json!("forever")),
        ])
        .await;
    fixture.clock.advance(Duration::from_secs(5));
    assert_eq!(fixture.bounds().await, Some(DequeBounds::new(0, 2)));
    assert_eq!(fixture.deque().await, vec![(1, json!("forever"))]);
    assert_eq!(fixture.items(&[0]).await, vec![None]);
    fixture.clock.advance(Duration::from_secs(5));
    assert_eq!(fixture.bounds().await, None);
    assert!(fixture.deque().await.is_empty());
    assert_eq!(fixture.items(&[1]).await, vec![None]);
    fixture.apply(vec![bounds(0, 2)]).await;
    assert_eq!(fixture.items(&[0, 1]).await, vec![None, None]);
}

/// Clearing a deque removes its bounds and items; new bounds start empty.
pub async fn deque_clear_removes_everything<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture.push(json!(1), None).await;
    fixture.push(json!(2), None).await;
    fixture.apply(vec![StateOp::ClearDeque]).await;
    assert_eq!(fixture.bounds().await, None);
    assert!(fixture.deque().await.is_empty());
    fixture.apply(vec![bounds(0, 2)]).await;
    assert_eq!(fixture.items(&[0, 1]).await, vec![None, None]);
}

/// The ops of a batch apply in order.
pub async fn batch_ops_apply_in_order<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture
        .apply(vec![put(json!(1)), StateOp::DeleteValue])
        .await;
    assert_eq!(fixture.value().await, None);
    fixture
        .apply(vec![StateOp::DeleteValue, put(json!(2))])
        .await;
    assert_eq!(fixture.value().await, Some(json!(2)));
    fixture
        .apply(vec![
            entry("a", json!(1)),
            StateOp::ClearMap,
            entry("b", json!(2)),
        ])
        .await;
    assert_eq!(fixture.map().await, entries(&[("b", json!(2))]));
    fixture
        .apply(vec![
            bounds(0, 1),
            item(0, json!("old")),
            StateOp::ClearDeque,
            bounds(0, 1),
            item(0, json!("x")),
            item(0, json!("y")),
        ])
        .await;
    assert_eq!(fixture.deque().await, vec![(0, json!("y"))]);
}

/// Applying the same batch twice leaves the state of applying it once, also when it evicts
/// through a capacity, narrows bounds and deletes entries.
pub async fn reapplying_a_batch_is_idempotent<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture
        .apply(vec![
            entry("a", json!(1)),
            entry("b", json!(2)),
            bounds(0, 3),
            item(0, json!(0)),
            item(1, json!(1)),
            item(2, json!(2)),
        ])
        .await;
    let mut ops = vec![
        StateOp::PutValue {
            value: json!({"v": 1}),
            ttl: ttl(100),
        },
        StateOp::DeleteMapEntry { entry: "a".into() },
        limited_entry("c", json!(3), 2),
    ];
    ops.extend(push_ops(DequeBounds::new(0, 3), json!(3), Some(3)));
    ops.push(bounds(2, 4));
    let writes: Vec<StateWrite> = ops.into_iter().map(|op| fixture.write(op)).collect();
    fixture.store.apply(&writes).await.expect("first apply");
    let once = fixture.snapshot().await;
    fixture.store.apply(&writes).await.expect("second apply");
    assert_eq!(fixture.snapshot().await, once);
    let mut model = Model::default();
    let now = fixture.clock.now();
    model
        .apply(
            &[
                fixture.write(entry("a", json!(1))),
                fixture.write(entry("b", json!(2))),
                fixture.write(bounds(0, 3)),
                fixture.write(item(0, json!(0))),
                fixture.write(item(1, json!(1))),
                fixture.write(item(2, json!(2))),
            ],
            now,
        )
        .expect("model");
    model.apply(&writes, now).expect("model");
    let expected = model
        .cell(&fixture.scope, &fixture.key)
        .snapshot(now, &probe_entries(&["a", "b", "c"]));
    assert_eq!(once, expected);
}

/// An empty batch succeeds and changes nothing.
pub async fn empty_batch_is_a_no_op<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    fixture.apply(vec![put(json!(1))]).await;
    fixture.store.apply(&[]).await.expect("empty batch");
    assert_eq!(fixture.value().await, Some(json!(1)));
}

/// Writes to one cell are invisible to another key, another collection (also one whose name
/// extends this one), another group, the subsystem namespace of the same name, and to the other
/// kinds of the same cell.
pub async fn keys_collections_and_namespaces_are_isolated<F>(factory: &F, _: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let group = match &fixture.scope.namespace {
        crate::storage::StateNamespace::Group(group) => group.clone(),
        crate::storage::StateNamespace::Subsystem(_) => unreachable!("fixtures use groups"),
    };
    fixture
        .apply(vec![
            put(json!("v")),
            entry("e", json!("m")),
            bounds(0, 1),
            item(0, json!("d")),
        ])
        .await;
    let others = [
        (fixture.scope.clone(), Key::from("key2")),
        (fixture.scope.clone(), Key::from("ke")),
        (
            StateScope::group(group.clone(), "collection2"),
            fixture.key.clone(),
        ),
        (
            StateScope::group(group.clone(), "collectio"),
            fixture.key.clone(),
        ),
        (
            StateScope::group(fresh_group(), "collection"),
            fixture.key.clone(),
        ),
        (
            StateScope::subsystem(group.as_str(), "collection"),
            fixture.key.clone(),
        ),
    ];
    for (scope, key) in &others {
        let snapshot = Source::Store(&*fixture.store, scope)
            .snapshot(key, &probe_entries(&["e"]))
            .await
            .expect("snapshot");
        assert_eq!(
            snapshot,
            Snapshot {
                map_points: vec![None, None],
                deque_points: vec![None, None, None],
                ..Snapshot::default()
            },
            "{scope:?} {key:?}"
        );
    }
    let fresh = Fixture::open(factory).await;
    fresh.apply(vec![put(json!("only a value"))]).await;
    assert!(fresh.map().await.is_empty());
    assert_eq!(fresh.bounds().await, None);
    fresh
        .apply(vec![StateOp::ClearMap, StateOp::ClearDeque])
        .await;
    assert_eq!(fresh.value().await, Some(json!("only a value")));
}

/// Values of [`Options::large_value_bytes`] (1 MiB by default) round-trip as a value, a map
/// entry and a deque item, all in one batch.
pub async fn large_values_round_trip<F>(factory: &F, options: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    let fixture = Fixture::open(factory).await;
    let large = large_value(options.large_value_bytes);
    fixture
        .apply(vec![
            put(large.clone()),
            entry("big", large.clone()),
            entry("small", json!(1)),
            bounds(0, 1),
            item(0, large.clone()),
        ])
        .await;
    assert_eq!(fixture.value().await.as_ref(), Some(&large));
    assert_eq!(
        fixture.map().await,
        entries(&[("big", large.clone()), ("small", json!(1))])
    );
    assert_eq!(fixture.deque().await, vec![(0, large)]);
}

async fn model_based<F>(factory: &F, options: &Options, name: &str, focus: Focus)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    check_property(
        name,
        options.cases,
        scenario_strategy(focus),
        |scenario| async move {
            let clock = ManualClock::new();
            let store: Arc<dyn StateStore> = Arc::new(factory.create(clock.clone()).await);
            let group = fresh_group();
            let scopes = COLLECTIONS.map(|collection| StateScope::group(group.clone(), collection));
            let scopes_ref = &scopes;
            let store_ref = &*store;
            play(store_ref, &clock, scopes_ref, &scenario, |cell| {
                Source::Store(store_ref, &scopes_ref[cell / 2])
            })
            .await
        },
    )
    .await;
}

/// Random batches of value puts/deletes (with TTLs and clock advances) over four cells agree
/// with the reference model after every step.
pub async fn model_based_values_match_the_model<F>(factory: &F, options: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    model_based(
        factory,
        options,
        "state_store::model_based_values_match_the_model",
        Focus::Values,
    )
    .await;
}

/// Random batches of map puts/deletes/clears under a random keyset limit agree with the model:
/// point reads, forward and backward paged scans, and limit rejections.
pub async fn model_based_maps_match_the_model<F>(factory: &F, options: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    model_based(
        factory,
        options,
        "state_store::model_based_maps_match_the_model",
        Focus::Maps,
    )
    .await;
}

/// Random batches of push/unshift/pop/shift/clear (staged as the runtime does) under a random
/// capacity, with invalid writes mixed in, agree with the model: bounds, items, scans.
pub async fn model_based_deques_match_the_model<F>(factory: &F, options: &Options)
where
    F: StoreFactory<Store: StateStore + 'static>,
{
    model_based(
        factory,
        options,
        "state_store::model_based_deques_match_the_model",
        Focus::Deques,
    )
    .await;
}
