//! The message loader against the real Kafka broker: it reloads records by offset, forward
//! (reading through a small gap) and backward (seeking), and says why when it cannot.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code states its expectations"
)]

mod common;

use std::time::Duration;

use prosody_api::{Offset, Partition, Topic};
use prosody_pipeline::Event;
use prosody_pipeline::kafka::loader::{LoadError, LoaderSettings, MessageLoader};
use prosody_pipeline::kafka::{AdminClient, DecodeLimits, Producer, ProducerConfig};
use serde_json::json;

use common::{bootstrap_servers, unique_topic};

fn seq(event: &Event) -> u64 {
    let Event::Message(message) = event else {
        panic!("a message: {event:?}");
    };
    message.payload["seq"].as_u64().expect("seq")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_records_by_offset_forward_and_backward_and_times_out_past_the_end() {
    let bootstrap = bootstrap_servers();
    let admin = AdminClient::new(&bootstrap).expect("admin");
    let topic = unique_topic("loader");
    admin.create_topic(&topic, 1, 1).await.expect("create");
    let mut config = ProducerConfig::new(bootstrap.as_str(), "loader-test");
    config.send_timeout = Duration::from_secs(30);
    let producer = Producer::new(&config).expect("producer");
    for seq in 0..50_u64 {
        let delivery = producer
            .send(&topic, &format!("k{}", seq % 3), &json!({ "seq": seq }))
            .await
            .expect("send");
        assert_eq!(delivery.offset, Offset(i64::try_from(seq).unwrap()));
    }
    let loader = MessageLoader::new(LoaderSettings {
        bootstrap_servers: bootstrap.clone(),
        client_id: "loader-test".to_owned(),
        cache_size: 4,
        seek_timeout: Duration::from_secs(20),
        discard_threshold: 5,
        decode: DecodeLimits::default(),
        overrides: Vec::new(),
    })
    .expect("loader");
    assert!(
        !loader.is_started(),
        "nothing starts before a record is asked for"
    );
    let topic_id = Topic::from(topic.as_str());
    let load = |offset: i64| {
        let loader = loader.clone();
        let topic = topic_id.clone();
        async move { loader.load(&topic, Partition(0), Offset(offset)).await }
    };
    // A seek, a read through a gap of 3, a jump past the threshold, a seek backward, and the
    // cache for a repeat.
    for offset in [10, 14, 40, 2, 2, 49] {
        let event = load(offset).await.expect("loads");
        assert_eq!(seq(&event), u64::try_from(offset).unwrap());
        assert_eq!(event.offset(), Some(Offset(offset)));
        assert_eq!(event.key().as_str(), format!("k{}", offset % 3));
    }
    assert!(loader.is_started());

    let short = MessageLoader::new(LoaderSettings {
        bootstrap_servers: bootstrap,
        client_id: "loader-test-short".to_owned(),
        cache_size: 4,
        seek_timeout: Duration::from_millis(500),
        discard_threshold: 0,
        decode: DecodeLimits::default(),
        overrides: Vec::new(),
    })
    .expect("loader");
    let missing = short.load(&topic_id, Partition(0), Offset(500)).await;
    assert!(
        matches!(missing, Err(LoadError::Timeout { .. })),
        "{missing:?}"
    );
    assert!(!missing.unwrap_err().is_permanent());
    admin.delete_topic(&topic).await.expect("delete topic");
}
