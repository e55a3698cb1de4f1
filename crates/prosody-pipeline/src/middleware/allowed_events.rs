//! `allowedEvents`: a message is handled only when its payload's `type` starts with one of the
//! prefixes. Messages without a string `type`, excise records and an empty prefix list always
//! pass. Filtered messages are committed, never handled.

use std::sync::Arc;

use serde_json::Value;
use tracing::trace;

use super::{Layer, Service, Task, Verdict};
use crate::event::Event;

/// Skips messages whose `type` no prefix allows.
pub struct AllowedEvents<S> {
    prefixes: Arc<[String]>,
    inner: S,
}

/// Builds [`AllowedEvents`]; with no prefixes it allows everything.
pub struct AllowedEventsLayer {
    /// The allowed `type` prefixes.
    pub prefixes: Vec<String>,
}

impl Layer for AllowedEventsLayer {
    type Wrapped<S: Service> = AllowedEvents<S>;

    fn wrap<S: Service>(self, inner: S) -> AllowedEvents<S> {
        AllowedEvents {
            prefixes: self.prefixes.into(),
            inner,
        }
    }
}

impl<S: Service> AllowedEvents<S> {
    fn allows(&self, event: &Event) -> bool {
        let Event::Message(message) = event else {
            return true;
        };
        if self.prefixes.is_empty() {
            return true;
        }
        match message.payload.event_type() {
            Some(kind) => self
                .prefixes
                .iter()
                .any(|prefix| kind.starts_with(prefix.as_str())),
            None => true,
        }
    }
}

impl<S: Service> Service for AllowedEvents<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        if !self.allows(task.event) {
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
    async fn no_prefixes_allow_everything() {
        let calls = Calls::succeeding();
        let wrapped = Box::new(AllowedEventsLayer { prefixes: vec![] }).wrap(calls.clone());
        let typed = json!({ "type": "anything" });
        for payload in [typed, json!({})] {
            assert_eq!(
                wrapped.call(&task(message("k", payload))).await,
                Ok(Value::Null)
            );
        }
        assert_eq!(calls.count(), 2);
    }
}
