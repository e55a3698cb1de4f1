//! Atomic apply: how a planned batch reaches Cassandra all or nothing.
//!
//! 1. **Plan** ([`super::plan`]): group the writes by cell, read what the ops depend on (the
//!    deque bounds, the live map entries under a keyset limit), and compute each cell's end
//!    state. A `LimitExceeded` or `InvalidRequest` rejects the batch here, before any write.
//! 2. **Write**, by the shape of the batch:
//!    - **one cell**: one unlogged batch on one partition. Cassandra applies a single-partition
//!      batch as one mutation: atomic and isolated, and exempt from `batch_size_fail_threshold`
//!      (which only counts multi-partition batches), so megabyte values are fine.
//!    - **several cells, small**: one logged batch. The batch log makes it all-or-nothing
//!      across partitions; each partition's part is still applied in isolation, which is
//!      exactly the trait's contract (per cell all-or-nothing, cells may become visible one
//!      after the other).
//!    - **several cells, larger than [`crate::CassandraConfig::logged_batch_limit_bytes`]**: a
//!      staged commit, because a logged batch that size would be refused (`batch_size_fail_
//!      threshold`, 50 KiB by default) and raising that threshold cluster-wide is not this
//!      library's call. Each cell's effects are written as a provisional *intent* part, then
//!      one small commit marker row is written — that single write is the commit point — and
//!      then every cell is written as its own single-partition batch, all stamped with one
//!      write timestamp chosen before the intent. Finally the intent is deleted.
//!
//! # Recovery of staged commits
//!
//! A writer that dies between the commit marker and the last cell leaves a committed intent:
//! [`crate::CassandraStore::recover_staged_batches`] (the spec's `stateRecoveryDelaySeconds`
//! sweep) replays every committed intent older than the delay and drops every uncommitted one
//! (its batch failed and was reported as such). Replays reuse the intent's write timestamp, so
//! a replay can never overwrite data written after it: Cassandra keeps the newest timestamp.
//! Until the sweep runs, readers may see some cells of such a batch and not others — the same
//! window Cassandra's own batch log has.

use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::try_join_all;
use prosody_api::storage::{StateOp, StateWrite};
use prosody_api::{Clock, StorageError};
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;

use super::plan::{APPLY, Effect, Stored, needs, plan};
use super::{CellKey, KIND_ENTRY, KIND_ITEM, PK, TABLE};
use crate::CassandraStore;
use crate::errors::corrupt;
use crate::session::Db;
use crate::ttl::millis;

const INTENTS: &str = "state_intents";
/// Intents spread over this many partitions, which recovery reads one by one.
const BUCKETS: i32 = 16;
/// The part number of the commit marker.
const COMMIT_MARKER: i32 = -1;

/// The statements that write the `keyed_state` table and the intents.
#[derive(Debug)]
pub(crate) struct Statements {
    put_value: PreparedStatement,
    delete_value: PreparedStatement,
    put_entry: PreparedStatement,
    delete_entry: PreparedStatement,
    delete_entries_all: PreparedStatement,
    delete_entries_after: PreparedStatement,
    delete_entries_before: PreparedStatement,
    delete_entries_between: PreparedStatement,
    set_bounds: PreparedStatement,
    delete_bounds: PreparedStatement,
    put_item: PreparedStatement,
    delete_items: PreparedStatement,
    intent_part: PreparedStatement,
    intent_delete: PreparedStatement,
    intents: PreparedStatement,
}

impl Statements {
    pub(crate) async fn prepare(db: &Db) -> Result<Self, StorageError> {
        const OP: &str = "state.prepare";
        let cql = |text: String| async move { db.prepare(OP, TABLE, &text).await };
        let delete = "DELETE FROM {ks}.keyed_state WHERE";
        let (put_value, delete_value, put_entry, delete_entry, delete_entries_all) = futures::try_join!(
            cql(format!(
                "UPDATE {{ks}}.keyed_state USING TTL ? SET val = ?, val_expires_at = ? \
                     WHERE {PK}"
            )),
            cql(format!(
                "DELETE val, val_expires_at FROM {{ks}}.keyed_state WHERE {PK}"
            )),
            cql(format!(
                "INSERT INTO {{ks}}.keyed_state (owner, collection, kafka_key, kind, entry, \
                     position, item, expires_at) VALUES (?, ?, ?, {KIND_ENTRY}, ?, 0, ?, ?) \
                     USING TTL ?"
            )),
            cql(format!(
                "{delete} {PK} AND kind = {KIND_ENTRY} AND entry = ? AND position = 0"
            )),
            cql(format!("{delete} {PK} AND kind = {KIND_ENTRY}")),
        )?;
        let (delete_entries_after, delete_entries_before, delete_entries_between, set_bounds) = futures::try_join!(
            cql(format!(
                "{delete} {PK} AND kind = {KIND_ENTRY} AND entry > ?"
            )),
            cql(format!(
                "{delete} {PK} AND kind = {KIND_ENTRY} AND entry < ?"
            )),
            cql(format!(
                "{delete} {PK} AND kind = {KIND_ENTRY} AND entry > ? AND entry < ?"
            )),
            cql(format!(
                "UPDATE {{ks}}.keyed_state USING TTL ? SET deque_head = ?, deque_tail = ?, \
                     deque_expires_at = ? WHERE {PK}"
            )),
        )?;
        let (delete_bounds, put_item, delete_items) = futures::try_join!(
            cql(format!(
                "DELETE deque_head, deque_tail, deque_expires_at FROM {{ks}}.keyed_state \
                 WHERE {PK}"
            )),
            cql(format!(
                "INSERT INTO {{ks}}.keyed_state (owner, collection, kafka_key, kind, entry, \
                 position, item, expires_at) VALUES (?, ?, ?, {KIND_ITEM}, '', ?, ?, ?) \
                 USING TTL ?"
            )),
            cql(format!(
                "{delete} {PK} AND kind = {KIND_ITEM} AND entry = '' AND position >= ? \
                 AND position <= ?"
            )),
        )?;
        let (intent_part, intent_delete, intents) = futures::try_join!(
            db.prepare(
                OP,
                INTENTS,
                "INSERT INTO {ks}.state_intents (bucket, intent, part, written_at, write_ts, \
                 effects) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
            ),
            db.prepare(
                OP,
                INTENTS,
                "DELETE FROM {ks}.state_intents WHERE bucket = ? AND intent = ?",
            ),
            db.prepare(
                OP,
                INTENTS,
                "SELECT intent, part, written_at, write_ts, effects FROM {ks}.state_intents \
                 WHERE bucket = ?",
            ),
        )?;
        Ok(Self {
            put_value,
            delete_value,
            put_entry,
            delete_entry,
            delete_entries_all,
            delete_entries_after,
            delete_entries_before,
            delete_entries_between,
            set_bounds,
            delete_bounds,
            put_item,
            delete_items,
            intent_part,
            intent_delete,
            intents,
        })
    }

    /// The statement and values of one effect on `cell`.
    fn bind(&self, cell: &CellKey, effect: &Effect) -> (&PreparedStatement, Vec<Option<CqlValue>>) {
        let text = |text: &str| Some(CqlValue::Text(text.to_owned()));
        let big = |number: i64| Some(CqlValue::BigInt(number));
        let pk = cell.values();
        let with_pk = |mut front: Vec<Option<CqlValue>>, back: Vec<Option<CqlValue>>| {
            front.extend(pk.iter().cloned());
            front.extend(back);
            front
        };
        match effect {
            Effect::PutValue {
                json,
                expires_at,
                ttl,
            } => (
                &self.put_value,
                with_pk(
                    vec![
                        Some(CqlValue::Int(*ttl)),
                        text(json),
                        expires_at.and_then(big),
                    ],
                    vec![],
                ),
            ),
            Effect::DeleteValue => (&self.delete_value, pk),
            Effect::PutEntry {
                entry,
                json,
                expires_at,
                ttl,
            } => (
                &self.put_entry,
                with_pk(
                    vec![],
                    vec![
                        text(entry),
                        text(json),
                        expires_at.and_then(big),
                        Some(CqlValue::Int(*ttl)),
                    ],
                ),
            ),
            Effect::DeleteEntry { entry } => {
                (&self.delete_entry, with_pk(vec![], vec![text(entry)]))
            }
            Effect::DeleteEntries { after, before } => match (after, before) {
                (None, None) => (&self.delete_entries_all, pk),
                (Some(after), None) => (
                    &self.delete_entries_after,
                    with_pk(vec![], vec![text(after)]),
                ),
                (None, Some(before)) => (
                    &self.delete_entries_before,
                    with_pk(vec![], vec![text(before)]),
                ),
                (Some(after), Some(before)) => (
                    &self.delete_entries_between,
                    with_pk(vec![], vec![text(after), text(before)]),
                ),
            },
            Effect::SetBounds {
                head,
                tail,
                expires_at,
                ttl,
            } => (
                &self.set_bounds,
                with_pk(
                    vec![
                        Some(CqlValue::Int(*ttl)),
                        big(*head),
                        big(*tail),
                        expires_at.and_then(big),
                    ],
                    vec![],
                ),
            ),
            Effect::DeleteBounds => (&self.delete_bounds, pk),
            Effect::PutItem {
                position,
                json,
                expires_at,
                ttl,
            } => (
                &self.put_item,
                with_pk(
                    vec![],
                    vec![
                        big(*position),
                        text(json),
                        expires_at.and_then(big),
                        Some(CqlValue::Int(*ttl)),
                    ],
                ),
            ),
            Effect::DeleteItems { from, to } => (
                &self.delete_items,
                with_pk(vec![], vec![big(*from), big(*to)]),
            ),
        }
    }
}

/// A cell's planned effects, as stored in an intent part.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct CellEffects {
    cell: CellKey,
    effects: Vec<Effect>,
}

/// What a recovery sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Committed staged batches that were completed.
    pub replayed: usize,
    /// Uncommitted staged batches that were dropped.
    pub dropped: usize,
}

/// A staged batch's identity: where its parts live and the write timestamp of all its cells.
struct Intent {
    id: String,
    bucket: i32,
    timestamp: i64,
    written_at: i64,
}

impl Intent {
    fn new(timestamp: i64, written_at: i64) -> Self {
        let id = intent_id();
        Self {
            bucket: bucket_of(&id),
            id,
            timestamp,
            written_at,
        }
    }
}

fn intent_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "{}-{nanos}-{}",
        process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn bucket_of(intent: &str) -> i32 {
    let hash = intent.bytes().fold(0_u32, |hash, byte| {
        hash.wrapping_mul(31).wrapping_add(u32::from(byte))
    });
    i32::try_from(hash % BUCKETS.unsigned_abs()).unwrap_or(0)
}

impl CassandraStore {
    /// Plans and writes a batch (see the module docs).
    pub(crate) async fn apply_writes(&self, writes: &[StateWrite]) -> Result<(), StorageError> {
        let mut cells: Vec<(CellKey, Vec<&StateOp>, Vec<usize>)> = Vec::new();
        for (index, write) in writes.iter().enumerate() {
            let cell = CellKey::new(&write.scope, &write.key);
            match cells.iter_mut().find(|(known, ..)| *known == cell) {
                Some((_, ops, indices)) => {
                    ops.push(&write.op);
                    indices.push(index);
                }
                None => cells.push((cell, vec![&write.op], vec![index])),
            }
        }
        let stored =
            try_join_all(cells.iter().map(|(cell, ops, _)| self.stored(cell, ops))).await?;
        let now = self.clock.now();
        let mut planned = Vec::with_capacity(cells.len());
        // A rejected batch reports the error of its earliest failing write, as applying it in
        // order would: cells are planned one after another, so the first cell's error may come
        // from a later write than another cell's.
        let mut rejected: Option<(usize, StorageError)> = None;
        for ((cell, ops, indices), stored) in cells.into_iter().zip(stored) {
            match plan(
                &cell.collection,
                stored.clone(),
                ops.iter().copied(),
                self.shared.ttl,
                now,
            ) {
                Ok(effects) if !effects.is_empty() => planned.push(CellEffects { cell, effects }),
                Ok(_) => {}
                Err(error) => {
                    let (at, error) = (1..=ops.len())
                        .find_map(|prefix| {
                            let ops = ops[..prefix].iter().copied();
                            plan(&cell.collection, stored.clone(), ops, self.shared.ttl, now)
                                .err()
                                .map(|error| (indices[prefix - 1], error))
                        })
                        .unwrap_or((indices[0], error));
                    if rejected.as_ref().is_none_or(|(earliest, _)| at < *earliest) {
                        rejected = Some((at, error));
                    }
                }
            }
        }
        if let Some((_, error)) = rejected {
            return Err(error);
        }
        match planned.as_slice() {
            [] => Ok(()),
            [single] => self.write_cells(BatchType::Unlogged, &[single], None).await,
            _ => {
                let weight: usize = planned
                    .iter()
                    .flat_map(|cell| cell.effects.iter().map(Effect::weight))
                    .sum();
                if weight <= self.shared.db.config.logged_batch_limit_bytes {
                    let all: Vec<&CellEffects> = planned.iter().collect();
                    self.write_cells(BatchType::Logged, &all, None).await
                } else {
                    self.write_staged(&planned).await
                }
            }
        }
    }

    /// What planning `ops` needs to know about `cell`.
    async fn stored(&self, cell: &CellKey, ops: &[&StateOp]) -> Result<Stored, StorageError> {
        let needs = needs(ops.iter().copied());
        let bounds = async {
            if needs.bounds {
                self.read_bounds(APPLY, cell).await
            } else {
                Ok(None)
            }
        };
        let live_entries = async {
            if needs.live_entries {
                self.read_live_entries(APPLY, cell).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let (bounds, live_entries) = futures::try_join!(bounds, live_entries)?;
        Ok(Stored {
            bounds,
            live_entries,
        })
    }

    /// Writes the effects of `cells` as one batch, optionally with a fixed write timestamp.
    async fn write_cells(
        &self,
        kind: BatchType,
        cells: &[&CellEffects],
        timestamp: Option<i64>,
    ) -> Result<(), StorageError> {
        let statements = &self.shared.state.writes;
        let mut batch = Batch::new(kind);
        batch.set_is_idempotent(true);
        batch.set_timestamp(timestamp);
        let mut values = Vec::new();
        for cell in cells {
            for effect in &cell.effects {
                let (statement, bound) = statements.bind(&cell.cell, effect);
                batch.append_statement(statement.clone());
                values.push(bound);
            }
        }
        self.shared.db.batch(APPLY, TABLE, &batch, values).await
    }

    /// The staged commit of a multi-cell batch too large for a logged batch.
    async fn write_staged(&self, cells: &[CellEffects]) -> Result<(), StorageError> {
        let intent = Intent::new(self.shared.db.timestamps.next(), millis(self.clock.now()));
        self.write_intent_parts(&intent, cells).await?;
        // The commit point: from here on the batch is durable and recovery completes it.
        self.write_intent_part(&intent, COMMIT_MARKER, String::new())
            .await?;
        try_join_all(cells.iter().map(|cell| async move {
            self.write_cells(BatchType::Unlogged, &[cell], Some(intent.timestamp))
                .await
        }))
        .await?;
        self.forget_intent(APPLY, intent.bucket, &intent.id).await
    }

    async fn write_intent_parts(
        &self,
        intent: &Intent,
        cells: &[CellEffects],
    ) -> Result<(), StorageError> {
        try_join_all(cells.iter().enumerate().map(|(index, cell)| async move {
            let effects = serde_json::to_string(cell).map_err(|error| {
                StorageError::invalid_request(APPLY, format!("cannot encode an intent: {error}"))
            })?;
            self.write_intent_part(intent, i32::try_from(index).unwrap_or(i32::MAX), effects)
                .await
        }))
        .await
        .map(drop)
    }

    async fn write_intent_part(
        &self,
        intent: &Intent,
        part: i32,
        effects: String,
    ) -> Result<(), StorageError> {
        let values = (
            intent.bucket,
            intent.id.as_str(),
            part,
            intent.written_at,
            intent.timestamp,
            effects,
            self.shared.ttl.retention(),
        );
        self.shared
            .db
            .execute(
                APPLY,
                INTENTS,
                &self.shared.state.writes.intent_part,
                values,
            )
            .await
            .map(drop)
    }

    async fn forget_intent(
        &self,
        operation: &'static str,
        bucket: i32,
        intent: &str,
    ) -> Result<(), StorageError> {
        self.shared
            .db
            .execute(
                operation,
                INTENTS,
                &self.shared.state.writes.intent_delete,
                (bucket, intent),
            )
            .await
            .map(drop)
    }

    /// Completes the committed staged batches older than `older_than` (on the store's clock)
    /// and drops the uncommitted ones (see the crate docs on atomic apply). Run it periodically
    /// with the spec's `stateRecoveryDelaySeconds` (30 s by default). The delay must exceed the
    /// time a writer takes to stage a batch (milliseconds in practice): a sweep that dropped the
    /// parts of a batch still being staged, followed by that writer crashing right after its
    /// commit marker, would leave a marker without its parts.
    ///
    /// # Errors
    /// A transient [`StorageError`] when Cassandra fails; what was done stays done and the next
    /// sweep continues.
    pub async fn recover_staged_batches(
        &self,
        older_than: Duration,
    ) -> Result<RecoveryReport, StorageError> {
        const OP: &str = "state.recover";
        let statements = &self.shared.state.writes;
        let db = &self.shared.db;
        let cutoff = millis(self.clock.now())
            .saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
        let mut report = RecoveryReport::default();
        for bucket in 0..BUCKETS {
            let rows: Vec<(String, i32, i64, i64, Option<String>)> = db
                .all_rows(OP, INTENTS, &statements.intents, (bucket,))
                .await?;
            let mut rows = rows.into_iter().peekable();
            while let Some((intent, part, written_at, timestamp, effects)) = rows.next() {
                // Rows arrive by intent, then part: the marker (-1) first when present.
                let committed = part == COMMIT_MARKER;
                let mut parts = Vec::new();
                if !committed {
                    parts.push(effects);
                }
                while let Some((_, _, _, _, effects)) = rows.next_if(|(next, ..)| *next == intent) {
                    parts.push(effects);
                }
                if written_at > cutoff {
                    continue;
                }
                if committed {
                    for effects in parts.into_iter().flatten() {
                        let cell: CellEffects =
                            serde_json::from_str(&effects).map_err(|error| {
                                corrupt(
                                    OP,
                                    INTENTS,
                                    format!("intent `{intent}` does not decode: {error}"),
                                )
                            })?;
                        self.write_cells(BatchType::Unlogged, &[&cell], Some(timestamp))
                            .await?;
                    }
                    report.replayed += 1;
                } else {
                    report.dropped += 1;
                }
                self.forget_intent(OP, bucket, &intent).await?;
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use prosody_api::storage::{StateScope, StateStore};
    use prosody_api::{Key, ManualClock};
    use serde_json::json;

    use super::*;
    use crate::CassandraConfig;
    use crate::state::plan::plan;

    /// A store on the shared test keyspace; fails loudly without the local Cassandra.
    async fn store(clock: ManualClock) -> CassandraStore {
        let nodes = std::env::var("PROSODY_CASSANDRA_NODES").unwrap_or_default();
        assert!(
            !nodes.is_empty(),
            "PROSODY_CASSANDRA_NODES is not set: run `scripts/services up` and export the \
             variables it prints"
        );
        let config = CassandraConfig::new(nodes.split(','))
            .with_keyspace("prosody_conformance")
            .with_retention(Duration::from_secs(24 * 3600));
        CassandraStore::connect_with_clock(&config, clock)
            .await
            .expect("connect")
    }

    fn planned(
        store: &CassandraStore,
        scope: &StateScope,
        value: &serde_json::Value,
    ) -> CellEffects {
        let op = StateOp::PutValue {
            value: value.clone(),
            ttl: None,
        };
        CellEffects {
            cell: CellKey::new(scope, &Key::from("k")),
            effects: plan(
                scope.collection.as_str(),
                Stored::default(),
                [&op],
                store.shared.ttl,
                store.clock.now(),
            )
            .expect("plan"),
        }
    }

    /// A writer that died after the commit marker: recovery completes its batch; one that
    /// died before it: recovery drops the intent and nothing of it shows.
    #[tokio::test]
    async fn recovery_completes_committed_intents_and_drops_the_rest() {
        let clock = ManualClock::new();
        let store = store(clock.clone()).await;
        let group = format!("recovery-{}", intent_id());
        let (a, b, c) = (
            StateScope::group(group.as_str(), "a"),
            StateScope::group(group.as_str(), "b"),
            StateScope::group(group.as_str(), "c"),
        );
        let key = Key::from("k");

        let committed = Intent::new(store.shared.db.timestamps.next(), millis(clock.now()));
        let cells = [
            planned(&store, &a, &json!("a")),
            planned(&store, &b, &json!("b")),
        ];
        store
            .write_intent_parts(&committed, &cells)
            .await
            .expect("parts");
        store
            .write_intent_part(&committed, COMMIT_MARKER, String::new())
            .await
            .expect("marker");
        let abandoned = Intent::new(store.shared.db.timestamps.next(), millis(clock.now()));
        let cells = [planned(&store, &c, &json!("c"))];
        store
            .write_intent_parts(&abandoned, &cells)
            .await
            .expect("parts");

        assert_eq!(store.get_value(&a, &key).await.expect("read"), None);
        clock.advance(Duration::from_secs(60));
        let report = store
            .recover_staged_batches(Duration::from_secs(30))
            .await
            .expect("recover");
        assert!(report.replayed >= 1 && report.dropped >= 1, "{report:?}");
        assert_eq!(
            store.get_value(&a, &key).await.expect("read"),
            Some(json!("a"))
        );
        assert_eq!(
            store.get_value(&b, &key).await.expect("read"),
            Some(json!("b"))
        );
        assert_eq!(store.get_value(&c, &key).await.expect("read"), None);

        // A replay cannot overwrite what was written after the batch.
        store
            .apply(&[StateWrite::new(
                a.clone(),
                key.clone(),
                StateOp::PutValue {
                    value: json!("newer"),
                    ttl: None,
                },
            )])
            .await
            .expect("apply");
        let cells = [planned(&store, &a, &json!("a"))];
        store
            .write_cells(BatchType::Unlogged, &[&cells[0]], Some(committed.timestamp))
            .await
            .expect("late replay");
        assert_eq!(
            store.get_value(&a, &key).await.expect("read"),
            Some(json!("newer"))
        );
    }

    #[test]
    fn intents_spread_over_every_bucket_range() {
        for index in 0..100 {
            let bucket = bucket_of(&format!("intent-{index}"));
            assert!((0..BUCKETS).contains(&bucket));
        }
        assert_ne!(intent_id(), intent_id());
    }
}
