//! An assignment's cancellation: fired once, on revocation or shutdown, and read by every
//! attempt of the assignment's events.
//!
//! Every attempt asks whether it is cancelled, and every attempt whose handler is pending waits
//! for it (the shutdown layer ends an attempt that outlives it). `tokio_util`'s token took its
//! tree's lock for each question and registered each waiting attempt on a waiter list under
//! another lock, unregistering it on drop: up to three locks per event on a token that every
//! core serving the partition shares. Here the question is an atomic load, and a wait polled by
//! one of the assignment's key runners costs a comparison: a runner enlists its task once for
//! its life ([`CancelSignal::enlist`]), cancellation wakes every enlisted task, and a wait
//! polled by an enlisted task only has to check the flag when it is polled again. A wait polled
//! by any other task (a handler's own task, a test) registers on a [`Notify`] as usual.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::attachments::Attachments;

/// One assignment's cancellation, and what the layers serving the assignment keep for it
/// ([`Attachments`]): every attempt borrows the signal, so it is how an attempt reaches its
/// assignment.
#[derive(Default)]
pub struct CancelSignal {
    cancelled: AtomicBool,
    /// The tasks of the assignment's key runners, woken when it fires (then emptied).
    runners: Mutex<Vec<Waker>>,
    /// Waits polled by any other task.
    others: Notify,
    attachments: Attachments,
}

impl fmt::Debug for CancelSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelSignal")
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl CancelSignal {
    /// A signal that has not fired.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal: from now on it reports cancelled, and every wait completes.
    pub fn cancel(&self) {
        if self.cancelled.swap(true, Ordering::SeqCst) {
            return;
        }
        // Taken after the flag is set: a runner enlisting later finds it set under the lock.
        let runners = std::mem::take(&mut *self.runners.lock());
        for runner in runners {
            runner.wake();
        }
        self.others.notify_waiters();
    }

    /// True once the signal fired.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// The states the assignment's layers attached to it.
    #[must_use]
    pub fn attachments(&self) -> &Attachments {
        &self.attachments
    }

    /// Completes once the signal fired, polled from any task.
    pub async fn cancelled(&self) {
        // Made before the check: `notify_waiters` reaches every `Notified` made before it, polled
        // or not. Only the firing notifies, so a notification means it fired.
        let notified = self.others.notified();
        if self.is_cancelled() {
            return;
        }
        notified.await;
    }

    /// A view of the signal for the task that awaits this: the task is woken when the signal
    /// fires, for as long as the signal lives, so the view's waits polled by that task need no
    /// registration of their own. A key runner enlists once, when it starts.
    pub async fn enlist(self: &Arc<Self>) -> CancelWatch {
        let task = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        {
            let mut runners = self.runners.lock();
            if !self.is_cancelled() {
                runners.push(task.clone());
            }
        }
        CancelWatch {
            signal: self.clone(),
            task: Some(task),
        }
    }
}

/// A view of an assignment's [`CancelSignal`] that its attempts borrow: from the key runner
/// that enlisted ([`CancelSignal::enlist`]), or detached, when no task is enlisted.
#[derive(Debug)]
pub struct CancelWatch {
    signal: Arc<CancelSignal>,
    /// The enlisted task, woken when the signal fires.
    task: Option<Waker>,
}

impl CancelWatch {
    /// A view with no task enlisted: its waits register like any other task's.
    #[must_use]
    pub fn detached(signal: Arc<CancelSignal>) -> Self {
        Self { signal, task: None }
    }

    /// The signal viewed.
    #[must_use]
    pub fn signal(&self) -> &Arc<CancelSignal> {
        &self.signal
    }

    /// True once the signal fired.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.signal.is_cancelled()
    }

    /// Completes once the signal fired.
    #[must_use]
    pub fn cancelled(&self) -> Cancelled<'_> {
        Cancelled {
            watch: self,
            elsewhere: None,
        }
    }
}

/// The future of [`CancelWatch::cancelled`].
pub struct Cancelled<'a> {
    watch: &'a CancelWatch,
    /// The registered wait, once the future was polled by a task that is not enlisted.
    elsewhere: Option<BoxFuture<'a, ()>>,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.watch.is_cancelled() {
            return Poll::Ready(());
        }
        if let Some(elsewhere) = &mut self.elsewhere {
            return elsewhere.as_mut().poll(cx);
        }
        // The enlisted task is woken when the signal fires, and then polls this again: a firing
        // after the check above is not missed.
        if self
            .watch
            .task
            .as_ref()
            .is_some_and(|task| task.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        let signal = &self.watch.signal;
        let mut elsewhere: BoxFuture<'_, ()> = Box::pin(signal.cancelled());
        let polled = elsewhere.as_mut().poll(cx);
        self.elsewhere = Some(elsewhere);
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::time::Duration;

    /// Spawns a task that waits with `lent` (a watch another task enlisted), or with a watch
    /// it enlists itself when there is none; returns once its first poll of the wait was
    /// pending.
    async fn waiting_task(
        signal: &Arc<CancelSignal>,
        lent: Option<CancelWatch>,
    ) -> tokio::task::JoinHandle<()> {
        let (polled, first_poll) = tokio::sync::oneshot::channel();
        let signal = signal.clone();
        let waiting = tokio::spawn(async move {
            let watch = match lent {
                Some(watch) => watch,
                None => signal.enlist().await,
            };
            let mut cancelled = pin!(watch.cancelled());
            assert!(futures::poll!(cancelled.as_mut()).is_pending());
            polled.send(()).expect("test waits");
            cancelled.await;
        });
        first_poll.await.expect("polled once");
        waiting
    }

    /// Fires `signal` and fails unless `waiting` ends soon after.
    async fn assert_woken_by_the_firing(
        signal: &CancelSignal,
        waiting: tokio::task::JoinHandle<()>,
    ) {
        signal.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("joined");
    }

    #[tokio::test]
    async fn an_enlisted_task_waiting_without_registering_is_woken_by_the_firing() {
        let signal = Arc::new(CancelSignal::new());
        let waiting = waiting_task(&signal, None).await;
        assert_eq!(signal.runners.lock().len(), 1);
        assert_woken_by_the_firing(&signal, waiting).await;
    }

    #[tokio::test]
    async fn a_wait_polled_by_a_task_that_did_not_enlist_registers_and_is_woken() {
        let signal = Arc::new(CancelSignal::new());
        // Enlisted by this task, waited on by another.
        let lent = signal.enlist().await;
        let waiting = waiting_task(&signal, Some(lent)).await;
        assert_woken_by_the_firing(&signal, waiting).await;
    }

    #[tokio::test]
    async fn a_detached_watch_and_a_late_enlistment_see_an_earlier_firing() {
        let signal = Arc::new(CancelSignal::new());
        signal.cancel();
        signal.cancel();
        let watch = signal.enlist().await;
        assert!(watch.is_cancelled());
        watch.cancelled().await;
        assert!(
            signal.runners.lock().is_empty(),
            "no task enlisted after the firing"
        );
        CancelWatch::detached(signal.clone()).cancelled().await;
        signal.cancelled().await;
    }
}
