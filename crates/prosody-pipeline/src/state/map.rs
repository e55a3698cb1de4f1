//! The JSON map handle: point reads and writes over the attempt's stage, and scans that merge
//! the store's chunks with the staged entries in key order.

use std::collections::{BTreeMap, VecDeque};
use std::num::NonZeroU32;
use std::ops::Bound;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use prosody_api::ContextError;
use prosody_api::context::{MapState, StagedCollection};
use prosody_api::storage::{ScanDirection, ScanRequest};
use serde_json::Value;

use super::attempt::{Cell, Stages};
use super::stage::{MapStage, Stage};
use super::value::reject_null;

/// Entries read from the store per scan chunk.
pub(crate) const SCAN_CHUNK: NonZeroU32 = NonZeroU32::new(256).unwrap();

/// A map collection of the current key for one attempt.
#[derive(Debug, Clone)]
pub(crate) struct MapHandle {
    pub(crate) cell: Cell,
}

fn map_stage<'a>(cell: &Cell, stages: &'a mut Stages) -> &'a mut MapStage {
    let stage = cell.stage(stages);
    if !matches!(stage, Stage::Map(_)) {
        *stage = Stage::Map(MapStage::default());
    }
    match stage {
        Stage::Map(map) => map,
        // Replaced just above.
        Stage::Value(_) | Stage::Deque(_) => unreachable!("a map stage"),
    }
}

fn staged_map<'a>(cell: &Cell, stages: &'a Stages) -> Option<&'a MapStage> {
    match cell.staged(stages) {
        Some(Stage::Map(map)) => Some(map),
        _ => None,
    }
}

/// One merged chunk and where the next starts (`None`: the scan is done).
type Chunk = (Vec<(String, Value)>, Option<String>);

impl MapHandle {
    async fn lookup(&self, stages: &Stages, entry: &str) -> Result<Option<Value>, ContextError> {
        if let Some(answer) = staged_map(&self.cell, stages).and_then(|map| map.lookup(entry)) {
            return Ok(answer);
        }
        let mut values = self
            .cell
            .store()
            .get_map_entries(&self.cell.scope, self.cell.key(), &[entry.to_owned()])
            .await?;
        Ok(values.pop().flatten())
    }

    async fn write(&self, entry: &str, value: Option<Value>) -> Result<(), ContextError> {
        let mut stages = self.cell.lock().await?;
        map_stage(&self.cell, &mut stages)
            .entries
            .insert(entry.to_owned(), value);
        self.cell.written(&mut stages).await
    }

    /// The store's next chunk after `cursor`, with the staged entries of the same key range
    /// laid over it.
    async fn chunk(
        &self,
        direction: ScanDirection,
        cursor: Option<String>,
    ) -> Result<Chunk, ContextError> {
        let stages = self.cell.lock().await?;
        let overlay = staged_map(&self.cell, &stages);
        let stored = if overlay.is_some_and(|map| map.cleared) {
            Vec::new()
        } else {
            let request = ScanRequest {
                direction,
                after: cursor.clone(),
                limit: SCAN_CHUNK,
            };
            self.cell
                .store()
                .scan_map(&self.cell.scope, self.cell.key(), &request)
                .await?
        };
        // The store's last key bounds this chunk; an empty chunk means the store is done and
        // every staged entry past the cursor belongs to this (last) chunk.
        let boundary = stored.last().map(|(entry, _)| entry.clone());
        let mut merged: BTreeMap<String, Value> = stored.into_iter().collect();
        if let Some(staged) = overlay {
            let after = cursor.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let through = boundary
                .as_deref()
                .map_or(Bound::Unbounded, Bound::Included);
            let range = match direction {
                ScanDirection::Forward => (after, through),
                ScanDirection::Backward => (through, after),
            };
            if valid_range(range) {
                for (entry, value) in staged.entries.range::<str, _>(range) {
                    match value {
                        Some(value) => merged.insert(entry.clone(), value.clone()),
                        None => merged.remove(entry),
                    };
                }
            }
        }
        let items: Vec<(String, Value)> = match direction {
            ScanDirection::Forward => merged.into_iter().collect(),
            ScanDirection::Backward => merged.into_iter().rev().collect(),
        };
        Ok((items, boundary))
    }
}

/// `BTreeMap::range` panics on an inverted range; a store that honours the scan contract
/// never produces one, but a scan must not crash on a store that does not.
fn valid_range((low, high): (Bound<&str>, Bound<&str>)) -> bool {
    match (low, high) {
        (Bound::Included(low), Bound::Included(high)) => low <= high,
        (Bound::Included(low) | Bound::Excluded(low), Bound::Excluded(high))
        | (Bound::Excluded(low), Bound::Included(high)) => low < high,
        _ => true,
    }
}

struct Scan {
    cursor: Option<String>,
    buffer: VecDeque<(String, Value)>,
    done: bool,
}

#[async_trait]
impl StagedCollection for MapHandle {
    async fn commit(&self) -> Result<(), ContextError> {
        self.cell.commit().await
    }

    async fn rollback(&self) -> Result<(), ContextError> {
        self.cell.rollback().await
    }
}

#[async_trait]
impl MapState<Value> for MapHandle {
    async fn get(&self, entry: &str) -> Result<Option<Value>, ContextError> {
        let stages = self.cell.lock().await?;
        self.lookup(&stages, entry).await
    }

    async fn get_many(&self, entries: &[String]) -> Result<Vec<Option<Value>>, ContextError> {
        let stages = self.cell.lock().await?;
        let overlay = staged_map(&self.cell, &stages);
        let answers: Vec<Option<Option<Value>>> = entries
            .iter()
            .map(|entry| overlay.and_then(|map| map.lookup(entry)))
            .collect();
        let missing: Vec<String> = entries
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(entry, _)| entry.clone())
            .collect();
        let mut stored = if missing.is_empty() {
            Vec::new()
        } else {
            self.cell
                .store()
                .get_map_entries(&self.cell.scope, self.cell.key(), &missing)
                .await?
        }
        .into_iter();
        Ok(answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| stored.next().flatten()))
            .collect())
    }

    async fn has(&self, entry: &str) -> Result<bool, ContextError> {
        Ok(self.get(entry).await?.is_some())
    }

    async fn set(&self, entry: &str, value: Value) -> Result<(), ContextError> {
        reject_null(&value)?;
        self.write(entry, Some(value)).await
    }

    async fn delete(&self, entry: &str) -> Result<bool, ContextError> {
        let mut stages = self.cell.lock().await?;
        let present = self.lookup(&stages, entry).await?.is_some();
        map_stage(&self.cell, &mut stages)
            .entries
            .insert(entry.to_owned(), None);
        self.cell.written(&mut stages).await?;
        Ok(present)
    }

    async fn clear(&self) -> Result<(), ContextError> {
        let mut stages = self.cell.lock().await?;
        *self.cell.stage(&mut stages) = Stage::Map(MapStage {
            cleared: true,
            entries: BTreeMap::new(),
        });
        self.cell.written(&mut stages).await
    }

    fn entries(
        &self,
        direction: ScanDirection,
    ) -> BoxStream<'_, Result<(String, Value), ContextError>> {
        let scan = Scan {
            cursor: None,
            buffer: VecDeque::new(),
            done: false,
        };
        stream::unfold(scan, move |mut scan| async move {
            loop {
                if let Some(item) = scan.buffer.pop_front() {
                    return Some((Ok(item), scan));
                }
                if scan.done {
                    return None;
                }
                match self.chunk(direction, scan.cursor.take()).await {
                    Ok((items, next)) => {
                        scan.buffer.extend(items);
                        scan.done = next.is_none();
                        scan.cursor = next;
                    }
                    Err(error) => {
                        scan.done = true;
                        return Some((Err(error), scan));
                    }
                }
            }
        })
        .boxed()
    }
}
