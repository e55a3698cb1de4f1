//! Handler timeout: an attempt running past `timeoutMs` has its cancellation fired, so the
//! handler's context reports `should_cancel` and `cancelled()` resolves. The handler decides
//! how to stop; what it returns is the attempt's verdict (an error after a timeout is a
//! transient failure like any other, so the mode's retry policy applies).
//!
//! Each attempt gets a child of the dispatch's token: revocation and shutdown still reach
//! the handler, and firing the timeout does not cancel later attempts.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::warn;

use super::{Layer, Service, Task, Verdict};

/// Fires the attempt's cancellation at its deadline.
pub struct Timeout {
    timeout: Duration,
    inner: Arc<dyn Service>,
}

/// Builds a [`Timeout`].
pub struct TimeoutLayer {
    /// The longest an attempt runs before its cancellation fires.
    pub timeout: Duration,
}

impl Layer for TimeoutLayer {
    fn wrap(self: Box<Self>, inner: Arc<dyn Service>) -> Arc<dyn Service> {
        Arc::new(Timeout {
            timeout: self.timeout,
            inner,
        })
    }
}

#[async_trait]
impl Service for Timeout {
    async fn call(&self, mut task: Task) -> Verdict {
        let token = task.cancel.child_token();
        task.cancel = token.clone();
        let key = task.event.key().clone();
        let attempt = task.attempt;
        let running = self.inner.call(task);
        tokio::pin!(running);
        tokio::select! {
            biased;
            verdict = &mut running => return verdict,
            () = tokio::time::sleep(self.timeout) => {}
        }
        warn!(%key, attempt, timeout = ?self.timeout, "handler timed out: cancelling it");
        token.cancel();
        running.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::FailureKind;
    use crate::middleware::stack::testing::{Calls, message, task};
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn cancellation_fires_at_the_deadline_and_not_for_the_parent() {
        let calls = Calls::until_cancelled(FailureKind::Transient);
        let layer = Box::new(TimeoutLayer {
            timeout: Duration::from_millis(250),
        })
        .wrap(calls.clone());
        let task = task(message("k", json!({})));
        let parent = task.cancel.clone();
        let started = tokio::time::Instant::now();
        let verdict = layer.call(task).await;
        assert_eq!(started.elapsed(), Duration::from_millis(250));
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Transient));
        assert!(!parent.is_cancelled(), "later attempts keep a live token");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_attempt_is_not_cancelled() {
        let calls = Calls::succeeding();
        let layer = Box::new(TimeoutLayer {
            timeout: Duration::from_millis(250),
        })
        .wrap(calls.clone());
        layer.call(task(message("k", json!({})))).await.expect("ok");
        assert_eq!(calls.cancelled_seen(), 0);
    }
}
