//! The JSON value handle.

use async_trait::async_trait;
use prosody_api::ContextError;
use prosody_api::context::{StagedCollection, ValueState};
use serde_json::Value;

use super::attempt::Cell;
use super::stage::Stage;

/// A value collection of the current key for one attempt.
#[derive(Debug, Clone)]
pub(crate) struct ValueHandle {
    pub(crate) cell: Cell,
}

/// Null means absence: it cannot be stored (use `clear()`/`delete()`).
pub(crate) fn reject_null(value: &Value) -> Result<(), ContextError> {
    if value.is_null() {
        Err(ContextError::InvalidRequest(
            "null cannot be stored (it means absence): use clear() or delete()".to_owned(),
        ))
    } else {
        Ok(())
    }
}

impl ValueHandle {
    async fn write(&self, value: Option<Value>) -> Result<(), ContextError> {
        let mut stages = self.cell.lock().await?;
        *self.cell.stage(&mut stages) = Stage::Value(Some(value));
        self.cell.written(&mut stages).await
    }
}

#[async_trait]
impl StagedCollection for ValueHandle {
    async fn commit(&self) -> Result<(), ContextError> {
        self.cell.commit().await
    }

    async fn rollback(&self) -> Result<(), ContextError> {
        self.cell.rollback().await
    }
}

#[async_trait]
impl ValueState<Value> for ValueHandle {
    async fn get(&self) -> Result<Option<Value>, ContextError> {
        let stages = self.cell.lock().await?;
        if let Some(Stage::Value(Some(staged))) = self.cell.staged(&stages) {
            return Ok(staged.clone());
        }
        Ok(self
            .cell
            .store()
            .get_value(&self.cell.scope, self.cell.key())
            .await?)
    }

    async fn set(&self, value: Value) -> Result<(), ContextError> {
        reject_null(&value)?;
        self.write(Some(value)).await
    }

    async fn clear(&self) -> Result<(), ContextError> {
        self.write(None).await
    }
}
