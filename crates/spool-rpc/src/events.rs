//! A run's journal events and live deltas as OpenTelemetry LogRecords
//! ([`WireEvent`]), the records `events.append` carries (and the OTLP
//! exporter will reuse). The table is in `docs/protocol/rpc.md`:
//!
//! - `traceId` is the run: the first 16 bytes of SHA-256 over the run id, in
//!   32 lowercase hex digits (a valid OTLP trace id, the same for every
//!   event of the run, on every server).
//! - `spanId` is the task an event belongs to: a model call (keyed by the
//!   journal position of its request) or a tool call (keyed by its call id):
//!   the first 8 bytes of SHA-256 over `run id / key`, in 16 hex digits.
//! - `spool.kind`: `run:start` when a turn starts; `task:start` and
//!   `task:complete` around each model call and tool call; `task:stdout`
//!   for streamed text and a tool's output; `run:status` for each state
//!   change; `run:end` when a turn reaches its end. Failures have
//!   severity 17.

use sha2::{Digest, Sha256};
use spool_journal::{Envelope, Event, RunId};
use spool_runtime::engine::Delta;
use spool_runtime::hub::LiveDelta;
use spool_wire::rpc::{Severity, WireEvent};
use spool_wire::sentinel::{self, Sentinel};

/// The trace id of a run's events.
#[must_use]
pub fn trace_id(run: &RunId) -> String {
    hex(&Sha256::digest(run.as_str().as_bytes())[..16])
}

/// The span id of one task (`model:<seq>` or `tool:<call id>`) of a run.
#[must_use]
pub fn span_id(run: &RunId, task: &str) -> String {
    hex(&Sha256::digest(format!("{run}/{task}").as_bytes())[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Maps one run's events, in order, to wire events. It remembers the model
/// call in progress, which the live deltas after it belong to.
#[derive(Debug)]
pub struct Mapper {
    run: RunId,
    trace: String,
    /// The span of the model call in progress.
    model_span: Option<String>,
}

impl Mapper {
    /// A mapper for `run`'s events.
    #[must_use]
    pub fn new(run: &RunId) -> Self {
        Self {
            run: run.clone(),
            trace: trace_id(run),
            model_span: None,
        }
    }

    fn event(&self, kind: &str, nanos: u64, body: impl Into<String>) -> WireEvent {
        WireEvent::new(kind, self.trace.clone(), nanos, body)
            .with_attribute("cicd.pipeline.run.id", self.run.as_str())
    }

    fn task(
        &self,
        kind: &str,
        nanos: u64,
        span: &str,
        name: &str,
        body: impl Into<String>,
    ) -> WireEvent {
        self.event(kind, nanos, body)
            .with_span(span)
            .with_attribute("cicd.pipeline.task.name", name)
            .with_attribute("cicd.worker.id", "spool")
    }

    /// Follows one journal event without mapping it: what the mapper
    /// remembers (the model call in progress) moves on as
    /// [`Mapper::envelope`] would move it.
    pub fn advance(&mut self, envelope: &Envelope) {
        match &envelope.event {
            Event::ModelCallRequested(_) => {
                self.model_span = Some(span_id(&self.run, &format!("model:{}", envelope.seq.0)));
            }
            Event::ModelCallCompleted(_) => self.model_span = None,
            _ => {}
        }
    }

    /// The wire events of one journal event (none for a record nobody
    /// outside the runtime reads: a schedule's firing records).
    pub fn envelope(&mut self, envelope: &Envelope) -> Vec<WireEvent> {
        let nanos = u64::try_from(envelope.recorded_at.unix_timestamp_nanos()).unwrap_or(0);
        let seq = envelope.seq.0;
        let mut events = Vec::new();
        match &envelope.event {
            Event::TurnStarted(started) => events.push(
                self.event("run:start", nanos, started.input.clone())
                    .with_attribute("spool.turn_id", started.turn_id.as_str()),
            ),
            Event::InputSteered(steered) => events.push(
                self.event("run:input", nanos, steered.input.clone())
                    .with_attribute("spool.policy", "steer"),
            ),
            Event::InputQueued(queued) => events.push(
                self.event("run:input", nanos, queued.input.clone())
                    .with_attribute("spool.policy", "queue"),
            ),
            Event::ModelCallRequested(_) => {
                let span = span_id(&self.run, &format!("model:{seq}"));
                events.push(self.task("task:start", nanos, &span, "model", "model call"));
                self.model_span = Some(span);
            }
            Event::ModelCallCompleted(done) => {
                let span = self
                    .model_span
                    .take()
                    .unwrap_or_else(|| span_id(&self.run, &format!("model:{seq}")));
                let mut event = self
                    .task(
                        "task:complete",
                        nanos,
                        &span,
                        "model",
                        "model call completed",
                    )
                    .with_attribute("cicd.pipeline.task.run.result", "success");
                if let Some(usage) = done.usage {
                    event = event
                        .with_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
                        .with_attribute("gen_ai.usage.output_tokens", usage.output_tokens);
                }
                events.push(event);
            }
            Event::ToolCallRequested(call) => {
                let span = span_id(&self.run, &format!("tool:{}", call.call_id));
                events.push(
                    self.task(
                        "task:start",
                        nanos,
                        &span,
                        &call.tool,
                        format!("{} {}", call.tool, call.input),
                    )
                    .with_attribute("gen_ai.tool.call.id", call.call_id.as_str()),
                );
            }
            Event::ToolCallCompleted(done) => {
                let span = span_id(&self.run, &format!("tool:{}", done.call_id));
                match Sentinel::decode(&done.output) {
                    Ok(Some(Sentinel::Failure(failure))) => events.push(
                        self.task(
                            "task:complete",
                            nanos,
                            &span,
                            "tool",
                            failure.message.clone(),
                        )
                        .with_severity(Severity::ERROR)
                        .with_attribute("cicd.pipeline.task.run.result", "failure"),
                    ),
                    // A suspension or a sleep: the run's status says so.
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        events.push(self.task(
                            "task:stdout",
                            nanos,
                            &span,
                            "tool",
                            sentinel::content_string(&done.output),
                        ));
                        events.push(
                            self.task("task:complete", nanos, &span, "tool", "tool call completed")
                                .with_attribute("cicd.pipeline.task.run.result", "success"),
                        );
                    }
                }
            }
            Event::ToolCallResolved(resolved) => {
                let span = span_id(&self.run, &format!("tool:{}", resolved.call_id));
                events.push(
                    self.task(
                        "task:complete",
                        nanos,
                        &span,
                        "tool",
                        sentinel::content_string(&resolved.output),
                    )
                    .with_attribute("cicd.pipeline.task.run.result", "success")
                    .with_attribute("spool.resolved", true),
                );
            }
            Event::ToolCallAbandoned(abandoned) => {
                let span = span_id(&self.run, &format!("tool:{}", abandoned.call_id));
                events.push(
                    self.task(
                        "task:complete",
                        nanos,
                        &span,
                        "tool",
                        abandoned
                            .reason
                            .clone()
                            .unwrap_or_else(|| "abandoned".into()),
                    )
                    .with_severity(Severity::ERROR)
                    .with_attribute("cicd.pipeline.task.run.result", "failure"),
                );
            }
            Event::TurnCompleted(done) => events.push(
                self.event("run:end", nanos, done.response.clone().unwrap_or_default())
                    .with_attribute("spool.turn_id", done.turn_id.as_str())
                    .with_attribute("cicd.pipeline.run.result", "success"),
            ),
            Event::TurnFailed(failed) => events.push(
                self.event("run:end", nanos, failed.message.clone())
                    .with_severity(Severity::ERROR)
                    .with_attribute("spool.turn_id", failed.turn_id.as_str())
                    .with_attribute("spool.code", failed.code.as_str())
                    .with_attribute("cicd.pipeline.run.result", "failure"),
            ),
            Event::TurnCancelled(cancelled) => events.push(
                self.event("run:end", nanos, "cancelled")
                    .with_attribute("spool.turn_id", cancelled.turn_id.as_str())
                    .with_attribute("cicd.pipeline.run.result", "cancellation"),
            ),
            // What changes no task: the state line below, or nothing.
            Event::RunCreated(_)
            | Event::Suspended(_)
            | Event::Resumed(_)
            | Event::SleepStarted(_)
            | Event::SleepCompleted(_)
            | Event::CancelRequested(_)
            | Event::ContextCleared(_)
            | Event::Compacted(_)
            | Event::BudgetExceeded(_)
            | Event::AddressBound(_)
            | Event::AddressUnbound(_)
            | Event::RunRetired(_)
            | Event::ScheduleFired(_)
            | Event::ScheduleDelivered(_) => {}
        }
        if let Some(status) = spool_journal::fold::moved_to(&envelope.event) {
            let mut event = self
                .event("run:status", nanos, status.encode())
                .with_attribute("spool.state", status.state().as_str());
            if let Event::Suspended(suspended) = &envelope.event {
                event = event
                    .with_attribute("spool.suspend.kind", suspended.kind.as_str())
                    .with_attribute("spool.suspend.prompt", suspended.prompt.as_str());
            }
            events.push(event);
        }
        events
    }

    /// The wire event of a live delta: streamed text is the model call's
    /// `task:stdout`; thinking is marked as such; tool-call pieces are left
    /// to the tool call's own events.
    pub fn delta(&self, delta: &LiveDelta, nanos: u64) -> Option<WireEvent> {
        let span = self.model_span.clone()?;
        let (text, stream) = match &delta.delta {
            Delta::Text(text) => (text.clone(), "text"),
            Delta::Thinking(text) => (text.clone(), "thinking"),
            _ => return None,
        };
        Some(
            self.task("task:stdout", nanos, &span, "model", text)
                .with_attribute("spool.stream", stream)
                .with_attribute("spool.turn_id", delta.turn.as_str()),
        )
    }
}
