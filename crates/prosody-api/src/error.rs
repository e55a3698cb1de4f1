//! Error classification and the errors of the storage traits and the event context.
//!
//! Every failure is either *transient* (a retry may succeed: the store timed out, the key is
//! busy) or *permanent* (retrying the same input fails the same way). Middleware decides between
//! retry/defer and the failure topic from this class alone, so the class travels with the error
//! rather than being inferred from its type by each layer. Unclassified errors are transient:
//! dropping a message must be a deliberate decision, never a default.

use std::error::Error as StdError;
use std::fmt;

/// Whether retrying can fix a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A retry may succeed.
    Transient,
    /// A retry fails the same way; the event is routed by the mode's permanent-failure policy.
    Permanent,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
        })
    }
}

/// Classifies an error as transient or permanent. Implement it for any error type; the default
/// is transient, so `impl ClassifyError for MyError {}` is a complete implementation.
pub trait ClassifyError {
    /// The class of this error. Transient unless overridden.
    fn error_class(&self) -> ErrorClass {
        ErrorClass::Transient
    }

    /// True when the error is permanent.
    fn is_permanent(&self) -> bool {
        self.error_class() == ErrorClass::Permanent
    }
}

impl ClassifyError for std::io::Error {}
impl ClassifyError for Box<dyn StdError + Send + Sync> {}

/// A handler error with an explicit class: the convenient `EventHandler::Error` when a handler
/// does not need its own error type.
#[derive(Debug)]
pub struct HandlerError {
    class: ErrorClass,
    source: Box<dyn StdError + Send + Sync>,
}

impl HandlerError {
    /// A failure a retry may fix.
    pub fn transient(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            class: ErrorClass::Transient,
            source: source.into(),
        }
    }

    /// A failure a retry cannot fix.
    pub fn permanent(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            class: ErrorClass::Permanent,
            source: source.into(),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} handler error: {}", self.class, self.source)
    }
}

impl StdError for HandlerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(self.source.as_ref())
    }
}

impl ClassifyError for HandlerError {
    fn error_class(&self) -> ErrorClass {
        self.class
    }
}

/// What went wrong in a storage call, independent of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageErrorKind {
    /// The backend failed or did not answer (I/O, timeout, unavailable). Transient.
    Backend,
    /// A write would exceed a collection bound (a map's keyset limit). Nothing of the batch was
    /// applied. Permanent: the same batch fails the same way.
    LimitExceeded,
    /// The request itself is invalid (e.g. a time beyond [`crate::TimerTime::MAX`]). Permanent.
    InvalidRequest,
    /// Stored data could not be decoded. Permanent.
    Corrupt,
}

impl StorageErrorKind {
    /// The class an error of this kind has unless a backend says otherwise.
    #[must_use]
    pub const fn default_class(self) -> ErrorClass {
        match self {
            Self::Backend => ErrorClass::Transient,
            Self::LimitExceeded | Self::InvalidRequest | Self::Corrupt => ErrorClass::Permanent,
        }
    }
}

/// The one error type of every storage trait: what failed (`operation`, e.g.
/// `"timer.schedule"`), why, and whether a retry can help.
#[derive(Debug, thiserror::Error)]
#[error("{operation} failed ({class} {kind:?}): {message}")]
pub struct StorageError {
    operation: &'static str,
    kind: StorageErrorKind,
    class: ErrorClass,
    message: String,
    #[source]
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl StorageError {
    /// An error of `kind` with that kind's default class.
    pub fn new(
        operation: &'static str,
        kind: StorageErrorKind,
        message: impl Into<String>,
    ) -> Self {
        Self {
            operation,
            kind,
            class: kind.default_class(),
            message: message.into(),
            source: None,
        }
    }

    /// A transient backend failure.
    pub fn backend(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(operation, StorageErrorKind::Backend, message)
    }

    /// A collection bound would be exceeded.
    pub fn limit_exceeded(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(operation, StorageErrorKind::LimitExceeded, message)
    }

    /// An invalid request.
    pub fn invalid_request(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(operation, StorageErrorKind::InvalidRequest, message)
    }

    /// Overrides the class, for a backend that knows better than the kind's default (e.g. a
    /// driver error that is known to be permanent).
    #[must_use]
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.class = class;
        self
    }

    /// Attaches the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The storage operation that failed.
    #[must_use]
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// What went wrong.
    #[must_use]
    pub fn kind(&self) -> StorageErrorKind {
        self.kind
    }

    /// The human-readable detail.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl ClassifyError for StorageError {
    fn error_class(&self) -> ErrorClass {
        self.class
    }
}

/// The error of an event-context operation (timers API, keyed-state handles).
///
/// Classes follow the spec: a store failure keeps the store's class; a caller mistake or a
/// handle used after its attempt is transient (so the event retries instead of being dropped);
/// only an unregistered or mismatched collection is permanent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// The context or handle outlived its event attempt; nothing was changed.
    #[error("the event attempt has ended; this context or handle is no longer valid")]
    AttemptEnded,
    /// No collection of this name is registered on the client.
    #[error("keyed-state collection `{0}` is not registered")]
    Unregistered(String),
    /// The collection exists with another kind or payload.
    #[error("keyed-state collection `{name}` is a {registered}, not a {requested}")]
    Mismatch {
        /// Collection name.
        name: String,
        /// What it was registered as.
        registered: String,
        /// What the caller asked for.
        requested: String,
    },
    /// The caller passed something the operation cannot accept (a null value, a bad index).
    #[error("invalid keyed-state request: {0}")]
    InvalidRequest(String),
    /// The store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl ClassifyError for ContextError {
    fn error_class(&self) -> ErrorClass {
        match self {
            Self::AttemptEnded | Self::InvalidRequest(_) => ErrorClass::Transient,
            Self::Unregistered(_) | Self::Mismatch { .. } => ErrorClass::Permanent,
            Self::Storage(error) => error.error_class(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Plain;
    impl ClassifyError for Plain {}

    #[test]
    fn unclassified_errors_are_transient() {
        assert_eq!(Plain.error_class(), ErrorClass::Transient);
        assert!(!Plain.is_permanent());
    }

    #[test]
    fn storage_error_names_the_operation_and_keeps_its_class() {
        let error = StorageError::limit_exceeded("state.apply", "map `m` is full");
        assert!(error.is_permanent());
        assert_eq!(error.kind(), StorageErrorKind::LimitExceeded);
        assert!(error.to_string().contains("state.apply"));
        let backend = StorageError::backend("timer.schedule", "timeout");
        assert_eq!(backend.error_class(), ErrorClass::Transient);
        assert!(backend.with_class(ErrorClass::Permanent).is_permanent());
    }

    #[test]
    fn context_errors_follow_the_spec_classes() {
        assert!(!ContextError::AttemptEnded.is_permanent());
        assert!(ContextError::Unregistered("x".into()).is_permanent());
        assert!(!ContextError::from(StorageError::backend("op", "down")).is_permanent());
    }

    #[test]
    fn handler_error_carries_its_class_and_source() {
        let error = HandlerError::permanent("bad payload");
        assert!(error.is_permanent());
        assert!(error.source().is_some());
        assert!(!HandlerError::transient("busy").is_permanent());
    }
}
