//! A handler whose failures are scripted by the payload, counting attempts per record.
//!
//! Payload fields: `fail` is `"transient"` (fail the first `times` attempts), `"permanent"`
//! (always, permanently) or `"always"` (always, transiently); `sleepMs` is run time per
//! attempt. Anything else succeeds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody::api::{EventContext, EventHandler, ExciseMessage, HandlerError, Message, Timer};
use serde_json::Value;
use tokio::sync::watch;

/// A successful handling.
#[derive(Clone, Debug)]
pub struct Success {
    /// Record key.
    pub key: String,
    /// Record offset.
    pub offset: i64,
    /// The payload.
    pub payload: Value,
    /// When the handler finished.
    pub at: Instant,
}

/// Attempts and successes of a [`Scripted`] handler.
pub struct Script {
    attempts: Mutex<HashMap<(String, i64), u32>>,
    successes: Mutex<Vec<Success>>,
    count: watch::Sender<usize>,
}

impl Script {
    /// A fresh script record.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            attempts: Mutex::new(HashMap::new()),
            successes: Mutex::new(Vec::new()),
            count: watch::channel(0).0,
        })
    }

    /// A handler recording here.
    pub fn handler(self: &Arc<Self>) -> Scripted {
        Scripted(self.clone())
    }

    /// Attempts made on every record of `key`.
    pub fn attempts(&self, key: &str) -> u32 {
        self.attempts
            .lock()
            .iter()
            .filter(|((record_key, _), _)| record_key == key)
            .map(|(_, attempts)| attempts)
            .sum()
    }

    /// Successful handlings so far, in order.
    pub fn successes(&self) -> Vec<Success> {
        self.successes.lock().clone()
    }

    /// Keys handled successfully, in order.
    pub fn handled_keys(&self) -> Vec<String> {
        self.successes()
            .into_iter()
            .map(|success| success.key)
            .collect()
    }

    /// Waits until `count` records were handled successfully (at most `within`).
    pub async fn wait_for(&self, count: usize, within: Duration) {
        let mut updates = self.count.subscribe();
        let reached = tokio::time::timeout(within, updates.wait_for(|done| *done >= count)).await;
        assert!(
            reached.is_ok(),
            "only {} of {count} handled within {within:?}",
            self.successes.lock().len()
        );
    }
}

/// The handler of a [`Script`].
pub struct Scripted(Arc<Script>);

#[async_trait]
impl EventHandler for Scripted {
    type Error = HandlerError;

    async fn on_message(
        &self,
        _: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let script = &self.0;
        let attempt = {
            let mut attempts = script.attempts.lock();
            let attempt = attempts
                .entry((message.key.to_string(), message.offset.0))
                .or_default();
            *attempt += 1;
            *attempt
        };
        if let Some(millis) = message.payload.get("sleepMs").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(millis)).await;
        }
        let times = message
            .payload
            .get("times")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        match message.payload.get("fail").and_then(Value::as_str) {
            Some("transient") if u64::from(attempt) <= times => {
                return Err(HandlerError::transient(format!(
                    "scripted transient failure {attempt}"
                )));
            }
            Some("permanent") => return Err(HandlerError::permanent("scripted permanent failure")),
            Some("always") => return Err(HandlerError::transient("scripted endless failure")),
            _ => {}
        }
        let count = {
            let mut successes = script.successes.lock();
            successes.push(Success {
                key: message.key.to_string(),
                offset: message.offset.0,
                payload: message.payload.value().clone(),
                at: Instant::now(),
            });
            successes.len()
        };
        script.count.send_replace(count);
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        _: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
        Ok(())
    }
}
