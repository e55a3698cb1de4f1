//! Picks each setting's value by precedence (option, then environment, then default) and
//! remembers where it came from, so that a later check can name the exact source in its error.

use std::path::PathBuf;
use std::time::Duration;

use super::env::EnvSource;
use super::error::{ConfigError, FieldRef};
use super::fields::Field;
use super::value::{self, ProbePort, ReadCache, Secret, Unit};

/// What a count of things accepts.
pub(crate) const AT_LEAST_ONE: &str = "must be an integer >= 1";

/// Where a resolved value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    Option,
    /// The raw variable text, quoted back in errors exactly as the user wrote it.
    Env(String),
    Default,
}

/// Renders an option value for the "got ..." part of an error.
pub(crate) trait Show {
    fn show(&self) -> String;
}

macro_rules! show_with_display {
    ($($ty:ty),+) => {$(
        impl Show for $ty {
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )+};
}

show_with_display!(bool, u16, u32, u64, usize, f64);

macro_rules! show_quoted {
    ($($ty:ty),+) => {$(
        impl Show for $ty {
            fn show(&self) -> String {
                format!("\"{self}\"")
            }
        }
    )+};
}

show_quoted!(
    super::kinds::Mode,
    super::kinds::SpanRelation,
    super::kinds::StorageBackend
);

impl Show for String {
    fn show(&self) -> String {
        format!("{self:?}")
    }
}

impl Show for Vec<String> {
    fn show(&self) -> String {
        format!("{self:?}")
    }
}

impl Show for PathBuf {
    fn show(&self) -> String {
        format!("{:?}", self.display().to_string())
    }
}

impl Show for Duration {
    fn show(&self) -> String {
        value::show_duration(*self)
    }
}

impl Show for Secret {
    fn show(&self) -> String {
        "<redacted>".to_owned()
    }
}

impl Show for ProbePort {
    fn show(&self) -> String {
        match self {
            Self::Disabled => "none".to_owned(),
            Self::Port(port) => port.to_string(),
        }
    }
}

impl Show for ReadCache {
    fn show(&self) -> String {
        match self {
            Self::Disabled => "none".to_owned(),
            Self::Default => "true".to_owned(),
            Self::Ttl(ttl) => value::show_duration(*ttl),
        }
    }
}

/// A value with its setting and origin, ready to be checked.
#[derive(Debug, Clone)]
pub(crate) struct Given<T> {
    pub(crate) field: Field,
    pub(crate) value: T,
    pub(crate) origin: Origin,
}

impl<T: Show> Given<T> {
    /// The setting named as its origin warrants: with the variable only if it came from there.
    pub(crate) fn field_ref(&self) -> FieldRef {
        match self.origin {
            Origin::Env(_) => self.field.full(),
            Origin::Option | Origin::Default => self.field.option_ref(),
        }
    }

    /// What to quote back as the rejected value.
    fn got(&self) -> String {
        match &self.origin {
            Origin::Env(raw) => format!("{raw:?}"),
            Origin::Option | Origin::Default => self.value.show(),
        }
    }

    /// An error saying this value is not what the setting accepts.
    pub(crate) fn invalid(&self, expected: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            field: self.field_ref(),
            expected: expected.into(),
            got: self.got(),
        }
    }

    /// An error saying this value does not fit with another setting.
    pub(crate) fn conflict(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::Conflict {
            field: self.field_ref(),
            reason: reason.into(),
        }
    }

    /// Keeps the value if `ok` holds, else fails with `expected`.
    pub(crate) fn ensure(
        self,
        ok: impl FnOnce(&T) -> bool,
        expected: &str,
    ) -> Result<Self, ConfigError> {
        if ok(&self.value) {
            Ok(self)
        } else {
            Err(self.invalid(expected))
        }
    }

    /// Keeps the value if `check` passes, else fails with the message `check` returns.
    pub(crate) fn validate(
        self,
        check: impl FnOnce(&T) -> Result<(), String>,
    ) -> Result<Self, ConfigError> {
        match check(&self.value) {
            Ok(()) => Ok(self),
            Err(expected) => Err(self.invalid(expected)),
        }
    }

    /// Converts the value, failing with the converter's message.
    pub(crate) fn try_map<U>(
        self,
        convert: impl FnOnce(&T) -> Result<U, String>,
    ) -> Result<U, ConfigError> {
        convert(&self.value).map_err(|expected| self.invalid(expected))
    }

    /// Whether the user set this value (as an option or in the environment).
    pub(crate) fn is_set(&self) -> bool {
        !matches!(self.origin, Origin::Default)
    }
}

/// Resolves settings against one environment.
pub(crate) struct Resolver<'e> {
    env: &'e dyn EnvSource,
}

impl<'e> Resolver<'e> {
    pub(crate) fn new(env: &'e dyn EnvSource) -> Self {
        Self { env }
    }

    /// The setting's variable, if it has one and it is set to something other than blanks.
    ///
    /// Blank counts as unset because deployment templates commonly render an unused variable as
    /// `NAME=`; treating that as "the empty string" would turn a harmless gap into an error.
    fn env_text(&self, field: Field) -> Option<String> {
        let name = field.env?;
        self.env.get(name).filter(|text| !text.trim().is_empty())
    }

    /// The option if given, else the variable parsed by `parse`, else `None`.
    pub(crate) fn get<T>(
        &self,
        field: Field,
        option: Option<T>,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<Given<T>>, ConfigError> {
        if let Some(value) = option {
            return Ok(Some(Given {
                field,
                value,
                origin: Origin::Option,
            }));
        }
        let Some(raw) = self.env_text(field) else {
            return Ok(None);
        };
        match parse(&raw) {
            Ok(value) => Ok(Some(Given {
                field,
                value,
                origin: Origin::Env(raw),
            })),
            Err(expected) => Err(ConfigError::Invalid {
                field: field.full(),
                expected,
                got: format!("{raw:?}"),
            }),
        }
    }

    /// Like [`get`](Self::get), falling back to `default`.
    pub(crate) fn get_or<T>(
        &self,
        field: Field,
        option: Option<T>,
        parse: impl FnOnce(&str) -> Result<T, String>,
        default: T,
    ) -> Result<Given<T>, ConfigError> {
        Ok(self.get(field, option, parse)?.unwrap_or(Given {
            field,
            value: default,
            origin: Origin::Default,
        }))
    }

    /// A free-form string; `None` when unset. Given strings must not be blank.
    pub(crate) fn text(
        &self,
        field: Field,
        option: Option<String>,
    ) -> Result<Option<Given<String>>, ConfigError> {
        self.get(field, option, |raw| Ok(raw.trim().to_owned()))?
            .map(|given| given.ensure(|text| !text.trim().is_empty(), "must not be empty"))
            .transpose()
    }

    /// A boolean with a default.
    pub(crate) fn flag(
        &self,
        field: Field,
        option: Option<bool>,
        default: bool,
    ) -> Result<bool, ConfigError> {
        Ok(self
            .get_or(field, option, value::parse_bool, default)?
            .value)
    }

    /// A list with a default of empty.
    pub(crate) fn list(
        &self,
        field: Field,
        option: Option<Vec<String>>,
    ) -> Result<Given<Vec<String>>, ConfigError> {
        self.get_or(field, option, |raw| Ok(value::split_list(raw)), Vec::new())
    }

    /// An unsigned integer with a default.
    pub(crate) fn integer<T>(
        &self,
        field: Field,
        option: Option<T>,
        default: T,
    ) -> Result<Given<T>, ConfigError>
    where
        T: std::str::FromStr,
    {
        self.get_or(
            field,
            option,
            |raw| {
                raw.trim()
                    .parse()
                    .map_err(|_| "must be a non-negative integer".to_owned())
            },
            default,
        )
    }

    /// A count that must be at least one, with a default; zero is rejected by the caller with
    /// the same message a malformed count gets here.
    pub(crate) fn count(
        &self,
        field: Field,
        option: Option<usize>,
        default: usize,
    ) -> Result<Given<usize>, ConfigError> {
        self.get_or(
            field,
            option,
            |raw| raw.trim().parse().map_err(|_| AT_LEAST_ONE.to_owned()),
            default,
        )
    }

    /// A number with a default; text must parse as a finite number.
    pub(crate) fn number(
        &self,
        field: Field,
        option: Option<f64>,
        default: f64,
    ) -> Result<Given<f64>, ConfigError> {
        self.get_or(
            field,
            option,
            |raw| match raw.trim().parse::<f64>() {
                Ok(number) if number.is_finite() => Ok(number),
                _ => Err("must be a number".to_owned()),
            },
            default,
        )
    }

    /// A duration with a default; bare integers in the environment count `unit`s.
    pub(crate) fn duration(
        &self,
        field: Field,
        option: Option<Duration>,
        unit: Unit,
        default: Duration,
    ) -> Result<Given<Duration>, ConfigError> {
        self.get_or(
            field,
            option,
            |raw| value::parse_duration(raw, unit),
            default,
        )
    }

    /// A choice parsed by its `FromStr`, with a default.
    pub(crate) fn choice<T>(
        &self,
        field: Field,
        option: Option<T>,
        default: T,
    ) -> Result<Given<T>, ConfigError>
    where
        T: std::str::FromStr<Err = String>,
    {
        self.get_or(field, option, str::parse, default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::MapEnv;
    use crate::config::fields;

    #[test]
    fn option_beats_env_beats_default() {
        let env = MapEnv::new().with("PROSODY_MAX_RETRIES", "7");
        let resolver = Resolver::new(&env);
        let given = resolver
            .integer(fields::MAX_RETRIES, Some(2_u32), 3)
            .unwrap();
        assert_eq!((given.value, given.origin), (2, Origin::Option));
        let given = resolver.integer(fields::MAX_RETRIES, None, 3_u32).unwrap();
        assert_eq!(
            (given.value, given.origin),
            (7, Origin::Env("7".to_owned()))
        );
        let empty = MapEnv::new();
        let given = Resolver::new(&empty)
            .integer(fields::MAX_RETRIES, None, 3_u32)
            .unwrap();
        assert_eq!((given.value, given.origin), (3, Origin::Default));
    }

    #[test]
    fn blank_env_counts_as_unset() {
        let env = MapEnv::new().with("PROSODY_MAX_RETRIES", "  ");
        let given = Resolver::new(&env)
            .integer(fields::MAX_RETRIES, None, 3_u32)
            .unwrap();
        assert_eq!(given.origin, Origin::Default);
    }

    #[test]
    fn env_error_quotes_raw_text_and_names_variable() {
        let env = MapEnv::new().with("PROSODY_MAX_RETRIES", "many");
        let error = Resolver::new(&env)
            .integer(fields::MAX_RETRIES, None, 3_u32)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "maxRetries (PROSODY_MAX_RETRIES): must be a non-negative integer, got \"many\""
        );
    }
}
