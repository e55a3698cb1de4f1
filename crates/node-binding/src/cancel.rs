//! `CancelToken`: the Rust end of an `AbortSignal`.
//!
//! `index.js` creates one per `send`/`excise` call that has a signal and calls
//! [`CancelToken::cancel`] from the signal's `abort` listener; the operation selects on the
//! token and stops with a `cancelled` error.

use napi_derive::napi;
use tokio_util::sync::CancellationToken;

/// A cancellation flag shared between JavaScript and a running operation.
#[napi]
#[derive(Default)]
pub struct CancelToken {
    token: CancellationToken,
}

#[napi]
impl CancelToken {
    /// A token that is not cancelled.
    #[napi(constructor)]
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels every operation watching this token.
    #[napi]
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// True once [`CancelToken::cancel`] was called.
    #[napi(getter)]
    #[must_use]
    pub fn cancelled(&self) -> bool {
        self.token.is_cancelled()
    }
}

impl CancelToken {
    /// The underlying token, for the operation to watch.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}
