//! Rust errors as JavaScript errors.
//!
//! A rejected promise can only carry a message and a status code across napi, so the class of
//! the error travels in a fixed prefix of the message: `[prosody <class> <kind>] <message>`,
//! where `<class>` is `transient` or `permanent` and `<kind>` says which API failed (`config`,
//! `client`, `producer`, `admin`, `context`, `state`, `cancelled`). `index.js` parses the prefix off and
//! throws the matching JavaScript class (`TransientError`, `PermanentError`, ...), so an error
//! that escapes a handler keeps its classification.

use std::fmt::Display;

use napi::{Error, Status};
use prosody::api::{ClassifyError, ErrorClass};

/// Which API an error comes from; the JavaScript layer picks the error class from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Invalid client options.
    Config,
    /// A client lifecycle operation (subscribe twice, use after shutdown, ...).
    Client,
    /// A send or excise.
    Producer,
    /// An admin operation.
    Admin,
    /// An event-context operation (timers).
    Context,
    /// A keyed-state operation (`TransientStateError`/`PermanentStateError` in JavaScript).
    State,
    /// The caller's `AbortSignal` fired.
    Cancelled,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Client => "client",
            Self::Producer => "producer",
            Self::Admin => "admin",
            Self::Context => "context",
            Self::State => "state",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A JavaScript error for `error`, carrying its class and `kind` in the message prefix.
pub fn classified(kind: ErrorKind, error: &(impl Display + ClassifyError + ?Sized)) -> Error {
    with_class(kind, error.error_class(), error)
}

/// A JavaScript error with an explicit class.
pub fn with_class(kind: ErrorKind, class: ErrorClass, message: &(impl Display + ?Sized)) -> Error {
    Error::new(
        Status::GenericFailure,
        format!("[prosody {class} {}] {message}", kind.as_str()),
    )
}

/// The error of an operation the caller cancelled through its `AbortSignal`.
#[must_use]
pub fn cancelled(what: &str) -> Error {
    with_class(
        ErrorKind::Cancelled,
        ErrorClass::Transient,
        &format!("{what} was aborted"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_names_class_and_kind() {
        let error = with_class(
            ErrorKind::Config,
            ErrorClass::Permanent,
            "maxConcurrency: bad",
        );
        assert_eq!(
            error.reason,
            "[prosody permanent config] maxConcurrency: bad"
        );
        assert_eq!(
            cancelled("send").reason,
            "[prosody transient cancelled] send was aborted"
        );
    }
}
