//! Idempotent JSON producer: `send` and `excise` (tombstone) with the `source-system` header,
//! trace-context headers, a bound on the whole send and cooperative cancellation.

mod error;

use std::collections::BTreeMap;
use std::fmt;
use std::future::pending;
use std::sync::Arc;
use std::time::Duration;

use prosody_api::Payload;
use prosody_api::{Offset, Partition};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;

pub use self::error::ProducerError;
use super::headers::{HeaderInjector, NoInjector, TraceContext, build_headers};

/// Default bound on one send (FEATURES.md section 9, `sendTimeoutMs`).
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// What the producer needs; the client's typed configuration maps onto it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// Value of the `source-system` header stamped on every record.
    pub source_system: String,
    /// Bound on a whole send: waiting for room in the local queue plus delivery.
    pub send_timeout: Duration,
    /// Extra librdkafka properties (e.g. `linger.ms`, `compression.type`). Applied before the
    /// settings Prosody relies on (`bootstrap.servers`, idempotence, `acks`,
    /// `message.timeout.ms`), which therefore cannot be overridden here.
    pub overrides: BTreeMap<String, String>,
}

impl ProducerConfig {
    /// A configuration with the default send timeout and no overrides.
    #[must_use]
    pub fn new(bootstrap_servers: impl Into<String>, source_system: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            source_system: source_system.into(),
            send_timeout: DEFAULT_SEND_TIMEOUT,
            overrides: BTreeMap::new(),
        }
    }

    /// What every producer made from this configuration starts from: the overrides, then the
    /// bootstrap servers. Each producer sets what it relies on after it.
    pub(crate) fn base_client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.overrides {
            config.set(key, value);
        }
        config.set("bootstrap.servers", &self.bootstrap_servers);
        config
    }

    /// The error for a producer librdkafka would not create from this configuration.
    pub(crate) fn creation_failed(&self, source: KafkaError) -> ProducerError {
        ProducerError::Create {
            bootstrap_servers: self.bootstrap_servers.clone(),
            source: Box::new(source),
        }
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = self.base_client_config();
        // librdkafka's own message timeout equals ours so a record we reported as timed out is
        // also given up by librdkafka instead of landing later behind the caller's back.
        let timeout_ms = self.send_timeout.as_millis().max(1).to_string();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", timeout_ms);
        config
    }
}

/// Per-send options.
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// Cancels the send while it waits for acknowledgement; the send then returns
    /// [`ProducerError::Cancelled`]. Dropping the send future cancels it too.
    pub cancel: Option<CancellationToken>,
    /// Trace context to propagate instead of the ambient one supplied by the injector.
    pub trace_context: Option<TraceContext>,
}

impl SendOptions {
    /// Options that cancel the send when `token` is cancelled.
    #[must_use]
    pub fn with_cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Options that propagate `context` in the record's headers.
    #[must_use]
    pub fn with_trace_context(mut self, context: TraceContext) -> Self {
        self.trace_context = Some(context);
        self
    }
}

/// A record forwarded as raw bytes, such as a failed record sent on to the failure topic: its
/// key may be missing, empty or not UTF-8 and its value need not be JSON.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawRecord<'a> {
    /// The key bytes.
    pub key: Option<&'a [u8]>,
    /// The value bytes; `None` writes a null value.
    pub value: Option<&'a [u8]>,
    /// Headers added after the trace context and before `source-system`.
    pub headers: &'a [(&'a str, String)],
}

/// Where a record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// The partition the record was written to.
    pub partition: Partition,
    /// The record's offset in that partition.
    pub offset: Offset,
}

/// Idempotent Kafka producer (`enable.idempotence=true`, `acks=all`). Cheap to clone; clones
/// share one librdkafka client.
#[derive(Clone)]
pub struct Producer {
    inner: FutureProducer,
    source_system: Arc<str>,
    send_timeout: Duration,
    injector: Arc<dyn HeaderInjector>,
}

impl fmt::Debug for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("source_system", &self.source_system)
            .field("send_timeout", &self.send_timeout)
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// Creates the producer. Connecting happens in the background; a bad configuration fails
    /// here.
    ///
    /// # Errors
    /// [`ProducerError::Create`] when librdkafka rejects the configuration.
    pub fn new(config: &ProducerConfig) -> Result<Self, ProducerError> {
        let inner = config
            .client_config()
            .create()
            .map_err(|source| config.creation_failed(source))?;
        Ok(Self {
            inner,
            source_system: Arc::from(config.source_system.as_str()),
            send_timeout: config.send_timeout,
            injector: Arc::new(NoInjector),
        })
    }

    /// Replaces the hook that adds ambient trace-context headers to every record.
    #[must_use]
    pub fn with_injector(mut self, injector: Arc<dyn HeaderInjector>) -> Self {
        self.injector = injector;
        self
    }

    /// The `source-system` header value stamped on every record.
    #[must_use]
    pub fn source_system(&self) -> &str {
        &self.source_system
    }

    /// The bound on one send.
    #[must_use]
    pub fn send_timeout(&self) -> Duration {
        self.send_timeout
    }

    /// Sends `payload` as JSON to `topic` under `key`.
    ///
    /// # Errors
    /// See [`ProducerError`]; its [`ClassifyError`](prosody_api::ClassifyError) implementation
    /// tells whether to retry.
    pub async fn send(
        &self,
        topic: &str,
        key: &str,
        payload: impl Into<Payload>,
    ) -> Result<Delivery, ProducerError> {
        self.send_with(topic, key, payload, SendOptions::default())
            .await
    }

    /// [`send`](Self::send) with cancellation and an explicit trace context.
    ///
    /// # Errors
    /// See [`ProducerError`].
    pub async fn send_with(
        &self,
        topic: &str,
        key: &str,
        payload: impl Into<Payload>,
        options: SendOptions,
    ) -> Result<Delivery, ProducerError> {
        let payload = payload.into();
        self.produce(topic, key, Some(payload.json().as_bytes()), options)
            .await
    }

    /// Produces an excise record: `key` with a null value (a Kafka tombstone), which consumers
    /// route to `on_excise`.
    ///
    /// # Errors
    /// See [`ProducerError`].
    pub async fn excise(&self, topic: &str, key: &str) -> Result<Delivery, ProducerError> {
        self.excise_with(topic, key, SendOptions::default()).await
    }

    /// [`excise`](Self::excise) with cancellation and an explicit trace context.
    ///
    /// # Errors
    /// See [`ProducerError`].
    pub async fn excise_with(
        &self,
        topic: &str,
        key: &str,
        options: SendOptions,
    ) -> Result<Delivery, ProducerError> {
        self.produce(topic, key, None, options).await
    }

    /// Sends `record` as it is: no key check and no JSON encoding. For records encoded already
    /// (forwarded ones that could not be handled); applications send with [`send`](Self::send).
    ///
    /// # Errors
    /// See [`ProducerError`].
    pub async fn send_raw(
        &self,
        topic: &str,
        record: RawRecord<'_>,
        options: SendOptions,
    ) -> Result<Delivery, ProducerError> {
        let key = String::from_utf8_lossy(record.key.unwrap_or_default());
        self.produce_bytes(topic, &key, record, options).await
    }

    async fn produce(
        &self,
        topic: &str,
        key: &str,
        payload: Option<&[u8]>,
        options: SendOptions,
    ) -> Result<Delivery, ProducerError> {
        if key.is_empty() {
            return Err(ProducerError::EmptyKey {
                topic: topic.to_owned(),
            });
        }
        let record = RawRecord {
            key: Some(key.as_bytes()),
            value: payload,
            headers: &[],
        };
        self.produce_bytes(topic, key, record, options).await
    }

    /// `key` is the record's key as text, for error messages.
    async fn produce_bytes(
        &self,
        topic: &str,
        key: &str,
        raw: RawRecord<'_>,
        options: SendOptions,
    ) -> Result<Delivery, ProducerError> {
        let mut headers = build_headers(
            &self.source_system,
            self.injector.as_ref(),
            options.trace_context.as_ref(),
        );
        for (name, value) in raw.headers {
            headers.set(name, value.clone());
        }
        // Set last: nothing may forge the source system consumers use for loop prevention.
        headers.set(
            super::headers::SOURCE_SYSTEM_HEADER,
            self.source_system.to_string(),
        );
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).headers(headers.to_kafka());
        if let Some(key) = raw.key {
            record = record.key(key);
        }
        if let Some(value) = raw.value {
            record = record.payload(value);
        }

        // The queue wait is bounded by the same timeout as the whole send; librdkafka retries
        // a full queue internally until then.
        let delivery = tokio::time::timeout(
            self.send_timeout,
            self.inner.send(record, Timeout::After(self.send_timeout)),
        );
        let cancelled = async {
            match &options.cancel {
                Some(token) => token.cancelled().await,
                None => pending().await,
            }
        };

        // Biased so an already-cancelled token never enqueues the record.
        let outcome = tokio::select! {
            biased;
            () = cancelled => return Err(ProducerError::Cancelled {
                topic: topic.to_owned(),
                key: key.to_owned(),
            }),
            outcome = delivery => outcome,
        };
        match outcome {
            Ok(Ok(delivery)) => Ok(Delivery {
                partition: Partition(delivery.partition),
                offset: Offset(delivery.offset),
            }),
            Ok(Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut), _)))
            | Err(_) => Err(self.timed_out(topic, key)),
            Ok(Err((source, _))) => Err(ProducerError::Kafka {
                topic: topic.to_owned(),
                key: key.to_owned(),
                source: Box::new(source),
            }),
        }
    }

    fn timed_out(&self, topic: &str, key: &str) -> ProducerError {
        ProducerError::TimedOut {
            topic: topic.to_owned(),
            key: key.to_owned(),
            timeout_ms: self.send_timeout.as_millis(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prosody_settings_win_over_overrides() {
        let mut config = ProducerConfig::new("127.0.0.1:1", "billing");
        config.send_timeout = Duration::from_millis(2500);
        config
            .overrides
            .insert("enable.idempotence".to_owned(), "false".to_owned());
        config
            .overrides
            .insert("linger.ms".to_owned(), "20".to_owned());
        let client = config.client_config();
        assert_eq!(client.get("enable.idempotence"), Some("true"));
        assert_eq!(client.get("acks"), Some("all"));
        assert_eq!(client.get("message.timeout.ms"), Some("2500"));
        assert_eq!(client.get("linger.ms"), Some("20"));
        assert_eq!(client.get("bootstrap.servers"), Some("127.0.0.1:1"));
    }

    #[tokio::test]
    async fn empty_key_is_rejected_before_sending() {
        let producer = Producer::new(&ProducerConfig::new("127.0.0.1:1", "billing"))
            .expect("producer config is valid");
        let error = producer
            .send("orders", "", &serde_json::json!({}))
            .await
            .expect_err("empty key");
        assert!(matches!(error, ProducerError::EmptyKey { .. }), "{error}");
        assert!(prosody_api::ClassifyError::is_permanent(&error));
    }

    #[tokio::test]
    async fn cancelled_token_never_enqueues() {
        let producer = Producer::new(&ProducerConfig::new("127.0.0.1:1", "billing"))
            .expect("producer config is valid");
        let token = CancellationToken::new();
        token.cancel();
        let error = producer
            .excise_with("orders", "k1", SendOptions::default().with_cancel(token))
            .await
            .expect_err("cancelled");
        assert!(matches!(error, ProducerError::Cancelled { .. }), "{error}");
        assert_eq!(
            error.to_string(),
            r#"send to topic "orders", key "k1" was cancelled"#
        );
    }
}
