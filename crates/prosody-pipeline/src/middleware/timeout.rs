//! Handler timeout: an attempt gets a deadline `timeoutMs` away, from which its context
//! reports `should_cancel` and its `cancelled()` resolves. The handler decides how to stop;
//! what it returns is the attempt's verdict (an error after a timeout is a transient failure
//! like any other, so the mode's retry policy applies).
//!
//! The deadline belongs to the attempt: revocation and shutdown still reach the handler, and
//! a later attempt gets a fresh deadline. A deadline costs nothing on the hot path (no timer,
//! no child cancellation, no precise clock read: see [`crate::deadline`]); only a handler that
//! waits for cancellation arms a timer.

use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::{Layer, Service, Task, Verdict};
use crate::deadline::Deadline;
use crate::monotonic::Clock;

/// Gives each attempt its deadline.
pub struct Timeout<S> {
    /// `timeoutMs`.
    limit: Duration,
    clock: Arc<dyn Clock>,
    inner: S,
}

/// Builds a [`Timeout`].
pub struct TimeoutLayer {
    /// How long an attempt runs before its context reports cancellation.
    pub timeout: Duration,
    /// The clock deadlines are judged on ([`SystemClock`](crate::monotonic::SystemClock) but
    /// in tests).
    pub clock: Arc<dyn Clock>,
}

impl Layer for TimeoutLayer {
    type Wrapped<S: Service> = Timeout<S>;

    fn wrap<S: Service>(self, inner: S) -> Timeout<S> {
        Timeout {
            limit: self.timeout,
            clock: self.clock,
            inner,
        }
    }
}

impl<S: Service> Service for Timeout<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        // The handler's time starts here, not at the attempt's admission: what the layers
        // above spend (a dedup or defer store's I/O) must not eat into the handler's timeout.
        let started = self.clock.now();
        let deadline = Deadline::new(started, self.limit, &*self.clock);
        let mut attempt = *task;
        attempt.deadline = Some(
            task.deadline
                .map_or(deadline, |earlier| earlier.earliest(deadline)),
        );
        let verdict = self.inner.call(&attempt).await;
        if !deadline.passed() {
            return verdict;
        }
        let ran = self.clock.now().saturating_duration_since(started);
        warn!(key = %task.event.key(), attempt = task.attempt, timeout = ?self.limit, ?ran,
            "handler ran past its timeout; its context reported cancellation at the deadline");
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::FailureKind;
    use crate::middleware::stack::testing::{Calls, message, task};
    use crate::monotonic::{Clock, TokioClock};
    use serde_json::json;
    use tokio::time::Instant;

    /// On tokio's clock, which the tests' paused time moves.
    fn timed<S: Service>(timeout: Duration, inner: S) -> Timeout<S> {
        TimeoutLayer {
            timeout,
            clock: Arc::new(TokioClock::new()),
        }
        .wrap(inner)
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_fires_at_the_deadline_and_not_for_the_parent() {
        let calls = Calls::until_cancelled(FailureKind::Transient);
        let layer = timed(Duration::from_millis(250), calls.clone());
        let task = task(message("k", json!({})));
        let parent = task.cancel.signal().clone();
        let started = Instant::now();
        let verdict = layer.call(&task).await;
        assert_eq!(started.elapsed(), Duration::from_millis(250));
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Transient));
        assert_eq!(calls.cancelled_seen(), 1);
        assert!(!parent.is_cancelled(), "later attempts are not cancelled");
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_counts_from_the_handler_not_from_the_admission() {
        let calls = Calls::until_cancelled(FailureKind::Transient);
        let layer = timed(Duration::from_millis(250), calls.clone());
        let mut task = task(message("k", json!({})));
        task.started = Some(TokioClock::new().now());
        // The layers above took their time (a store's I/O, say) after the admission.
        tokio::time::advance(Duration::from_millis(200)).await;
        let called = Instant::now();
        let verdict = layer.call(&task).await;
        assert_eq!(called.elapsed(), Duration::from_millis(250));
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Transient));
    }

    #[tokio::test(start_paused = true)]
    async fn the_dispatch_cancellation_still_reaches_the_attempt() {
        let calls = Calls::until_cancelled(FailureKind::Cancelled);
        let layer = timed(Duration::from_secs(60), calls.clone());
        let task = task(message("k", json!({})));
        let cancel = task.cancel.signal().clone();
        let running = tokio::spawn(async move { layer.call(&task).await });
        calls.wait_for(1).await;
        let started = Instant::now();
        cancel.cancel();
        let verdict = running.await.expect("joined");
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Cancelled));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_attempt_is_not_cancelled() {
        let calls = Calls::succeeding();
        let layer = timed(Duration::from_millis(250), calls.clone());
        layer
            .call(&task(message("k", json!({}))))
            .await
            .expect("ok");
        assert_eq!(calls.cancelled_seen(), 0);
    }
}
