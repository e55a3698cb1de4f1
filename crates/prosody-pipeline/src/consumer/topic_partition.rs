//! The identity of an assigned partition.

use std::fmt;

use prosody_api::{Partition, Topic};

/// A topic and one of its partitions: the unit Kafka assigns, pauses and commits.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic.
    pub topic: Topic,
    /// The partition within the topic.
    pub partition: Partition,
}

impl TopicPartition {
    /// A topic-partition from its parts.
    pub fn new(topic: impl Into<Topic>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition: Partition(partition),
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}
