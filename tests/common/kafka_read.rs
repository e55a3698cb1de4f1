//! Reading Kafka directly, beside the client: what reached a topic (with headers) and what a
//! group committed. The failure-handling suites assert on both.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// One record as read back.
#[derive(Clone, Debug)]
pub struct Record {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Raw key.
    pub key: Option<Vec<u8>>,
    /// Raw value.
    pub value: Option<Vec<u8>>,
    /// Headers as text (lossy).
    pub headers: HashMap<String, String>,
}

impl Record {
    /// The value parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.value.as_deref().expect("a value")).expect("JSON value")
    }

    /// A header's text.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("header {name} missing in {:?}", self.headers))
    }
}

fn consumer(group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", super::bootstrap_servers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader consumer")
}

/// The end offset of every partition of `topic` (`partitions` of them).
pub fn end_offsets(topic: &str, partitions: i32) -> Vec<i64> {
    let consumer = consumer("prosody-test-reader");
    (0..partitions)
        .map(|partition| {
            consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(30))
                .expect("watermarks")
                .1
        })
        .collect()
}

/// Every record of `topic` (`partitions` partitions) up to its current end, in partition
/// then offset order.
pub fn read_all(topic: &str, partitions: i32) -> Vec<Record> {
    let ends = end_offsets(topic, partitions);
    let expected: i64 = ends.iter().sum();
    let consumer = consumer("prosody-test-reader");
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        list.add_partition_offset(topic, partition, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&list).expect("assign");
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while i64::try_from(records.len()).expect("count") < expected {
        assert!(
            Instant::now() < deadline,
            "read {} of {expected}",
            records.len()
        );
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.expect("record");
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|header| {
                        (
                            header.key.to_owned(),
                            String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        records.push(Record {
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
        });
    }
    records.sort_by_key(|record| (record.partition, record.offset));
    records
}

/// The offset `group` committed for each partition of `topic` (`-1` for none).
pub fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer = consumer(group);
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        list.add_partition(topic, partition);
    }
    // The group coordinator moves while groups come and go (NOT_COORDINATOR, coordinator
    // loading): ask again until it answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    let committed = loop {
        match consumer.committed_offsets(list.clone(), Duration::from_secs(30)) {
            Ok(committed) => break committed,
            Err(error) if Instant::now() < deadline => {
                eprintln!("committed offsets of {group}: {error}; asking again");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => panic!("committed offsets of {group}: {error}"),
        }
    };
    (0..partitions)
        .map(|partition| {
            match committed
                .find_partition(topic, partition)
                .expect("partition")
                .offset()
            {
                Offset::Offset(offset) => offset,
                _ => -1,
            }
        })
        .collect()
}

/// Waits (at most `within`) until `group` committed `offsets` on `topic`.
pub async fn until_committed(group: &str, topic: &str, offsets: &[i64], within: Duration) {
    let partitions = i32::try_from(offsets.len()).expect("partitions");
    let deadline = Instant::now() + within;
    loop {
        let now = tokio::task::block_in_place(|| committed(group, topic, partitions));
        if now == offsets {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{group} committed {now:?} on {topic}, expected {offsets:?}"
        );
        // Commits happen on the client's commit interval; polling the broker is the only way
        // to observe them from outside.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
