//! In-process retry of transient failures: exponential backoff from `retryBaseMs`, capped at
//! `maxRetryDelayMs`, with jitter so keys that failed together do not retry together.
//! Permanent failures and cancellation are never retried.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tracing::warn;

use super::{Failure, FailureKind, Layer, Service, Task, Verdict};

/// Delays between attempts: exponential from `base` to `max_delay`, with jitter.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    pub base: Duration,
    /// Upper bound of any delay.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// The delays, without end.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.base)
            .with_max_delay(self.max_delay)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// Retries transient failures of the layers below.
pub struct Retry<S> {
    policy: RetryPolicy,
    max_retries: Option<u32>,
    inner: S,
}

/// Builds a [`Retry`].
pub struct RetryLayer {
    /// The backoff.
    pub policy: RetryPolicy,
    /// Retries after the first attempt; `None` retries until success (pipeline mode).
    pub max_retries: Option<u32>,
}

impl Layer for RetryLayer {
    type Wrapped<S: Service> = Retry<S>;

    fn wrap<S: Service>(self, inner: S) -> Retry<S> {
        Retry {
            policy: self.policy,
            max_retries: self.max_retries,
            inner,
        }
    }
}

impl<S: Service> Service for Retry<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        let failure = match self.inner.call(task).await {
            Err(failure) if failure.kind == FailureKind::Transient => failure,
            verdict => return verdict,
        };
        // Boxed: only failed attempts retry, and inline the retries' state (a second inner
        // future, the backoff timer) would size every event's future (see the defer layer).
        Box::pin(self.retry(task, failure)).await
    }
}

impl<S: Service> Retry<S> {
    /// Retries `task` after its first attempt failed transiently with `failure`.
    async fn retry(&self, task: &Task<'_>, failure: Failure) -> Verdict {
        // The first attempt went through as it was; only a retry needs a task of its own.
        let mut delays = self.policy.delays();
        let mut retry = *task;
        let mut failure = failure;
        for retries in 0_u32.. {
            if self.max_retries.is_some_and(|max| retries >= max) {
                return Err(failure);
            }
            let delay = delays.next().unwrap_or(self.policy.max_delay);
            warn!(key = %retry.event.key(), offset = ?retry.event.offset(), attempt = retry.attempt,
                reason = %failure.reason, retry_in = ?delay, "transient failure: retrying");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = retry.cancel.cancelled() => return Err(Failure::cancelled(retry.attempt)),
            }
            retry.attempt += 1;
            retry.started = None;
            failure = match self.inner.call(&retry).await {
                Err(failure) if failure.kind == FailureKind::Transient => failure,
                verdict => return verdict,
            };
        }
        Err(failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::stack::testing::{Calls, message, task};
    use serde_json::{Value, json};

    fn layer<S: Service>(max_retries: Option<u32>, inner: S) -> Retry<S> {
        Box::new(RetryLayer {
            policy: RetryPolicy {
                base: Duration::from_millis(1),
                max_delay: Duration::from_millis(2),
            },
            max_retries,
        })
        .wrap(inner)
    }

    #[tokio::test]
    async fn retries_transient_until_success_numbering_attempts() {
        let calls = Calls::failing_first(3, FailureKind::Transient);
        let retry = layer(None, calls.clone());
        assert_eq!(
            retry.call(&task(message("k", json!({})))).await,
            Ok(Value::Null)
        );
        assert_eq!(calls.attempts(), vec![1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn gives_up_after_max_retries_with_the_last_failure() {
        let calls = Calls::failing(FailureKind::Transient);
        let retry = layer(Some(2), calls.clone());
        let failure = retry
            .call(&task(message("k", json!({}))))
            .await
            .expect_err("gives up");
        assert_eq!(failure.attempt, 3);
        assert_eq!(calls.attempts(), vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn permanent_failures_are_not_retried() {
        let calls = Calls::failing(FailureKind::Permanent);
        let retry = layer(None, calls.clone());
        let failure = retry.call(&task(message("k", json!({})))).await;
        assert_eq!(failure.map_err(|f| f.kind), Err(FailureKind::Permanent));
        assert_eq!(calls.count(), 1);
    }

    #[tokio::test]
    async fn cancellation_stops_the_backoff() {
        let calls = Calls::failing(FailureKind::Transient);
        let retry = Box::new(RetryLayer {
            policy: RetryPolicy {
                base: Duration::from_secs(60),
                max_delay: Duration::from_secs(60),
            },
            max_retries: None,
        })
        .wrap(calls.clone());
        let task = task(message("k", json!({})));
        let cancel = task.cancel.signal().clone();
        let running = tokio::spawn(async move { retry.call(&task).await });
        calls.wait_for(1).await;
        cancel.cancel();
        let verdict = running.await.expect("joined");
        assert_eq!(verdict.map_err(|f| f.kind), Err(FailureKind::Cancelled));
    }
}
