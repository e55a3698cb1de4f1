//! Column families, one per concern, and the `RocksDB` options they are opened with.
//!
//! Separate families let each concern have its own settings (only the families whose values
//! expire run the expiry compaction filter) and keep a scan of one concern from stepping over
//! another's data. All of them share one block cache, so read memory has one bound.

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, Options};

use crate::options::RocksOptions;
use crate::ttl;

/// Timers by (partition, key, kind, time).
pub const TIMERS_BY_KEY: &str = "timers_by_key";
/// Timers by (partition, time, key, kind).
pub const TIMERS_BY_TIME: &str = "timers_by_time";
/// Deferred messages and timers.
pub const DEFER: &str = "defer";
/// Dedup records (expiring).
pub const DEDUP: &str = "dedup";
/// Keyed state (expiring).
pub const STATE: &str = "state";
/// Facts about the directory itself (the slab size it was created with).
pub const META: &str = "meta";

/// Every family but `default`, which stays empty.
const ALL: [&str; 6] = [TIMERS_BY_KEY, TIMERS_BY_TIME, DEFER, DEDUP, STATE, META];

/// Share of a memtable's budget given to its bloom filter, where it has one.
const MEMTABLE_BLOOM_RATIO: f64 = 0.1;

/// Families whose values start with an expiry header.
const EXPIRING: [&str; 2] = [DEDUP, STATE];

/// Options of the database as a whole.
pub fn db_options(options: &RocksOptions) -> Options {
    let mut db = Options::default();
    db.create_if_missing(true);
    db.create_missing_column_families(true);
    // One budget for all memtables: a flush is triggered when their sum reaches it.
    db.set_db_write_buffer_size(options.write_buffer_bytes());
    // A family written rarely would otherwise keep old WAL files alive indefinitely.
    db.set_max_total_wal_size(256 * 1024 * 1024);
    db.set_max_open_files(1024);
    db.set_keep_log_file_num(4);
    db.set_max_log_file_size(8 * 1024 * 1024);
    db.increase_parallelism(2);
    db
}

/// Descriptors of every family, sharing `cache`.
pub fn descriptors(options: &RocksOptions, cache: &Cache) -> Vec<ColumnFamilyDescriptor> {
    ALL.iter()
        .map(|&name| ColumnFamilyDescriptor::new(name, family_options(name, options, cache)))
        .collect()
}

fn family_options(name: &str, options: &RocksOptions, cache: &Cache) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    // Index and filter blocks count against the cache instead of growing outside it.
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    // Point reads (state values, dedup checks) skip files that cannot hold the key.
    table.set_bloom_filter(10.0, false);

    let mut family = Options::default();
    family.set_block_based_table_factory(&table);
    family.set_write_buffer_size(options.write_buffer_bytes() / 4);
    family.set_compression_type(DBCompressionType::Lz4);
    family.set_bottommost_compression_type(DBCompressionType::Zstd);
    if name == DEDUP {
        // Nearly every lookup is of a message not seen before: a bloom filter over the memtable's
        // keys answers those without searching its skip list.
        family.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
        family.set_memtable_whole_key_filtering(true);
    }
    if EXPIRING.contains(&name) {
        family.set_compaction_filter(
            "prosody-expiry",
            ttl::compaction_filter(options.clock().clone(), options.expiry_grace()),
        );
    }
    family
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prosody_api::ManualClock;
    use prosody_api::storage::{StateOp, StateScope, StateStore, StateWrite, Ttl};
    use serde_json::json;

    use super::*;
    use crate::keys::Cell;
    use crate::{RocksOptions, RocksStore};

    /// Compaction removes an entry only once it has been expired for the grace on the store's
    /// clock; until then it stays on disk (though reads already hide it).
    #[tokio::test]
    async fn compaction_drops_expired_state_only_after_the_grace() {
        let clock = ManualClock::new();
        let grace = Duration::from_secs(60);
        let store = RocksStore::open_temporary(
            &RocksOptions::new()
                .with_clock(clock.clone())
                .with_sync_writes(false)
                .with_expiry_grace(grace),
        )
        .unwrap();
        let scope = StateScope::group("g", "c");
        let put = |key: &str, ttl| {
            StateWrite::new(
                scope.clone(),
                key,
                StateOp::PutValue {
                    value: json!(key),
                    ttl,
                },
            )
        };
        store
            .apply(&[put("short", Ttl::from_secs(10)), put("forever", None)])
            .await
            .unwrap();
        let stored = |key: &str| {
            let db = &store.inner.db;
            let family = db.cf_handle(STATE).unwrap();
            db.get_cf(family, Cell::new(&scope, &key.into()).value())
                .unwrap()
                .is_some()
        };
        let compact = || {
            let db = &store.inner.db;
            let family = db.cf_handle(STATE).unwrap();
            db.flush_cf(family).unwrap();
            db.compact_range_cf(family, None::<&[u8]>, None::<&[u8]>);
        };

        clock.advance(Duration::from_secs(10));
        assert_eq!(
            store.get_value(&scope, &"short".into()).await.unwrap(),
            None
        );
        compact();
        assert!(stored("short"), "expired less than the grace ago: kept");

        clock.advance(grace);
        compact();
        assert!(!stored("short"), "expired for the grace: removed");
        assert!(stored("forever"));
    }
}
