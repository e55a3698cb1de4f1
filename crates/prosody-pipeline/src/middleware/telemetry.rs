//! Observes each handler attempt: a `prosody.handle` span related to the producer's trace
//! context (child or follows-from, per the configuration), and lifecycle events (dispatched,
//! then succeeded or failed with the run time) for the telemetry topic when it is enabled.

use prosody_api::ConsumerGroup;
use tracing::Instrument;

use super::{Failure, Layer, Service, Task, Verdict};
use crate::event::Event;
use crate::telemetry::propagation::relate;
use crate::telemetry::{
    LifecycleEvent, Moment, SpanRelation, Stage, TelemetrySink, handler_spans_wanted,
};

/// Spans and lifecycle events around the handler.
pub struct Telemetry<S> {
    settings: TelemetryLayer,
    /// False when nothing would observe the attempt: the layer then only passes it on, with
    /// no clock reads on the hot path.
    observed: bool,
    inner: S,
}

/// Builds a [`Telemetry`].
#[derive(Clone)]
pub struct TelemetryLayer {
    /// Where lifecycle events go; `None` when disabled (mock mode, `telemetryEnabled: false`).
    pub sink: Option<TelemetrySink>,
    /// The consumer group, stamped on events.
    pub group_id: ConsumerGroup,
    /// Relation of message (and excise) spans to the producer's span.
    pub message_spans: SpanRelation,
    /// Relation of timer spans to the span that scheduled the timer. Stored timers carry no
    /// trace context yet, so timer spans start their own trace for now.
    pub timer_spans: SpanRelation,
}

impl Layer for TelemetryLayer {
    type Wrapped<S: Service> = Telemetry<S>;

    fn wrap<S: Service>(self, inner: S) -> Telemetry<S> {
        Telemetry {
            observed: self.sink.is_some() || handler_spans_wanted(),
            settings: self,
            inner,
        }
    }
}

/// What the span and the events call an event, and the headers that may carry its trace
/// context (timers have none).
fn describe(event: &Event) -> (&'static str, Option<&prosody_api::Headers>) {
    match event {
        Event::Message(message) => ("message", Some(&message.headers)),
        Event::Excise(excise) => ("excise", Some(&excise.headers)),
        Event::Timer(_) => ("timer", None),
        Event::Rejected(rejected) => ("rejected", Some(&rejected.headers)),
    }
}

impl<S: Service> Telemetry<S> {
    /// The handler span of `task`, related to the trace context in its record's headers.
    fn span(&self, task: &Task<'_>) -> tracing::Span {
        let (kind, headers) = describe(task.event);
        let (topic, partition) = task.event.source();
        let span = tracing::info_span!(
            "prosody.handle",
            event = kind,
            key = %task.event.key(),
            topic = topic.as_str(),
            partition = partition.0,
            offset = task.event.offset().map(|offset| offset.0),
            attempt = task.attempt,
        );
        let relation = if matches!(*task.event, Event::Timer(_)) {
            self.settings.timer_spans
        } else {
            self.settings.message_spans
        };
        if let Some(headers) = headers
            && !span.is_disabled()
        {
            relate(&span, headers, relation);
        }
        span
    }

    /// Emits `task`'s event at `stage`, reached `at` (with the run time since `started` for an
    /// ended attempt); the failure's text is copied only for an event the sink has room for.
    fn emit(
        &self,
        sink: &TelemetrySink,
        task: &Task<'_>,
        stage: Stage,
        at: Moment,
        started: Option<Moment>,
        failure: Option<&Failure>,
    ) {
        sink.emit(|| {
            let (kind, _) = describe(task.event);
            let (topic, partition) = task.event.source();
            LifecycleEvent {
                event: kind,
                stage,
                group_id: self.settings.group_id.clone(),
                key: task.event.key().clone(),
                topic: topic.clone(),
                partition: partition.0,
                offset: task.event.offset().map(|offset| offset.0),
                attempt: task.attempt,
                duration_ms: started.map(|started| at.since(started).as_secs_f64() * 1_000.0),
                error: failure.map(|failure| failure.reason.clone()),
                at,
            }
        });
    }
}

impl<S: Service> Service for Telemetry<S> {
    async fn call(&self, task: &Task<'_>) -> Verdict {
        if !self.observed {
            return self.inner.call(task).await;
        }
        // One clock reading per event: the dispatched event's is also the start of the run time
        // (spans time themselves).
        let started = self.settings.sink.as_ref().map(|sink| {
            let started = Moment::now();
            self.emit(sink, task, Stage::Dispatched, started, None, None);
            started
        });
        let verdict = if handler_spans_wanted() {
            self.inner.call(task).instrument(self.span(task)).await
        } else {
            self.inner.call(task).await
        };
        if let Some(sink) = &self.settings.sink {
            let (stage, failure) = match &verdict {
                Ok(_) => (Stage::Succeeded, None),
                Err(failure) => (Stage::Failed, Some(failure)),
            };
            self.emit(sink, task, stage, Moment::now(), started, failure);
        }
        verdict
    }
}
