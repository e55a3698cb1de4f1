//! [`PublishedStateView`] conformance cases.
//!
//! The factory returns a writer ([`StateStore`]) and a reader ([`PublishedStateView`]) over the
//! same data; the owner writes under [`StateScope::subsystem`] and readers address the data by
//! [`PublishedScope`].

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::model::{Source, probe_entries};
use super::scenario::{COLLECTIONS, Focus, play, scenario_strategy};
use super::support::{check_property, fresh_subsystem, large_value};
use super::{Options, StoreFactory};
use crate::clock::ManualClock;
use crate::key::{Key, Subsystem};
use crate::storage::{
    DequeBounds, PublishedScope, PublishedStateView, ScanDirection, StateOp, StateScope,
    StateStore, StateWrite, Ttl,
};

struct Fixture {
    store: Arc<dyn StateStore>,
    view: Arc<dyn PublishedStateView>,
    clock: ManualClock,
    subsystem: Subsystem,
    published: PublishedScope,
    key: Key,
}

impl Fixture {
    async fn open<F, S, V>(factory: &F) -> Self
    where
        F: StoreFactory<Store = (S, V)>,
        S: StateStore + 'static,
        V: PublishedStateView + 'static,
    {
        let clock = ManualClock::new();
        let (store, view) = factory.create(clock.clone()).await;
        let subsystem = fresh_subsystem();
        Self {
            store: Arc::new(store),
            view: Arc::new(view),
            clock,
            published: PublishedScope::new(subsystem.clone(), "published"),
            subsystem,
            key: Key::from("key"),
        }
    }

    async fn write(&self, scope: &StateScope, ops: Vec<StateOp>) {
        let writes: Vec<StateWrite> = ops
            .into_iter()
            .map(|op| StateWrite::new(scope.clone(), self.key.clone(), op))
            .collect();
        self.store.apply(&writes).await.expect("apply");
    }

    async fn publish(&self, ops: Vec<StateOp>) {
        self.write(&self.published.state_scope(), ops).await;
    }

    fn reader(&self) -> Source<'_> {
        Source::View(&*self.view, &self.published)
    }

    async fn map(&self, direction: ScanDirection, max: u32) -> Vec<(String, Value)> {
        self.reader()
            .map_scan(
                &self.key,
                direction,
                NonZeroU32::new(max).expect("positive"),
            )
            .await
            .expect("published_map_scan")
    }

    async fn deque(&self, direction: ScanDirection, max: u32) -> Vec<(i64, Value)> {
        self.reader()
            .deque_scan(
                &self.key,
                direction,
                NonZeroU32::new(max).expect("positive"),
            )
            .await
            .expect("published_deque_scan")
    }
}

fn everything(value: &Value) -> Vec<StateOp> {
    vec![
        StateOp::PutValue {
            value: value.clone(),
            ttl: None,
        },
        StateOp::PutMapEntry {
            entry: "e".into(),
            value: value.clone(),
            ttl: None,
            keyset_limit: None,
        },
        StateOp::SetDequeBounds {
            bounds: DequeBounds::new(0, 1),
            ttl: None,
            capacity: None,
        },
        StateOp::PutDequeItem {
            position: 0,
            item: value.clone(),
            ttl: None,
        },
    ]
}

/// Values, map entries and deque items written under the subsystem namespace are readable
/// through every view method.
pub async fn reads_what_the_subsystem_namespace_holds<F, S, V>(factory: &F, _: &Options)
where
    F: StoreFactory<Store = (S, V)>,
    S: StateStore + 'static,
    V: PublishedStateView + 'static,
{
    let fixture = Fixture::open(factory).await;
    let reader = fixture.reader();
    assert_eq!(reader.value(&fixture.key).await.expect("value"), None);
    fixture.publish(everything(&json!("x"))).await;
    assert_eq!(
        reader.value(&fixture.key).await.expect("value"),
        Some(json!("x"))
    );
    assert_eq!(
        reader
            .map_entries(&fixture.key, &["e".into(), "f".into()])
            .await
            .expect("entries"),
        vec![Some(json!("x")), None]
    );
    assert_eq!(
        fixture.map(ScanDirection::Forward, 1).await,
        vec![("e".to_owned(), json!("x"))]
    );
    assert_eq!(
        reader.bounds(&fixture.key).await.expect("bounds"),
        Some(DequeBounds::new(0, 1))
    );
    assert_eq!(
        reader
            .deque_items(&fixture.key, &[0, 1])
            .await
            .expect("items"),
        vec![Some(json!("x")), None]
    );
    assert_eq!(
        fixture.deque(ScanDirection::Backward, 1).await,
        vec![(0, json!("x"))]
    );
}

/// State a consumer group owns is not published, even when the group's name equals the
/// subsystem's and the collection names match.
pub async fn does_not_see_group_owned_state<F, S, V>(factory: &F, _: &Options)
where
    F: StoreFactory<Store = (S, V)>,
    S: StateStore + 'static,
    V: PublishedStateView + 'static,
{
    let fixture = Fixture::open(factory).await;
    let owned = StateScope::group(
        fixture.subsystem.as_str(),
        fixture.published.collection.clone(),
    );
    fixture.write(&owned, everything(&json!("private"))).await;
    let snapshot = fixture
        .reader()
        .snapshot(&fixture.key, &probe_entries(&["e"]))
        .await
        .expect("snapshot");
    assert_eq!(snapshot.value, None);
    assert_eq!(snapshot.map_points, vec![None, None]);
    assert!(snapshot.map_forward.is_empty());
    assert_eq!(snapshot.bounds, None);
    assert!(snapshot.deque_forward.is_empty());
}

/// Two subsystems publishing the same collection name do not see each other's data.
pub async fn subsystems_are_isolated<F, S, V>(factory: &F, _: &Options)
where
    F: StoreFactory<Store = (S, V)>,
    S: StateStore + 'static,
    V: PublishedStateView + 'static,
{
    let fixture = Fixture::open(factory).await;
    fixture.publish(everything(&json!("mine"))).await;
    let other = PublishedScope::new(fresh_subsystem(), fixture.published.collection.clone());
    let reader = Source::View(&*fixture.view, &other);
    assert_eq!(reader.value(&fixture.key).await.expect("value"), None);
    assert_eq!(reader.bounds(&fixture.key).await.expect("bounds"), None);
    let other_collection = PublishedScope::new(fixture.subsystem.clone(), "other");
    let reader = Source::View(&*fixture.view, &other_collection);
    assert_eq!(reader.value(&fixture.key).await.expect("value"), None);
}

/// Published map and deque scans page in both directions like the owner's.
pub async fn scans_page_in_both_directions<F, S, V>(factory: &F, _: &Options)
where
    F: StoreFactory<Store = (S, V)>,
    S: StateStore + 'static,
    V: PublishedStateView + 'static,
{
    let fixture = Fixture::open(factory).await;
    let names = ["a", "b", "c", "d", "e"];
    let mut ops: Vec<StateOp> = names
        .iter()
        .map(|name| StateOp::PutMapEntry {
            entry: (*name).to_owned(),
            value: json!(name),
            ttl: None,
            keyset_limit: None,
        })
        .collect();
    ops.push(StateOp::SetDequeBounds {
        bounds: DequeBounds::new(-2, 3),
        ttl: None,
        capacity: None,
    });
    ops.extend((-2..3).map(|position| StateOp::PutDequeItem {
        position,
        item: json!(position),
        ttl: None,
    }));
    fixture.publish(ops).await;
    for max in 1..=6 {
        let forward: Vec<String> = fixture
            .map(ScanDirection::Forward, max)
            .await
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(forward, names);
        let backward: Vec<i64> = fixture
            .deque(ScanDirection::Backward, max)
            .await
            .into_iter()
            .map(|(position, _)| position)
            .collect();
        assert_eq!(backward, [2, 1, 0, -1, -2]);
    }
}

/// Expired published data is hidden from readers exactly as from the owner.
pub async fn expired_entries_are_hidden<F, S, V>(factory: &F, _: &Options)
where
    F: StoreFactory<Store = (S, V)>,
    S: StateStore + 'static,
    V: PublishedStateView + 'static,
{
    let fixture = Fixture::open(factory).await;
    let ttl = Ttl::from_secs(10);
    fixture
        .publish(vec![
            StateOp::PutValue {
                value: json!(1),
                ttl,
            },
            StateOp::PutMapEntry {
                entry: "e".into(),
                value: json!(1),
                ttl,
                keyset_limit: None,
            },
            StateOp::SetDequeBounds {
                bounds: DequeBounds::new(0, 1),
                ttl,
                capacity: None,
            },
            StateOp::PutDequeItem {
                position: 0,
                item: json!(1),
                ttl,
            },
        ])
        .await;
    fixture.clock.advance(Duration::from_secs(9));
    assert_eq!(
        fixture.reader().value(&fixture.key).await.expect("value"),
        Some(json!(1))
    );
    fixture.clock.advance(Duration::from_secs(1));
    let snapshot = fixture
        .reader()
        .snapshot(&fixture.key, &probe_entries(&["e"]))
        .await
        .expect("snapshot");
    assert_eq!(snapshot.value, None);
    assert!(snapshot.map_forward.is_empty());
    assert_eq!(snapshot.map_points, vec![None, None]);
    assert_eq!(snapshot.bounds, None);
    assert!(snapshot.deque_forward.is_empty());
}

/// Large published values reach readers intact.
pub async fn large_values_round_trip<F, S, V>(factory: &F, options: &Options)
where
    F: StoreFactory<Store = (S, V)>,
    S: StateStore + 'static,
    V: PublishedStateView + 'static,
{
    let fixture = Fixture::open(factory).await;
    let large = large_value(options.large_value_bytes);
    fixture.publish(everything(&large)).await;
    assert_eq!(
        fixture.reader().value(&fixture.key).await.expect("value"),
        Some(large.clone())
    );
    assert_eq!(
        fixture.map(ScanDirection::Forward, 10).await,
        vec![("e".to_owned(), large.clone())]
    );
    assert_eq!(
        fixture.deque(ScanDirection::Forward, 10).await,
        vec![(0, large)]
    );
}

/// Random batches of every kind of write, published by the owner, read back through the view
/// agree with the reference model after every step (values, maps, deques, TTL, limits).
pub async fn model_based_reads_match_the_model<F, S, V>(factory: &F, options: &Options)
where
    F: StoreFactory<Store = (S, V)>,
    S: StateStore + 'static,
    V: PublishedStateView + 'static,
{
    check_property(
        "published_state::model_based_reads_match_the_model",
        options.cases,
        scenario_strategy(Focus::Mixed),
        |scenario| async move {
            let clock = ManualClock::new();
            let (store, view) = factory.create(clock.clone()).await;
            let subsystem = fresh_subsystem();
            let scopes =
                COLLECTIONS.map(|collection| StateScope::subsystem(subsystem.clone(), collection));
            let published =
                COLLECTIONS.map(|collection| PublishedScope::new(subsystem.clone(), collection));
            let published_ref = &published;
            let view_ref: &dyn PublishedStateView = &view;
            play(&store, &clock, &scopes, &scenario, |cell| {
                Source::View(view_ref, &published_ref[cell / 2])
            })
            .await
        },
    )
    .await;
}
