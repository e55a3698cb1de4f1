//! Bounds work past revocation or shutdown. Once the dispatch's cancellation has fired no
//! new attempt starts, and an attempt still running `grace` after it is dropped: a handler
//! that ignores cancellation must not keep its key, its scheduler permit and the revocation
//! waiting past the shutdown budget.
//!
//! The engine fires cancellation at four fifths of `shutdownTimeoutMs` and waits for the rest;
//! the grace is half of that rest, so the dispatch ends (and returns its permit) before the
//! engine stops waiting for it.

use std::time::Duration;

use tracing::warn;

use super::{Failure, Layer, Service, Task, Verdict};

/// Stops attempts that outlive the dispatch's cancellation.
pub struct Shutdown<S> {
    grace: Duration,
    inner: S,
}

/// Builds a [`Shutdown`].
pub struct ShutdownLayer {
    /// How long an attempt may run after cancellation fired.
    pub grace: Duration,
}

impl ShutdownLayer {
    /// The grace for a shutdown budget of `shutdown_timeout` (see the module docs).
    #[must_use]
    pub fn for_budget(shutdown_timeout: Duration) -> Self {
        Self {
            grace: shutdown_timeout / 10,
        }
    }
}

impl Layer for ShutdownLayer {
    type Wrapped<S: Service> = Shutdown<S>;

    fn wrap<S: Service>(self, inner: S) -> Shutdown<S> {
        Shutdown {
            grace: self.grace,
            inner,
        }
    }
}

impl<S: Service> Service for Shutdown<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        if task.cancel.is_cancelled() {
            return Err(Failure::cancelled(task.attempt));
        }
        let running = self.inner.call(task);
        tokio::pin!(running);
        // Biased: an attempt that finishes at once never polls the wait for cancellation.
        tokio::select! {
            biased;
            verdict = &mut running => verdict,
            () = async {
                task.cancel.cancelled().await;
                // Boxed: the timer is only needed once cancellation fired, and inline it
                // would size every event's future (see `crate::middleware::defer`).
                Box::pin(tokio::time::sleep(self.grace)).await;
            } => {
                warn!(key = %task.event.key(), attempt = task.attempt, grace = ?self.grace,
                    "handler ignored cancellation: attempt abandoned, record left uncommitted");
                Err(Failure::cancelled(task.attempt))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::FailureKind;
    use crate::middleware::stack::testing::{Calls, message, task};
    use serde_json::json;

    #[tokio::test]
    async fn no_attempt_starts_after_cancellation() {
        let calls = Calls::succeeding();
        let layer = Box::new(ShutdownLayer::for_budget(Duration::from_secs(1))).wrap(calls.clone());
        let task = task(message("k", json!({})));
        task.cancel.signal().cancel();
        let verdict = layer.call(&task).await;
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Cancelled));
        assert_eq!(calls.count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_ignoring_cancellation_is_dropped_after_the_grace() {
        let calls = Calls::hanging();
        let layer = Box::new(ShutdownLayer {
            grace: Duration::from_millis(300),
        })
        .wrap(calls.clone());
        let task = task(message("k", json!({})));
        let cancel = task.cancel.signal().clone();
        let running = tokio::spawn(async move { layer.call(&task).await });
        calls.wait_for(1).await;
        let cancelled_at = tokio::time::Instant::now();
        cancel.cancel();
        let verdict = running.await.expect("joined");
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Cancelled));
        assert_eq!(cancelled_at.elapsed(), Duration::from_millis(300));
    }
}
