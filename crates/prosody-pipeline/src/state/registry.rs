//! The durable identity of collections: a later client (or a restart) that registers a name
//! with another kind or payload would read data of one shape as another, so the first
//! registration of a name is stored and every later one must agree.

use prosody_api::storage::{StateOp, StateScope, StateStore, StateWrite};
use prosody_api::{ClassifyError, ConsumerGroup, ErrorClass, Key, StorageError};

use super::definition::{Collection, Identity, RESERVED_PREFIX};

/// The registry's cell: one value per collection name, under the group.
fn registry_scope(group: &ConsumerGroup) -> StateScope {
    StateScope::group(group.clone(), format!("{RESERVED_PREFIX}_collections"))
}

/// Registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The name is stored with another identity. Permanent.
    #[error(
        "keyed-state collection `{name}` is registered durably as a {registered}, not a \
         {requested}; use another name for a collection of another kind or payload"
    )]
    Mismatch {
        /// Collection name.
        name: String,
        /// The stored identity.
        registered: Identity,
        /// The identity this client asked for.
        requested: Identity,
    },
    /// The stored identity cannot be read. Permanent.
    #[error("the stored identity of keyed-state collection `{name}` is unreadable: {detail}")]
    Corrupt {
        /// Collection name.
        name: String,
        /// The decoding error.
        detail: String,
    },
    /// The store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl ClassifyError for RegistryError {
    fn error_class(&self) -> ErrorClass {
        match self {
            Self::Mismatch { .. } | Self::Corrupt { .. } => ErrorClass::Permanent,
            Self::Storage(error) => error.error_class(),
        }
    }
}

/// Stores the identity of each collection not yet registered, and checks the others.
///
/// # Errors
/// [`RegistryError::Mismatch`] for a name stored with another identity.
pub async fn register(
    store: &dyn StateStore,
    group: &ConsumerGroup,
    collections: &[std::sync::Arc<Collection>],
) -> Result<(), RegistryError> {
    let scope = registry_scope(group);
    let mut writes = Vec::new();
    for collection in collections {
        let key = Key::new(collection.name.clone());
        match store.get_value(&scope, &key).await? {
            Some(stored) => {
                let registered: Identity =
                    serde_json::from_value(stored).map_err(|error| RegistryError::Corrupt {
                        name: collection.name.clone(),
                        detail: error.to_string(),
                    })?;
                if registered != collection.identity {
                    return Err(RegistryError::Mismatch {
                        name: collection.name.clone(),
                        registered,
                        requested: collection.identity,
                    });
                }
            }
            None => writes.push(StateWrite::new(
                scope.clone(),
                key,
                StateOp::PutValue {
                    value: serde_json::to_value(collection.identity).map_err(|error| {
                        StorageError::backend("state.register", error.to_string())
                    })?,
                    ttl: None,
                },
            )),
        }
    }
    Ok(store.apply(&writes).await?)
}
