//! A level-triggered wakeup for the poll thread.
//!
//! The poll thread sleeps while the consumer's main queue is empty, and must wake as soon as
//! librdkafka puts something in it (a rebalance, an error) or the loop is asked to stop.
//! librdkafka signals "queue became non-empty" from its own threads and stop requests come from
//! any thread; both set the flag here, so a signal that arrives before the thread waits is not
//! lost.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// A flag with a condition variable: `notify` sets it, `wait` consumes it or times out.
#[derive(Debug, Default)]
pub struct Wakeup {
    signalled: Mutex<bool>,
    condvar: Condvar,
}

impl Wakeup {
    /// Wakes the waiting thread (or the next one to wait).
    pub fn notify(&self) {
        *self.signalled.lock() = true;
        self.condvar.notify_one();
    }

    /// Waits until notified or `timeout` passes, then clears the signal. True when notified.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut signalled = self.signalled.lock();
        if !*signalled {
            self.condvar.wait_for(&mut signalled, timeout);
        }
        std::mem::take(&mut *signalled)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_signal_before_the_wait_is_kept() {
        let wakeup = Wakeup::default();
        wakeup.notify();
        let started = Instant::now();
        assert!(wakeup.wait(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            !wakeup.wait(Duration::from_millis(1)),
            "the signal was consumed"
        );
    }

    #[test]
    fn notify_from_another_thread_ends_the_wait() {
        let wakeup = Arc::new(Wakeup::default());
        let started = Instant::now();
        let notifier = std::thread::spawn({
            let wakeup = wakeup.clone();
            move || wakeup.notify()
        });
        wakeup.wait(Duration::from_secs(10));
        notifier.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
