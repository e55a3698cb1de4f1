//! Storage backend on Apache Cassandra through the scylla driver.
