//! Loop prevention: a record whose `source-system` header equals our group id was produced by
//! this service, so handling it again could feed a loop. It is skipped and committed.

use std::sync::Arc;

use serde_json::Value;
use tracing::trace;

use super::{Layer, Service, Task, Verdict};
use crate::event::Event;

/// Skips records stamped with our own group id.
pub struct LoopGuard<S> {
    group_id: Arc<str>,
    inner: S,
}

/// Builds a [`LoopGuard`].
pub struct LoopGuardLayer {
    /// The consumer group id compared with the `source-system` header.
    pub group_id: String,
}

impl Layer for LoopGuardLayer {
    type Wrapped<S: Service> = LoopGuard<S>;

    fn wrap<S: Service>(self, inner: S) -> LoopGuard<S> {
        LoopGuard {
            group_id: Arc::from(self.group_id),
            inner,
        }
    }
}

fn source_system(event: &Event) -> Option<&str> {
    match event {
        Event::Message(message) => message.headers.source_system(),
        Event::Excise(excise) => excise.headers.source_system(),
        // A record we cannot read is reported whoever produced it; timers are our own.
        Event::Rejected(_) | Event::Timer(_) => None,
    }
}

impl<S: Service> Service for LoopGuard<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        if source_system(task.event) == Some(&*self.group_id) {
            trace!(key = %task.event.key(), offset = ?task.event.offset(),
                "skipped: produced by this group (source-system)");
            return Ok(Value::Null);
        }
        self.inner.call(task).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::stack::testing::{Calls, message_with, task};
    use prosody_api::Headers;
    use serde_json::json;

    #[tokio::test]
    async fn skips_only_our_own_group() {
        let calls = Calls::succeeding();
        let guard = Box::new(LoopGuardLayer {
            group_id: "billing".to_owned(),
        })
        .wrap(calls.clone());
        let ours = Headers::new().with("source-system", "billing");
        let theirs = Headers::new().with("source-system", "orders");
        for (headers, handled) in [(ours, false), (theirs, true), (Headers::new(), true)] {
            let before = calls.count();
            let verdict = guard
                .call(&task(message_with("k", json!({}), headers)))
                .await;
            assert_eq!(verdict, Ok(Value::Null));
            assert_eq!(calls.count() - before, usize::from(handled));
        }
    }
}
