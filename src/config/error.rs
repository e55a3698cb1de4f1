//! The one error type of configuration.
//!
//! Configuration fails fast: the first invalid value stops construction. Every message starts
//! with the field it is about, written the way the user wrote it (the camelCase option, and the
//! environment variable when the value came from there), so that the message alone is enough to
//! find and fix the setting.

use std::fmt;

/// Names the setting an error is about.
///
/// `option` is the camelCase option name (as in the Node.js `Configuration` object and the JSON
/// form of [`ClientOptions`](super::ClientOptions)); `env` is the environment variable. Either
/// can be absent: `PROSODY_LOG` has no option, `mode` has no variable. `env` is present when the
/// offending value came from the environment, or when naming it helps (a missing required value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldRef {
    /// The camelCase option name, if the setting has one.
    pub option: Option<&'static str>,
    /// The environment variable name, when it is relevant to the error.
    pub env: Option<&'static str>,
}

impl fmt::Display for FieldRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.option, self.env) {
            (Some(option), Some(env)) => write!(f, "{option} ({env})"),
            (Some(option), None) => f.write_str(option),
            (None, Some(env)) => f.write_str(env),
            (None, None) => f.write_str("configuration"),
        }
    }
}

/// A configuration value was missing, malformed, out of range or inconsistent with another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value was given but is not acceptable.
    #[error("{field}: {expected}, got {got}")]
    Invalid {
        /// The setting that holds the value.
        field: FieldRef,
        /// What the setting accepts, phrased to follow the field name ("must be ...").
        expected: String,
        /// The rejected value as given: quoted raw text for environment variables.
        got: String,
    },

    /// A required value was given neither as an option nor in the environment.
    #[error("{field}: {reason}")]
    Missing {
        /// The missing setting, with its environment variable.
        field: FieldRef,
        /// When the value is required and how to provide it.
        reason: String,
    },

    /// Each value is acceptable alone, but not together with another setting.
    #[error("{field}: {reason}")]
    Conflict {
        /// The setting to change.
        field: FieldRef,
        /// Which other setting it conflicts with and how to resolve it.
        reason: String,
    },

    /// The options object itself could not be read: wrong JSON type, unknown option, bad syntax.
    #[error("{path}: {message}")]
    Options {
        /// Where in the options object the problem is, e.g. `maxConcurrency` or
        /// `stateReadCache.ttlMs`.
        path: String,
        /// The deserializer's explanation, including what was expected.
        message: String,
    },
}

impl ConfigError {
    /// The camelCase option (or, for a malformed options object, the path) this error is about.
    #[must_use]
    pub fn option(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. }
            | Self::Missing { field, .. }
            | Self::Conflict { field, .. } => field.option,
            Self::Options { path, .. } => Some(path),
        }
    }

    /// The environment variable this error is about, when the value came from the environment or
    /// naming it helps to provide a missing value.
    #[must_use]
    pub fn env_var(&self) -> Option<&'static str> {
        match self {
            Self::Invalid { field, .. }
            | Self::Missing { field, .. }
            | Self::Conflict { field, .. } => field.env,
            Self::Options { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_names_option_and_env() {
        let error = ConfigError::Invalid {
            field: FieldRef {
                option: Some("maxConcurrency"),
                env: Some("PROSODY_MAX_CONCURRENCY"),
            },
            expected: "must be an integer >= 1".to_owned(),
            got: "\"0\"".to_owned(),
        };
        assert_eq!(
            error.to_string(),
            "maxConcurrency (PROSODY_MAX_CONCURRENCY): must be an integer >= 1, got \"0\""
        );
        assert_eq!(error.option(), Some("maxConcurrency"));
        assert_eq!(error.env_var(), Some("PROSODY_MAX_CONCURRENCY"));
    }

    #[test]
    fn env_only_field_shows_variable() {
        let field = FieldRef {
            option: None,
            env: Some("PROSODY_LOG"),
        };
        assert_eq!(field.to_string(), "PROSODY_LOG");
    }
}
