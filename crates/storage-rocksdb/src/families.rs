//! Column families, one per concern, and the `RocksDB` options they are opened with.
//!
//! Separate families let each concern have its own settings (only the families whose values
//! expire run the expiry compaction filter) and keep a scan of one concern from stepping over
//! another's data. All of them share one block cache, so read memory has one bound.

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, Options,
};

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
    if EXPIRING.contains(&name) {
        family.set_compaction_filter(
            "prosody-expiry",
            ttl::compaction_filter(options.clock().clone(), options.expiry_grace()),
        );
    }
    family
}
