//! Durable deduplication records.

use std::borrow::Cow;
use std::fmt::Debug;

use async_trait::async_trait;

use super::{PartitionScope, Ttl};
use crate::digest::Digester;
use crate::error::StorageError;
use crate::key::Key;

/// A processed message's identity: its key, its payload `id` and the client's
/// `idempotenceVersion`. Bumping the version makes every earlier record irrelevant.
///
/// Built once per message and read by several parties (the pipeline's recent set, the store),
/// so it carries its [`fingerprint`](Self::fingerprint), computed once at construction. The
/// key, the `id` and the version may be borrowed (from the message, its payload and the
/// subscription, for as long as the message is handled: [`DedupRecord::borrowing`]), so
/// building one per message copies none of them; [`DedupRecord::into_owned`] detaches it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DedupRecord<'a> {
    /// Borrowed from the message on the hot path: a key's clone moves the reference count of
    /// its shared string, two locked instructions per message.
    key: Cow<'a, Key>,
    id: Cow<'a, str>,
    /// Borrowed like `id`: it is the same for every record a subscription makes, and a copy
    /// per handled message was an allocation on the hot path (a shared `Arc` instead moved its
    /// reference count between the cores handling messages, twice per message).
    version: Cow<'a, str>,
    fingerprint: u128,
}

impl<'a> DedupRecord<'a> {
    /// A record from its parts.
    pub fn new(
        key: impl Into<Key>,
        id: impl Into<Cow<'a, str>>,
        version: impl Into<Cow<'a, str>>,
    ) -> Self {
        Self::from_parts(Cow::Owned(key.into()), id.into(), version.into())
    }

    /// A record of `key`, borrowed for as long as the record lives (the message's own key while
    /// the message is handled).
    pub fn borrowing(
        key: &'a Key,
        id: impl Into<Cow<'a, str>>,
        version: impl Into<Cow<'a, str>>,
    ) -> Self {
        Self::from_parts(Cow::Borrowed(key), id.into(), version.into())
    }

    fn from_parts(key: Cow<'a, Key>, id: Cow<'a, str>, version: Cow<'a, str>) -> Self {
        let fingerprint = Digester::shared().digest((key.as_str(), &*id, &*version));
        Self {
            key,
            id,
            version,
            fingerprint,
        }
    }

    /// The same record owning its `id`, to keep beyond the message it was built from.
    #[must_use]
    pub fn into_owned(self) -> DedupRecord<'static> {
        DedupRecord {
            key: Cow::Owned(self.key.into_owned()),
            id: Cow::Owned(self.id.into_owned()),
            version: Cow::Owned(self.version.into_owned()),
            fingerprint: self.fingerprint,
        }
    }

    /// The message key.
    #[must_use]
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The payload's `id` field.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The idempotence version.
    #[must_use]
    pub fn version(&self) -> &str {
        &self.version
    }

    /// A 128-bit digest of (key, id, version) under [`Digester::shared`]: equal records have
    /// equal fingerprints, and different ones differ but with negligible probability. Keys are
    /// random per process, so a fingerprint is for in-process sets only, never for storage.
    #[must_use]
    pub fn fingerprint(&self) -> u128 {
        self.fingerprint
    }
}

/// Where a store's answers come from, which decides whether remembering them in front of the
/// store pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupCost {
    /// From the process's own memory, as cheap as any cache in front of it would be: such a
    /// cache only adds a second lookup and a second insert to every message.
    InProcess,
    /// From disk or over the network.
    Io,
}

/// A [`DedupStore`] whose operations never wait (it answers from its own memory): the same
/// operations without a future, so the pipeline's hot path neither allocates nor polls one per
/// message. Its answers are exactly those of the store's `insert` and `contains`.
pub trait ImmediateDedupStore: Send + Sync {
    /// [`DedupStore::insert`], done before returning.
    ///
    /// # Errors
    /// As for `insert`.
    fn insert_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError>;

    /// [`DedupStore::contains`], answered before returning.
    ///
    /// # Errors
    /// As for `contains`.
    fn contains_now(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError>;
}

/// The durable tier of deduplication: which messages a partition has already handled.
///
/// Records are identified by (scope, key, id, version), all four compared exactly. A record
/// exists from a successful `insert` until its TTL elapses on the store's clock.
#[async_trait]
pub trait DedupStore: Send + Sync + Debug {
    /// Where the answers come from. A store that does no I/O says [`LookupCost::InProcess`], and
    /// the pipeline then asks it directly instead of keeping recent answers of its own.
    fn lookup_cost(&self) -> LookupCost {
        LookupCost::Io
    }

    /// The store as an [`ImmediateDedupStore`] when its operations never wait; `None` (the
    /// default) when they must be awaited.
    fn immediate(&self) -> Option<&dyn ImmediateDedupStore> {
        None
    }

    /// Records the message as handled for `ttl` from now. Re-inserting an existing record
    /// restarts its TTL (the latest insert wins), which is idempotent for retries.
    async fn insert(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
        ttl: Ttl,
    ) -> Result<(), StorageError>;

    /// True when the record was inserted and has not expired. A `contains` concurrent with an
    /// `insert` of the same record may answer either way.
    async fn contains(
        &self,
        scope: &PartitionScope,
        record: &DedupRecord<'_>,
    ) -> Result<bool, StorageError>;
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_record_borrowing_its_key_is_the_record_owning_it() {
        let key = Key::from("order-7");
        let borrowed = DedupRecord::borrowing(&key, "id-1", "v1");
        let owned = DedupRecord::new("order-7", "id-1", "v1");
        assert_eq!(borrowed, owned);
        assert_eq!(borrowed.fingerprint(), owned.fingerprint());
        assert_eq!(borrowed.key(), &key);
        let detached = borrowed.clone().into_owned();
        assert_eq!(detached, owned);
        let set: HashSet<DedupRecord<'_>> = [owned].into_iter().collect();
        assert!(
            set.contains(&borrowed),
            "hashes the same as the owning record"
        );
        assert_ne!(
            DedupRecord::borrowing(&Key::from("order-8"), "id-1", "v1").fingerprint(),
            borrowed.fingerprint()
        );
    }
}
