//! The JSON deque handle. Positions follow the store's model (`head..tail`, see
//! [`prosody_api::storage::DequeBounds`]); the attempt tracks the bounds after reading them
//! once, and a push beyond the capacity moves the head (drops the oldest).

use std::collections::VecDeque;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use prosody_api::ContextError;
use prosody_api::context::{DequeState, StagedCollection};
use prosody_api::storage::{DequeBounds, ScanDirection};
use serde_json::Value;

use super::attempt::{Cell, Stages};
use super::map::SCAN_CHUNK;
use super::stage::{DequeStage, Stage};
use super::value::reject_null;

/// A deque collection of the current key for one attempt.
#[derive(Debug, Clone)]
pub(crate) struct DequeHandle {
    pub(crate) cell: Cell,
}

fn deque_stage<'a>(cell: &Cell, stages: &'a mut Stages) -> &'a mut DequeStage {
    let stage = cell.stage(stages);
    if !matches!(stage, Stage::Deque(_)) {
        *stage = Stage::Deque(DequeStage::default());
    }
    match stage {
        Stage::Deque(deque) => deque,
        // Replaced just above.
        Stage::Value(_) | Stage::Map(_) => unreachable!("a deque stage"),
    }
}

#[derive(Clone, Copy)]
enum End {
    Front,
    Back,
}

impl DequeHandle {
    /// The deque's stage with its bounds read from the store if this attempt has not yet.
    async fn loaded<'a>(&self, stages: &'a mut Stages) -> Result<&'a mut DequeStage, ContextError> {
        if !deque_stage(&self.cell, stages).loaded {
            let bounds = self
                .cell
                .store()
                .get_deque_bounds(&self.cell.scope, self.cell.key())
                .await?;
            let deque = deque_stage(&self.cell, stages);
            deque.bounds = bounds;
            deque.loaded = true;
        }
        Ok(deque_stage(&self.cell, stages))
    }

    /// The items at `positions` as the attempt sees them.
    async fn items(
        &self,
        deque: &DequeStage,
        positions: &[i64],
    ) -> Result<Vec<Option<Value>>, ContextError> {
        let answers: Vec<Option<Option<Value>>> = positions
            .iter()
            .map(|&position| deque.lookup(position))
            .collect();
        let missing: Vec<i64> = positions
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(&position, _)| position)
            .collect();
        let mut stored = if missing.is_empty() {
            Vec::new()
        } else {
            self.cell
                .store()
                .get_deque_items(&self.cell.scope, self.cell.key(), &missing)
                .await?
        }
        .into_iter();
        Ok(answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| stored.next().flatten()))
            .collect())
    }

    async fn insert(&self, item: Value, end: End) -> Result<(), ContextError> {
        reject_null(&item)?;
        let mut stages = self.cell.lock().await?;
        let capacity = self.cell.collection.capacity;
        let deque = self.loaded(&mut stages).await?;
        let mut bounds = deque.bounds.unwrap_or(DequeBounds::new(0, 0));
        let position = match end {
            End::Back => {
                bounds.tail += 1;
                bounds.tail - 1
            }
            End::Front => {
                bounds.head -= 1;
                bounds.head
            }
        };
        // Capacity is enforced on push only, as the spec says: the oldest items make room.
        if let (End::Back, Some(capacity)) = (end, capacity)
            && bounds.len() > u64::from(capacity.get())
        {
            bounds.head = bounds.tail - i64::from(capacity.get());
        }
        deque.items.insert(position, item);
        deque.bounds = Some(bounds);
        deque.dirty = true;
        deque.trim();
        self.cell.written(&mut stages).await
    }

    async fn remove(&self, end: End) -> Result<Option<Value>, ContextError> {
        let mut stages = self.cell.lock().await?;
        let deque = self.loaded(&mut stages).await?;
        let Some(mut bounds) = deque.bounds.filter(|bounds| !bounds.is_empty()) else {
            return Ok(None);
        };
        let position = match end {
            End::Back => bounds.tail - 1,
            End::Front => bounds.head,
        };
        let item = self.items(deque, &[position]).await?.pop().flatten();
        match end {
            End::Back => bounds.tail -= 1,
            End::Front => bounds.head += 1,
        }
        deque.bounds = Some(bounds);
        deque.dirty = true;
        deque.trim();
        self.cell.written(&mut stages).await?;
        Ok(item)
    }

    /// The next chunk of positions after `after` in `direction`, and the items there.
    async fn chunk(
        &self,
        direction: ScanDirection,
        after: Option<i64>,
    ) -> Result<(Vec<Value>, Option<i64>), ContextError> {
        let mut stages = self.cell.lock().await?;
        let deque = self.loaded(&mut stages).await?;
        let Some(bounds) = deque.bounds.filter(|bounds| !bounds.is_empty()) else {
            return Ok((Vec::new(), None));
        };
        let limit = i64::from(SCAN_CHUNK.get());
        let positions: Vec<i64> = match direction {
            ScanDirection::Forward => {
                let start = after.map_or(bounds.head, |after| (after + 1).max(bounds.head));
                (start..bounds.tail.min(start.saturating_add(limit))).collect()
            }
            ScanDirection::Backward => {
                let start = after.map_or(bounds.tail - 1, |after| (after - 1).min(bounds.tail - 1));
                (bounds.head.max(start.saturating_sub(limit - 1))..=start)
                    .rev()
                    .collect()
            }
        };
        let Some(&last) = positions.last() else {
            return Ok((Vec::new(), None));
        };
        let items = self.items(deque, &positions).await?;
        Ok((items.into_iter().flatten().collect(), Some(last)))
    }
}

struct Scan {
    after: Option<i64>,
    buffer: VecDeque<Value>,
    done: bool,
}

#[async_trait]
impl StagedCollection for DequeHandle {
    async fn commit(&self) -> Result<(), ContextError> {
        self.cell.commit().await
    }

    async fn rollback(&self) -> Result<(), ContextError> {
        self.cell.rollback().await
    }
}

#[async_trait]
impl DequeState<Value> for DequeHandle {
    async fn push(&self, item: Value) -> Result<(), ContextError> {
        self.insert(item, End::Back).await
    }

    async fn unshift(&self, item: Value) -> Result<(), ContextError> {
        self.insert(item, End::Front).await
    }

    async fn pop(&self) -> Result<Option<Value>, ContextError> {
        self.remove(End::Back).await
    }

    async fn shift(&self) -> Result<Option<Value>, ContextError> {
        self.remove(End::Front).await
    }

    async fn at(&self, index: i64) -> Result<Option<Value>, ContextError> {
        let mut stages = self.cell.lock().await?;
        let deque = self.loaded(&mut stages).await?;
        let Some(bounds) = deque.bounds else {
            return Ok(None);
        };
        let base = if index < 0 { bounds.tail } else { bounds.head };
        let Some(position) = base.checked_add(index).filter(|&p| bounds.contains(p)) else {
            return Ok(None);
        };
        Ok(self.items(deque, &[position]).await?.pop().flatten())
    }

    async fn length(&self) -> Result<u64, ContextError> {
        let mut stages = self.cell.lock().await?;
        let deque = self.loaded(&mut stages).await?;
        Ok(deque.bounds.map_or(0, DequeBounds::len))
    }

    async fn clear(&self) -> Result<(), ContextError> {
        let mut stages = self.cell.lock().await?;
        let deque = deque_stage(&self.cell, &mut stages);
        *deque = DequeStage {
            loaded: true,
            bounds: None,
            cleared: true,
            items: std::collections::BTreeMap::new(),
            dirty: true,
        };
        self.cell.written(&mut stages).await
    }

    fn values(&self, direction: ScanDirection) -> BoxStream<'_, Result<Value, ContextError>> {
        let scan = Scan {
            after: None,
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
                match self.chunk(direction, scan.after).await {
                    Ok((items, next)) => {
                        scan.buffer.extend(items);
                        scan.done = next.is_none();
                        scan.after = next;
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
