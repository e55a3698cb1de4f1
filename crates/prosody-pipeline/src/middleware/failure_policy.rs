//! What happens to an event the layers below gave up on, and to a record that could not be
//! decoded: written to the failure topic (pipeline and low-latency modes, when one is set) or
//! logged; either way it is then done and its offset commits. Cancelled work is passed up
//! untouched so it stays uncommitted.
//!
//! A failure-topic record keeps the original key and value and carries where the record came
//! from, why it failed and after how many attempts, in the headers named by the constants
//! below. A record rejected by the decoder gets attempt count 0 (no handler ever saw it).
//!
//! Nothing commits without its failure record: a failure topic that refuses records (missing,
//! not writable) blocks the key, with an error in the log, until it accepts them. The one
//! refusal that waiting cannot fix, a value too large for the failure topic, is answered by
//! forwarding the record without its value (header [`VALUE_OMITTED_HEADER`]); the value stays
//! readable at the original offset for as long as the source topic keeps it.

use prosody_api::ClassifyError;
use rdkafka::types::RDKafkaErrorCode;
use serde_json::Value;
use tracing::{error, warn};

use super::retry::RetryPolicy;
use super::{Failure, FailureKind, Layer, Service, Task, Verdict};
use crate::consumer::CancelWatch;
use crate::event::Event;
use crate::kafka::producer::{Producer, RawRecord, SendOptions};
use crate::timers::Timers;

/// Header: topic the failed record was read from.
pub const ORIGINAL_TOPIC_HEADER: &str = "prosody-original-topic";
/// Header: its partition.
pub const ORIGINAL_PARTITION_HEADER: &str = "prosody-original-partition";
/// Header: its offset.
pub const ORIGINAL_OFFSET_HEADER: &str = "prosody-original-offset";
/// Header: the error text of the last attempt.
pub const ERROR_HEADER: &str = "prosody-error";
/// Header: how many attempts were made (0: the record could not be decoded).
pub const ATTEMPTS_HEADER: &str = "prosody-attempts";
/// Header, present when the value was left out: why the failure topic refused it.
pub const VALUE_OMITTED_HEADER: &str = "prosody-value-omitted";

/// Where given-up work goes.
#[derive(Clone, Debug)]
pub enum Destination {
    /// Log it and move on.
    Log,
    /// Write it to the failure topic, retrying until it lands or the work is cancelled.
    FailureTopic {
        /// The failure topic.
        topic: String,
        /// The producer to write with.
        producer: Producer,
        /// Backoff between send attempts.
        retry: RetryPolicy,
    },
}

/// Routes what finally failed to its [`Destination`].
pub struct FailurePolicy<S> {
    destination: Destination,
    timers: Option<Timers>,
    inner: S,
}

/// Builds a [`FailurePolicy`].
pub struct FailurePolicyLayer {
    /// Where given-up records go.
    pub destination: Destination,
    /// Where a given-up timer event's fired timer is removed, so it does not fire again.
    pub timers: Option<Timers>,
}

impl Layer for FailurePolicyLayer {
    type Wrapped<S: Service> = FailurePolicy<S>;

    fn wrap<S: Service>(self, inner: S) -> FailurePolicy<S> {
        FailurePolicy {
            destination: self.destination,
            timers: self.timers,
            inner,
        }
    }
}

impl<S: Service> Service for FailurePolicy<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        let failure = match task.event {
            Event::Rejected(rejected) => {
                Failure::new(FailureKind::Permanent, rejected.reason.clone(), 0)
            }
            _ => match self.inner.call(task).await {
                Err(failure) if !failure.is_cancelled() => failure,
                verdict => return verdict,
            },
        };
        // Boxed: giving up (a produce with retries) is rare, and inline its state would size
        // every event's future (see the defer layer).
        Box::pin(self.give_up(task.event, &failure, task.cancel)).await
    }
}

impl<S: Service> FailurePolicy<S> {
    async fn give_up(&self, event: &Event, failure: &Failure, cancel: &CancelWatch) -> Verdict {
        if let Event::Timer(fired) = event {
            // No record to forward: log it, and remove the timer so it does not fire again.
            error!(key = %fired.timer.key, time = %fired.timer.time, attempts = failure.attempt,
                reason = %failure.reason, "giving up on the timer: removed");
            if let Some(timers) = &self.timers
                && let Err(error) = timers.stage(event).give_up().await
            {
                warn!(key = %fired.timer.key, %error,
                    "removing a given-up timer failed: it may fire again");
            }
            return Ok(Value::Null);
        }
        self.destination.forward(event, failure, cancel).await
    }
}

impl Destination {
    /// Sends a record the layers gave up on where the mode wants it: logged, or written to
    /// the failure topic (retried until it lands or `cancel` fires; see the module docs).
    /// Cancelled is the only failure: the record then stays uncommitted (or deferred).
    ///
    /// # Errors
    /// [`FailureKind::Cancelled`] when `cancel` fired before the record landed.
    pub async fn forward(&self, event: &Event, failure: &Failure, cancel: &CancelWatch) -> Verdict {
        let Destination::FailureTopic {
            topic,
            producer,
            retry,
        } = self
        else {
            error!(key = %event.key(), offset = ?event.offset(), attempts = failure.attempt,
                reason = %failure.reason, "giving up on the record (no failure topic): committed");
            return Ok(Value::Null);
        };
        let (topic_of, partition) = event.source();
        let offset = event.offset().map_or(-1, |offset| offset.0);
        let mut value = value(event);
        let mut headers = vec![
            (ORIGINAL_TOPIC_HEADER, topic_of.to_string()),
            (ORIGINAL_PARTITION_HEADER, partition.0.to_string()),
            (ORIGINAL_OFFSET_HEADER, offset.to_string()),
            (ERROR_HEADER, failure.reason.clone()),
            (ATTEMPTS_HEADER, failure.attempt.to_string()),
        ];
        let mut delays = retry.delays();
        loop {
            let record = RawRecord {
                key: raw_key(event),
                value: value.as_deref(),
                headers: &headers,
            };
            // Biased: once cancelled, the record is not enqueued.
            let outcome = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(Failure::cancelled(failure.attempt)),
                outcome = producer.send_raw(topic, record, SendOptions::default()) => outcome,
            };
            let refusal = match outcome {
                Ok(delivery) => {
                    warn!(key = %event.key(), offset = ?event.offset(), attempts = failure.attempt,
                        reason = %failure.reason, failure_topic = %topic,
                        failure_offset = delivery.offset.0, "record written to the failure topic");
                    return Ok(Value::Null);
                }
                Err(_) if cancel.is_cancelled() => return Err(Failure::cancelled(failure.attempt)),
                Err(send) => send,
            };
            let too_large = refusal.kafka_code().is_some_and(is_size_refusal);
            if too_large && value.as_ref().is_some_and(|value| !value.is_empty()) {
                error!(key = %event.key(), offset = ?event.offset(), failure_topic = %topic,
                    error = %refusal, "the failure topic refused the value: forwarding without it");
                // Empty, not absent: a null value would read as an excise record.
                value = Some(Vec::new());
                headers.push((VALUE_OMITTED_HEADER, refusal.to_string()));
                continue;
            }
            let delay = delays.next().unwrap_or(retry.max_delay);
            if refusal.is_permanent() {
                error!(key = %event.key(), offset = ?event.offset(), failure_topic = %topic,
                    error = %refusal, retry_in = ?delay,
                    "the failure topic refuses records (does it exist, may this client write \
                     to it?): the key waits, nothing is committed without its failure record");
            } else {
                warn!(key = %event.key(), offset = ?event.offset(), error = %refusal,
                    retry_in = ?delay, "cannot write to the failure topic yet: retrying");
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = cancel.cancelled() => return Err(Failure::cancelled(failure.attempt)),
            }
        }
    }
}

/// Whether Kafka refused a record for its size.
fn is_size_refusal(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageBatchTooLarge
    )
}

/// The value bytes to forward.
fn value(event: &Event) -> Option<Vec<u8>> {
    match event {
        // The bytes as they arrived (the payload keeps its text).
        Event::Message(message) => Some(message.payload.json().as_bytes().to_vec()),
        Event::Excise(_) | Event::Timer(_) => None,
        // An oversized value was not kept (the failure topic would refuse it too): an empty
        // value, not a null one, so the record does not read as an excise.
        Event::Rejected(rejected) => Some(rejected.raw_value.clone().unwrap_or_default()),
    }
}

fn raw_key(event: &Event) -> Option<&[u8]> {
    match event {
        Event::Rejected(rejected) => rejected.raw_key.as_deref(),
        other => Some(other.key().as_str().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::stack::testing::{Calls, message, rejected, task};
    use serde_json::json;

    #[tokio::test]
    async fn logging_policy_commits_failures_and_passes_cancellation_up() {
        for (kind, expected) in [
            (FailureKind::Permanent, Ok(Value::Null)),
            (FailureKind::Transient, Ok(Value::Null)),
            (FailureKind::Cancelled, Err(FailureKind::Cancelled)),
        ] {
            let calls = Calls::failing(kind);
            let policy = Box::new(FailurePolicyLayer {
                destination: Destination::Log,
                timers: None,
            })
            .wrap(calls.clone());
            let verdict = policy.call(&task(message("k", json!({})))).await;
            assert_eq!(verdict.map_err(|failure| failure.kind), expected);
            assert_eq!(calls.count(), 1);
        }
    }

    #[tokio::test]
    async fn rejected_records_never_reach_the_inner_layers() {
        let calls = Calls::succeeding();
        let policy = Box::new(FailurePolicyLayer {
            destination: Destination::Log,
            timers: None,
        })
        .wrap(calls.clone());
        assert_eq!(policy.call(&task(rejected("k"))).await, Ok(Value::Null));
        assert_eq!(calls.count(), 0);
    }
}
