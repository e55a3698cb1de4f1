//! The consumer: a poll loop feeding an engine of per-partition key queues.

pub mod admission;
pub mod attachments;
pub mod cancel;
pub mod engine;
pub mod offsets;
pub mod partition;
pub mod partition_reader;
pub mod poll_loop;
pub mod topic_partition;
pub mod wakeup;
pub mod work;

pub use admission::{
    Admission, ChargeRunTime, Permit, PermitSlot, Request, SemaphoreAdmission, TaskClass,
    TimedGrant, admit, settle,
};
pub use attachments::{AttachmentOwner, Attachments};
pub use cancel::{CancelSignal, CancelWatch};
pub use engine::{Dispatch, Engine, EngineLimits, FlowControl, Load, Outcome, RevocationHook};
pub use topic_partition::TopicPartition;
