//! Where environment variables are read from.
//!
//! Resolution reads the environment through [`EnvSource`] instead of `std::env` directly so that
//! tests (and embedders such as the Node binding) can supply a fixed set of variables. Mutating
//! the real process environment is `unsafe` in edition 2024 and races with tests running in
//! parallel, so nothing here ever writes to it.

use std::collections::HashMap;

/// A read-only view of environment variables.
pub trait EnvSource {
    /// The value of variable `name`, or `None` when it is not set.
    fn get(&self, name: &str) -> Option<String>;
}

/// The environment of the current process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        // Lossy rather than `None`: a non-UTF-8 value is a mistake the user should hear about
        // from validation, not one that silently falls back to the default.
        std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
    }
}

/// A fixed set of variables, for tests and for callers that assemble their own environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapEnv {
    vars: HashMap<String, String>,
}

impl MapEnv {
    /// An environment with no variables set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns this environment with `name` set to `value`.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.vars.insert(name.into(), value.into());
        self
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for MapEnv {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self {
            vars: iter
                .into_iter()
                .map(|(name, value)| (name.into(), value.into()))
                .collect(),
        }
    }
}

impl EnvSource for MapEnv {
    fn get(&self, name: &str) -> Option<String> {
        self.vars.get(name).cloned()
    }
}

impl<T: EnvSource + ?Sized> EnvSource for &T {
    fn get(&self, name: &str) -> Option<String> {
        (**self).get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_env_returns_only_what_was_set() {
        let env = MapEnv::new().with("PROSODY_GROUP_ID", "g");
        assert_eq!(env.get("PROSODY_GROUP_ID").as_deref(), Some("g"));
        assert_eq!(env.get("PROSODY_MOCK"), None);
    }

    #[test]
    fn process_env_reads_existing_variable() {
        // PATH is set in every environment tests run in; this only proves the plumbing.
        assert!(ProcessEnv.get("PATH").is_some());
        assert_eq!(ProcessEnv.get("PROSODY_SURELY_NOT_SET_BY_ANYONE"), None);
    }
}
