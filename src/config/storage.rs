//! Which storage backend a client gets.
//!
//! The rules, in order:
//! 1. An explicit `storageBackend` wins, if it is complete: `cassandra` needs `cassandraNodes`;
//!    `rocksdb` needs `stateCacheDir`, because an embedded store in a temporary directory that
//!    is removed on shutdown would not be durable, which is the only reason to choose it.
//! 2. `mock: true` implies memory; an explicit non-memory backend with it is rejected rather
//!    than silently ignored or half-honoured.
//! 3. Otherwise configured `cassandraNodes` select Cassandra (with the `RocksDB` state cache).
//! 4. Otherwise there is no sensible default: memory would quietly lose timers and deferred
//!    work on restart, so construction fails and names the options that would fix it.

use std::path::PathBuf;

use super::error::ConfigError;
use super::fields;
use super::kinds::StorageBackend;
use super::resolver::{Given, Resolver};

/// Settings the choice depends on, already resolved.
pub(crate) struct Inputs<'a> {
    pub(crate) mock: bool,
    pub(crate) has_cassandra_nodes: bool,
    pub(crate) cache_dir: Option<&'a PathBuf>,
}

/// Applies the module's rules to the explicit choice, if any.
pub(crate) fn select(
    resolver: &Resolver<'_>,
    option: Option<StorageBackend>,
    inputs: &Inputs<'_>,
) -> Result<StorageBackend, ConfigError> {
    let explicit: Option<Given<StorageBackend>> =
        resolver.get(fields::STORAGE_BACKEND, option, str::parse)?;
    let Some(explicit) = explicit else {
        return if inputs.mock {
            Ok(StorageBackend::Memory)
        } else if inputs.has_cassandra_nodes {
            Ok(StorageBackend::Cassandra)
        } else {
            Err(ConfigError::Missing {
                field: fields::STORAGE_BACKEND.full(),
                reason: "no storage configured; set cassandraNodes (PROSODY_CASSANDRA_NODES) \
                         for Cassandra, storageBackend \"rocksdb\" with stateCacheDir for an \
                         embedded durable store, storageBackend \"memory\" for a non-durable \
                         one, or mock: true"
                    .to_owned(),
            })
        };
    };
    match explicit.value {
        StorageBackend::Memory => Ok(StorageBackend::Memory),
        _ if inputs.mock => Err(explicit.invalid(
            "must be \"memory\" or unset when mock is true (mock mode keeps everything in memory)",
        )),
        StorageBackend::Cassandra if !inputs.has_cassandra_nodes => Err(ConfigError::Missing {
            field: fields::CASSANDRA_NODES.full(),
            reason: "required when storageBackend is \"cassandra\"".to_owned(),
        }),
        StorageBackend::RocksDb if inputs.cache_dir.is_none() => Err(ConfigError::Missing {
            field: fields::STATE_CACHE_DIR.full(),
            reason: "required when storageBackend is \"rocksdb\" (a temporary directory would \
                     not survive a restart)"
                .to_owned(),
        }),
        chosen => Ok(chosen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::MapEnv;

    fn pick(
        env: &MapEnv,
        option: Option<StorageBackend>,
        mock: bool,
        nodes: bool,
        dir: bool,
    ) -> Result<StorageBackend, ConfigError> {
        let path = PathBuf::from("/var/lib/prosody");
        let inputs = Inputs {
            mock,
            has_cassandra_nodes: nodes,
            cache_dir: dir.then_some(&path),
        };
        select(&Resolver::new(env), option, &inputs)
    }

    #[test]
    fn defaults() {
        let env = MapEnv::new();
        assert_eq!(
            pick(&env, None, true, false, false),
            Ok(StorageBackend::Memory)
        );
        assert_eq!(
            pick(&env, None, true, true, false),
            Ok(StorageBackend::Memory)
        );
        assert_eq!(
            pick(&env, None, false, true, false),
            Ok(StorageBackend::Cassandra)
        );
        let error = pick(&env, None, false, false, false).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("storageBackend (PROSODY_STORAGE_BACKEND): ")
        );
        assert!(error.to_string().contains("cassandraNodes"));
    }

    #[test]
    fn explicit_choices() {
        use StorageBackend::{Cassandra, Memory, RocksDb};
        let env = MapEnv::new();
        assert_eq!(pick(&env, Some(Memory), false, true, false), Ok(Memory));
        assert_eq!(pick(&env, Some(RocksDb), false, true, true), Ok(RocksDb));
        assert_eq!(
            pick(&env, Some(Cassandra), false, true, false),
            Ok(Cassandra)
        );
        let error = pick(&env, Some(Cassandra), false, false, false).unwrap_err();
        assert_eq!(error.option(), Some("cassandraNodes"));
        let error = pick(&env, Some(RocksDb), false, false, false).unwrap_err();
        assert_eq!(error.option(), Some("stateCacheDir"));
        let error = pick(&env, Some(RocksDb), true, false, true).unwrap_err();
        assert_eq!(
            error.to_string(),
            "storageBackend: must be \"memory\" or unset when mock is true (mock mode keeps \
             everything in memory), got \"rocksdb\""
        );
    }

    #[test]
    fn env_choice_is_named_by_variable() {
        let env = MapEnv::new().with("PROSODY_STORAGE_BACKEND", "redis");
        let error = pick(&env, None, false, true, false).unwrap_err();
        assert_eq!(
            error.to_string(),
            "storageBackend (PROSODY_STORAGE_BACKEND): must be one of \"memory\", \"rocksdb\", \
             \"cassandra\", got \"redis\""
        );
    }
}
