//! Runs each attempt holding an admission permit: the first attempt uses the permit the
//! engine acquired for the event (normal class); a retry asks again in the retry class, so
//! the fair scheduler can hold retries to their share of run time. A failed attempt gives its
//! permit back at once, so the key holds none while the retry layer waits out the backoff.

use std::sync::Arc;

use super::{Failure, Layer, Service, Task, Verdict};
use crate::consumer::{Admission, Permit, TaskClass, admit};

/// Holds a permit while the attempt runs.
pub struct Scheduled<S> {
    admission: Arc<dyn Admission>,
    inner: S,
}

/// Builds a [`Scheduled`].
pub struct ScheduledLayer {
    /// The admission the engine acquires from (the fair scheduler).
    pub admission: Arc<dyn Admission>,
}

impl Layer for ScheduledLayer {
    type Wrapped<S: Service> = Scheduled<S>;

    fn wrap<S: Service>(self, inner: S) -> Scheduled<S> {
        Scheduled {
            admission: self.admission,
            inner,
        }
    }
}

impl<S: Service> Service for Scheduled<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        // The engine's permit stays in the slot while the attempt runs (taking it out and
        // putting it back locked the slot twice per event); a retry holds a fresh one here.
        let fresh = if task.permit.is_held() {
            None
        } else {
            Some(Box::pin(self.admit(task)).await?)
        };
        let verdict = self.inner.call(task).await;
        if verdict.is_ok() {
            // Back to the engine, which releases it after recording the event done.
            if let Some(permit) = fresh {
                task.permit.put(permit);
            }
        } else {
            // Given back for the backoff.
            drop(fresh);
            drop(task.permit.take());
        }
        verdict
    }
}

impl<S> Scheduled<S> {
    /// A permit in the class of `task`'s attempt, unless the work is cancelled first. Boxed by
    /// the caller: only retries wait here, and its state would otherwise widen every attempt's
    /// future.
    async fn admit(&self, task: &Task<'_>) -> Result<Permit, Failure> {
        let class = if task.attempt > 1 {
            TaskClass::Retry
        } else {
            TaskClass::Normal
        };
        tokio::select! {
            permit = admit(&*self.admission, task.event.key(), class) => Ok(permit),
            () = task.cancel.cancelled() => Err(Failure::cancelled(task.attempt)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::{PermitSlot, SemaphoreAdmission};
    use crate::middleware::FailureKind;
    use crate::middleware::stack::testing::{Calls, message, task};
    use serde_json::json;

    #[tokio::test]
    async fn success_returns_the_permit_failure_releases_it() {
        let admission = Arc::new(SemaphoreAdmission::new(1));
        let key = prosody_api::Key::from("k");
        let first = admission.acquire(&key, TaskClass::Normal).await;
        let ok = Box::new(ScheduledLayer {
            admission: admission.clone(),
        })
        .wrap(Calls::succeeding());
        let slot = PermitSlot::holding(first);
        let mut attempt = task(message("k", json!({})));
        attempt.permit = &slot;
        ok.call(&attempt).await.expect("ok");
        assert!(slot.is_held(), "the engine releases it after finishing");

        let failing = Box::new(ScheduledLayer {
            admission: admission.clone(),
        })
        .wrap(Calls::failing(FailureKind::Transient));
        let mut attempt = task(message("k", json!({})));
        attempt.permit = &slot;
        let verdict = failing.call(&attempt).await;
        assert!(verdict.is_err());
        assert!(!slot.is_held(), "released for the backoff");
        // A retry acquires anew, which only works because the failed attempt released it.
        let mut retry = task(message("k", json!({})));
        retry.attempt = 2;
        retry.permit = &slot;
        tokio::time::timeout(std::time::Duration::from_secs(5), ok.call(&retry))
            .await
            .expect("the permit was free")
            .expect("ok");
        assert!(slot.is_held());
    }
}
