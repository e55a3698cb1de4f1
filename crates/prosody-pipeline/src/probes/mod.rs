//! Health probes: an HTTP server that tells an orchestrator whether this consumer is ready
//! (`/readyz`: it owns at least one partition) and alive (`/livez`: no partition with work has
//! gone without progress for the stall threshold).
//!
//! The consumer feeds a [`HealthRegistry`]: it registers partitions on assignment, reports work
//! and progress on each partition's [`PartitionHealth`] handle, and removes them on revocation.
//! The same registry answers the client's `is_stalled()` and `assigned_partition_count()`, so
//! the probes and the API can never disagree.
//!
//! ```no_run
//! # async fn demo() -> Result<(), prosody_pipeline::probes::ProbeError> {
//! use prosody_pipeline::probes::{HealthRegistry, ProbeConfig, ProbeServer};
//!
//! let registry = HealthRegistry::new();
//! let server = ProbeServer::start(&ProbeConfig::default(), registry.clone()).await?;
//!
//! let partition = registry.partition_assigned("orders", 0);
//! partition.work_pending(); // a record was queued
//! partition.progress(); // a record was handled
//! partition.idle(); // nothing left to do
//!
//! if let Some(server) = server {
//!     server.stop().await;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Responses are short JSON documents that say why, for example
//! `{"status":"stalled","assigned_partitions":8,"busy_partitions":1,"stall_threshold_ms":300000,
//! "stalled_count":1,"partitions":[{"topic":"orders","partition":3,"ms_since_progress":301200}]}`.

mod server;
mod tracker;

pub use server::{
    DEFAULT_PROBE_PORT, DEFAULT_STALL_THRESHOLD, ProbeConfig, ProbeError, ProbeServer,
};
pub use tracker::{
    Clock, HealthRegistry, ManualClock, PartitionHealth, PartitionStatus, SystemClock,
};

#[cfg(test)]
mod tests;
