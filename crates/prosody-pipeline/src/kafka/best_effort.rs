//! A producer for records nobody waits for, such as lifecycle events: a send hands the record
//! to librdkafka and returns, and a record that is not delivered is counted, not reported to
//! its sender.
//!
//! [`Producer`](super::Producer) is built for records that must not be lost: idempotence,
//! `acks=all`, a delivery future and a timeout per record, trace headers. For a record per
//! handler stage that is most of the cost of sending it, and the consumer pays it on the same
//! cores as its handlers. Here a send is one `rd_kafka_producev` call; records wait up to
//! [`BestEffortSettings::linger`] to travel in large batches, and librdkafka reports only
//! failures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer,
};
use rdkafka::util::Timeout;
use tracing::warn;

use super::producer::{ProducerConfig, ProducerError};

/// How a [`BestEffortProducer`] batches, gives up and says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BestEffortSettings {
    /// How long a record may wait for others to fill its batch.
    pub linger: Duration,
    /// How long librdkafka keeps trying to deliver a record before counting it as failed.
    pub delivery_timeout: Duration,
    /// Ends the warning logged when records are not delivered: what the records were and what
    /// to check.
    pub failure_hint: &'static str,
    /// librdkafka's `compression.type` for the batches, unless the application's producer
    /// overrides name one (or its alias `compression.codec`).
    pub compression: &'static str,
}

impl Default for BestEffortSettings {
    /// Lifecycle events are read by people and dashboards: a fifth of a second late is nothing
    /// to them, and batches that long cost the broker one request per thousands of records.
    /// They are JSON records much alike, which lz4 shrinks several times over for little CPU on
    /// the sending side: the broker then receives and stores a fraction of the bytes (on the
    /// test machine, where the broker shares the consumer's two cores, the broker's CPU over a
    /// run with lifecycle events fell by about a third).
    fn default() -> Self {
        Self {
            linger: Duration::from_millis(200),
            delivery_timeout: Duration::from_secs(30),
            failure_hint: "",
            compression: "lz4",
        }
    }
}

/// The most bytes of records waiting in librdkafka's queue or in flight; past it a send is
/// refused. About 150,000 lifecycle events: what a broker that stops answering may hold up
/// until the delivery timeout, without growing the process by more than some tens of MiB.
const QUEUE_KIBIBYTES: u32 = 32 * 1024;

/// The most records waiting in librdkafka's queue or in flight (its default of 100,000 is
/// 70 ms of lifecycle events from a consumer handling 700,000 records a second).
const QUEUE_RECORDS: u32 = 200_000;

/// Why a record was not taken.
#[derive(Debug, thiserror::Error)]
#[error("record for topic {topic:?} not queued: {source}")]
pub struct NotQueued {
    /// Destination topic.
    pub topic: String,
    /// librdkafka's reason: usually a full queue.
    #[source]
    pub source: KafkaError,
}

impl NotQueued {
    /// Whether the queue was full (rather than the record refused).
    #[must_use]
    pub fn queue_full(&self) -> bool {
        self.source.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull)
    }
}

/// A producer whose sends return at once and are delivered in the background. Cheap to clone;
/// clones share one librdkafka client and its polling thread.
#[derive(Clone)]
pub struct BestEffortProducer {
    inner: ThreadedProducer<FailureCounter>,
    failures: DeliveryFailures,
}

impl std::fmt::Debug for BestEffortProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BestEffortProducer")
            .field("failed", &self.failures.count())
            .finish_non_exhaustive()
    }
}

impl BestEffortProducer {
    /// Creates the producer from `config`'s bootstrap servers and overrides (its source
    /// system and send timeout do not apply: records carry no headers and nobody waits).
    ///
    /// # Errors
    /// [`ProducerError::Create`] when librdkafka rejects the configuration.
    pub fn new(
        config: &ProducerConfig,
        settings: &BestEffortSettings,
    ) -> Result<Self, ProducerError> {
        let failures = Arc::new(Failures {
            count: AtomicU64::new(0),
            hint: settings.failure_hint,
        });
        let inner = client_config(config, settings)
            .create_with_context(FailureCounter(failures.clone()))
            .map_err(|source| config.creation_failed(source))?;
        Ok(Self {
            inner,
            failures: DeliveryFailures(failures),
        })
    }

    /// Hands `value` under `key` to librdkafka for `topic` and returns without waiting.
    ///
    /// # Errors
    /// [`NotQueued`] when librdkafka does not take the record, most often because its queue is
    /// full; nothing was sent then.
    pub fn send(&self, topic: &str, key: &[u8], value: &[u8]) -> Result<(), NotQueued> {
        self.inner
            .send(BaseRecord::<[u8], [u8]>::to(topic).key(key).payload(value))
            .map_err(|(source, _)| NotQueued {
                topic: topic.to_owned(),
                source,
            })
    }

    /// The count of records librdkafka gave up on after taking them; the handle does not keep
    /// the producer alive.
    #[must_use]
    pub fn failures(&self) -> DeliveryFailures {
        self.failures.clone()
    }

    /// Blocks until every record taken so far is delivered or has failed (at most the delivery
    /// timeout after it was taken), sending waiting batches at once. Returns whether
    /// everything was settled within `within`.
    #[must_use]
    pub fn flush_blocking(&self, within: Duration) -> bool {
        self.inner.flush(Timeout::After(within)).is_ok()
    }
}

fn client_config(config: &ProducerConfig, settings: &BestEffortSettings) -> rdkafka::ClientConfig {
    let mut client = config.base_client_config();
    client
        // Best effort: the leader's acknowledgement, no idempotence bookkeeping.
        .set("enable.idempotence", "false")
        .set("acks", "1")
        .set("linger.ms", settings.linger.as_millis().to_string())
        .set("batch.size", (4 * 1024 * 1024).to_string())
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.kbytes", QUEUE_KIBIBYTES.to_string())
        .set("queue.buffering.max.messages", QUEUE_RECORDS.to_string())
        .set(
            "message.timeout.ms",
            settings.delivery_timeout.as_millis().max(1).to_string(),
        )
        // Successes need no report: only failures are counted.
        .set("delivery.report.only.error", "true");
    // The overrides are in the base configuration: a codec named there (under either of
    // librdkafka's names for it) stands.
    let codec_chosen = ["compression.type", "compression.codec"]
        .iter()
        .any(|name| client.get(name).is_some());
    if !codec_chosen {
        client.set("compression.type", settings.compression);
    }
    client
}

struct Failures {
    count: AtomicU64,
    hint: &'static str,
}

/// Reads how many records a [`BestEffortProducer`] gave up on.
#[derive(Clone)]
pub struct DeliveryFailures(Arc<Failures>);

impl DeliveryFailures {
    /// Records given up on so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.0.count.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for DeliveryFailures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DeliveryFailures")
            .field(&self.count())
            .finish()
    }
}

/// Counts records librdkafka could not deliver, warning when the count reaches a power of two
/// so that a lasting cause (a missing topic) is said a few times rather than per record.
struct FailureCounter(Arc<Failures>);

impl ClientContext for FailureCounter {}

impl ProducerContext for FailureCounter {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        if let Err((error, message)) = result {
            let failed = self.0.count.fetch_add(1, Ordering::Relaxed) + 1;
            if failed.is_power_of_two() {
                use rdkafka::Message as _;
                warn!(failed, topic = message.topic(), %error, hint = self.0.hint,
                    "records not delivered");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_effort_settings_win_over_overrides() {
        let mut config = ProducerConfig::new("127.0.0.1:1", "billing");
        config.overrides.insert("acks".to_owned(), "all".to_owned());
        config
            .overrides
            .insert("security.protocol".to_owned(), "ssl".to_owned());
        let client = client_config(&config, &BestEffortSettings::default());
        assert_eq!(client.get("acks"), Some("1"));
        assert_eq!(client.get("enable.idempotence"), Some("false"));
        assert_eq!(client.get("delivery.report.only.error"), Some("true"));
        assert_eq!(client.get("security.protocol"), Some("ssl"));
        assert_eq!(client.get("bootstrap.servers"), Some("127.0.0.1:1"));
    }

    #[test]
    fn batches_are_compressed_with_lz4_unless_the_application_chose_a_codec() {
        let mut config = ProducerConfig::new("127.0.0.1:1", "billing");
        let client = client_config(&config, &BestEffortSettings::default());
        assert_eq!(client.get("compression.type"), Some("lz4"));
        config
            .overrides
            .insert("compression.type".to_owned(), "gzip".to_owned());
        let client = client_config(&config, &BestEffortSettings::default());
        assert_eq!(client.get("compression.type"), Some("gzip"));
        // librdkafka's alias for the same property.
        let mut config = ProducerConfig::new("127.0.0.1:1", "billing");
        config
            .overrides
            .insert("compression.codec".to_owned(), "none".to_owned());
        let client = client_config(&config, &BestEffortSettings::default());
        assert_eq!(client.get("compression.type"), None);
        assert_eq!(client.get("compression.codec"), Some("none"));
        // librdkafka accepts the codec: a producer is made with it.
        let config = ProducerConfig::new("127.0.0.1:1", "billing");
        assert!(BestEffortProducer::new(&config, &BestEffortSettings::default()).is_ok());
    }

    #[test]
    fn a_record_for_an_unreachable_broker_is_queued_and_counted_when_given_up() {
        let settings = BestEffortSettings {
            linger: Duration::from_millis(1),
            delivery_timeout: Duration::from_millis(10),
            ..BestEffortSettings::default()
        };
        let config = ProducerConfig::new("127.0.0.1:1", "billing");
        let producer = BestEffortProducer::new(&config, &settings).unwrap();
        producer.send("events", b"k", b"{}").unwrap();
        assert_eq!(producer.failures().count(), 0);
        assert!(producer.flush_blocking(Duration::from_secs(10)));
        assert_eq!(producer.failures().count(), 1);
    }
}
