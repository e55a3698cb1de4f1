//! `allowedEvents`: a message is handled only when its payload's `type` starts with one of the
//! prefixes. Messages without a string `type`, excise records and an empty prefix list always
//! pass. Filtered messages are committed, never handled.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tracing::trace;

use super::{Layer, Service, Task, Verdict};
use crate::event::Event;

/// Skips messages whose `type` no prefix allows.
pub struct AllowedEvents {
    prefixes: Arc<[String]>,
    inner: Arc<dyn Service>,
}

/// Builds [`AllowedEvents`]; with no prefixes it adds no layer at all.
pub struct AllowedEventsLayer {
    /// The allowed `type` prefixes.
    pub prefixes: Vec<String>,
}

impl Layer for AllowedEventsLayer {
    fn wrap(self: Box<Self>, inner: Arc<dyn Service>) -> Arc<dyn Service> {
        if self.prefixes.is_empty() {
            return inner;
        }
        Arc::new(AllowedEvents {
            prefixes: self.prefixes.into(),
            inner,
        })
    }
}

impl AllowedEvents {
    fn allows(&self, event: &Event) -> bool {
        let Event::Message(message) = event else {
            return true;
        };
        match message.payload.get("type").and_then(Value::as_str) {
            Some(kind) => self
                .prefixes
                .iter()
                .any(|prefix| kind.starts_with(prefix.as_str())),
            None => true,
        }
    }
}

#[async_trait]
impl Service for AllowedEvents {
    async fn call(&self, task: &Task) -> Verdict {
        if !self.allows(&task.event) {
            trace!(key = %task.event.key(), offset = ?task.event.offset(),
                "skipped: event type not allowed");
            return Ok(Value::Null);
        }
        self.inner.call(task).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::stack::testing::{Calls, excise, message, task};
    use serde_json::json;

    #[tokio::test]
    async fn prefixes_match_type_from_its_start_and_untyped_pass() {
        let calls = Calls::succeeding();
        let filter = Box::new(AllowedEventsLayer {
            prefixes: vec!["order.".to_owned(), "invoice".to_owned()],
        })
        .wrap(calls.clone());
        let cases = [
            (json!({"type": "order.created"}), true),
            (json!({"type": "invoices.sent"}), true),
            (json!({"type": "my.order.created"}), false),
            (json!({"type": "order"}), false),
            (json!({"type": 7}), true),
            (json!({"id": "x"}), true),
            (json!([1, 2]), true),
        ];
        for (payload, handled) in cases {
            let before = calls.count();
            let verdict = filter.call(&task(message("k", payload.clone()))).await;
            assert_eq!(verdict, Ok(Value::Null));
            assert_eq!(calls.count() - before, usize::from(handled), "{payload}");
        }
        filter
            .call(&task(excise("k")))
            .await
            .expect("excise passes");
        assert_eq!(calls.count(), 6);
    }

    #[tokio::test]
    async fn no_prefixes_adds_no_layer() {
        let calls = Calls::succeeding();
        let inner: Arc<dyn Service> = calls.clone();
        let wrapped = Box::new(AllowedEventsLayer { prefixes: vec![] }).wrap(inner.clone());
        assert!(Arc::ptr_eq(&wrapped, &inner));
    }
}
