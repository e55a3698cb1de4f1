//! Types and traits shared by every Prosody crate: records, the handler contract, error
//! classification and the storage traits. No Kafka client and no database driver live here.
