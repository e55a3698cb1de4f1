//! At-least-once across a crash: a consumer process killed with SIGKILL mid-stream never has
//! an offset committed beyond a record it did not handle, and a restarted consumer handles
//! everything that was left.
//!
//! The consumer runs in a child process: this test binary re-executed with the ignored
//! `child_consumer` test selected and its settings in the environment.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use async_trait::async_trait;
use common::harness::{self, Behaviour, Recorder};
use prosody::ProsodyClient;
use prosody::api::{EventContext, EventHandler, ExciseMessage, HandlerError, Message, Timer};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, TopicPartitionList};
use serde_json::Value;

const RECORDS: usize = 4_000;
const PARTITIONS: i32 = 2;

/// Records the child handles before its handlers stop returning: the kill then always lands
/// mid-stream, with handlers in flight, however fast the pipeline is.
const HANDLED_BEFORE_STALL: usize = RECORDS / 2;

/// Appends `partition offset` for every handled record and flushes, so the log survives
/// SIGKILL exactly up to the last handled record. After [`HANDLED_BEFORE_STALL`] records every
/// handler hangs, as a crashed dependency would.
struct LoggingHandler {
    log: parking_lot::Mutex<std::fs::File>,
    started: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl EventHandler for LoggingHandler {
    type Error = HandlerError;

    async fn on_message(
        &self,
        _: &dyn EventContext,
        message: &Message,
    ) -> Result<Value, HandlerError> {
        let started = self
            .started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if started >= HANDLED_BEFORE_STALL {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let mut log = self.log.lock();
        writeln!(log, "{} {}", message.partition.0, message.offset.0)
            .map_err(HandlerError::transient)?;
        log.flush().map_err(HandlerError::transient)?;
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        _: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as the child process of killed_consumer_never_commits_past_unhandled_records"]
async fn child_consumer() {
    let (Ok(topic), Ok(group), Ok(log)) = (
        std::env::var("CHILD_TOPIC"),
        std::env::var("CHILD_GROUP"),
        std::env::var("CHILD_LOG"),
    ) else {
        panic!("child_consumer is started by its parent test, not directly");
    };
    let client = ProsodyClient::from_options(harness::options(&topic, &group))
        .await
        .expect("client");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    client
        .subscribe(LoggingHandler {
            log: parking_lot::Mutex::new(file),
            started: std::sync::atomic::AtomicUsize::new(0),
        })
        .await
        .expect("subscribe");
    // Runs until the parent kills the process.
    std::future::pending::<()>().await;
}

fn handled_in(log: &str) -> BTreeSet<(i32, i64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (partition, offset) = line.split_once(' ')?;
            Some((partition.parse().ok()?, offset.parse().ok()?))
        })
        .collect()
}

fn committed_offsets(topic: &str, group: &str) -> HashMap<i32, i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::bootstrap_servers())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        list.add_partition(topic, partition);
    }
    consumer
        .committed_offsets(list, Duration::from_secs(10))
        .expect("committed offsets")
        .elements()
        .iter()
        .filter_map(|element| Some((element.partition(), element.offset().to_raw()?)))
        .filter(|(_, offset)| *offset >= 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_consumer_never_commits_past_unhandled_records() {
    let topic = common::unique_name("crash");
    let group = common::unique_name("crash_group");
    harness::create_topic(&topic, PARTITIONS).await;
    let producer =
        ProsodyClient::from_options(harness::options(&topic, &common::unique_name("producer")))
            .await
            .expect("producer");
    harness::produce(&producer, &topic, RECORDS, 40).await;

    let log_dir = tempfile::tempdir().expect("tempdir");
    let log = log_dir
        .path()
        .join("handled.log")
        .to_string_lossy()
        .into_owned();
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["child_consumer", "--ignored", "--exact", "--nocapture"])
        .env("CHILD_TOPIC", &topic)
        .env("CHILD_GROUP", &group)
        .env("CHILD_LOG", &log)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn child consumer");

    // Wait (bounded) until the child is mid-stream and has committed at least once.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let handled = handled_in(&log).len();
        if handled >= RECORDS / 3 && !committed_offsets(&topic, &group).is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "child handled only {handled} records"
        );
        assert!(
            child.try_wait().expect("child status").is_none(),
            "child exited early"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");

    let before_crash = handled_in(&log);
    assert!(before_crash.len() < RECORDS, "killed mid-stream");
    let committed = committed_offsets(&topic, &group);
    for (partition, committed) in &committed {
        for offset in 0..*committed {
            assert!(
                before_crash.contains(&(*partition, offset)),
                "partition {partition} committed {committed} but offset {offset} was never handled"
            );
        }
    }
    println!(
        "crash: {} handled before SIGKILL, committed {committed:?}",
        before_crash.len()
    );

    // A restarted consumer in the same group handles everything that was left.
    let recorder = Recorder::new();
    let restarted = ProsodyClient::from_options(harness::options(&topic, &group))
        .await
        .expect("client");
    restarted
        .subscribe(recorder.handler("restarted", Behaviour::default()))
        .await
        .expect("subscribe");
    let remaining = RECORDS
        - committed
            .values()
            .map(|offset| usize::try_from(*offset).unwrap())
            .sum::<usize>();
    recorder.wait_for(remaining, Duration::from_secs(120)).await;
    restarted.shutdown().await.expect("shutdown");
    let after: BTreeSet<(i32, i64)> = recorder
        .handled()
        .iter()
        .map(|event| (event.partition, event.offset))
        .collect();
    let all: BTreeSet<(i32, i64)> = before_crash.union(&after).copied().collect();
    assert_eq!(all.len(), RECORDS, "every record handled at least once");
    for (partition, committed) in &committed {
        assert!(
            after
                .iter()
                .filter(|(p, _)| p == partition)
                .all(|(_, offset)| offset >= committed),
            "the restarted consumer resumed at the committed offset of partition {partition}"
        );
    }
}
