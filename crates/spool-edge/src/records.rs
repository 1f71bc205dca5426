//! A run's activity as OpenTelemetry LogRecords ([`WireEvent`]): the
//! records JSON-RPC's `events.append` carries and the OTLP exporter sends,
//! one table for both. It is in `docs/protocol/rpc.md`:
//!
//! - `traceId` is the run: the first 16 bytes of SHA-256 over the run id, in
//!   32 lowercase hex digits (a valid OTLP trace id, the same for every
//!   event of the run, on every server).
//! - `spanId` is the task an event belongs to: a model call (keyed by the
//!   journal position of its request) or a tool call (keyed by its call id):
//!   the first 8 bytes of SHA-256 over `run id / key`, in 16 hex digits.
//! - `spool.kind`: `run:start` when a turn starts; `task:start` and
//!   `task:complete` around each model call and tool call (a tool's
//!   `task:complete` comes when the model's result is known: for a question
//!   or a sleep, when it is answered or wakes; every task of a turn
//!   completes before its `run:end`); `task:stdout` for streamed text and a
//!   tool's result; `run:status` for each state change; `run:end` when a
//!   turn reaches its end. Failures have severity 17.
//! - `spool.task.id` repeats the task (`model:<seq>`, `tool:<call id>`)
//!   that `spanId` is derived from; `cicd.pipeline.task.name` is `model`
//!   or the tool's name.

use sha2::{Digest, Sha256};
use spool_journal::event::Suspended;
use spool_journal::{Envelope, RunId, Seq};
use spool_runtime::activity::{Activity, Reader, ToolOutcome, TurnOutcome};
use spool_runtime::engine::Delta;
use spool_runtime::hub::LiveDelta;
use spool_wire::rpc::{Severity, WireEvent};

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

/// Maps one run's events, in order, to wire events: the JSON-RPC table
/// over [`spool_runtime::activity`].
#[derive(Debug)]
pub struct Mapper {
    run: RunId,
    trace: String,
    reader: Reader,
}

/// The name a tool's task carries when the mapper did not see it start.
const UNKNOWN_TOOL: &str = "tool";

impl Mapper {
    /// A mapper for `run`'s events.
    #[must_use]
    pub fn new(run: &RunId) -> Self {
        Self {
            run: run.clone(),
            trace: trace_id(run),
            reader: Reader::new(),
        }
    }

    fn event(&self, kind: &str, nanos: u64, body: impl Into<String>) -> WireEvent {
        WireEvent::new(kind, self.trace.clone(), nanos, body)
            .with_attribute("cicd.pipeline.run.id", self.run.as_str())
    }

    /// A task's event: the span and `spool.task.id` name the task
    /// (`model:<seq>` or `tool:<call id>`), the task name its model or tool.
    fn task(
        &self,
        kind: &str,
        nanos: u64,
        task: &str,
        name: &str,
        body: impl Into<String>,
    ) -> WireEvent {
        self.event(kind, nanos, body)
            .with_span(span_id(&self.run, task))
            .with_attribute("spool.task.id", task)
            .with_attribute("cicd.pipeline.task.name", name)
            .with_attribute("cicd.worker.id", "spool")
    }

    /// Follows one journal event without mapping it: what the mapper
    /// remembers (the model call and tool calls in progress) moves on as
    /// [`Mapper::envelope`] would move it.
    pub fn advance(&mut self, envelope: &Envelope) {
        self.reader.envelope(envelope).for_each(drop);
    }

    /// The wire events of one journal event (none for a record nobody
    /// outside the runtime reads: a schedule's firing records).
    pub fn envelope(&mut self, envelope: &Envelope) -> Vec<WireEvent> {
        let nanos = nanos_of(envelope);
        let mut events = Vec::new();
        let mut suspended = None;
        for fact in self.reader.envelope(envelope) {
            self.map(envelope, nanos, &fact, &mut suspended, &mut events);
        }
        events
    }

    /// The wire events of one journal event whose facts the caller read
    /// with a reader of its own, following the same run (the OTLP exporter
    /// reads each event once, for its spans and its log records both).
    /// [`Mapper::delta`] is not for such a mapper: its own reader has not
    /// followed the run.
    #[must_use]
    pub fn facts(&self, envelope: &Envelope, facts: &[Activity<'_>]) -> Vec<WireEvent> {
        let nanos = nanos_of(envelope);
        let mut events = Vec::new();
        let mut suspended = None;
        for fact in facts {
            self.map(envelope, nanos, fact, &mut suspended, &mut events);
        }
        events
    }

    /// One fact's wire events. `suspended` is the suspension an event's
    /// facts said so far, which its state line describes.
    fn map<'a>(
        &self,
        envelope: &Envelope,
        nanos: u64,
        fact: &Activity<'a>,
        suspended: &mut Option<&'a Suspended>,
        events: &mut Vec<WireEvent>,
    ) {
        match fact {
            Activity::TurnStarted { started, .. } => events.push(
                self.event("run:start", nanos, started.input.clone())
                    .with_attribute("spool.turn_id", started.turn_id.as_str()),
            ),
            // Input joining a running turn is said in the seed's closed
            // set of kinds: a `run:status` of the running run, the input
            // and its policy as attributes (a strict client reading
            // `run:status` as "the state now" reads the truth).
            Activity::Input { input, turn, .. } => events.push(
                self.event("run:status", nanos, "running")
                    .with_attribute("spool.state", "running")
                    .with_attribute("spool.input", *input)
                    .with_attribute(
                        "spool.policy",
                        if turn.is_some() { "steer" } else { "queue" },
                    ),
            ),
            Activity::ModelCallStarted { call } => events.push(self.task(
                "task:start",
                nanos,
                &model_task(*call),
                "model",
                "model call",
            )),
            Activity::ModelCallEnded { call, done } => {
                let call = call.unwrap_or(Seq(envelope.seq.0.saturating_sub(1)));
                let mut event = self
                    .task(
                        "task:complete",
                        nanos,
                        &model_task(call),
                        "model",
                        "model call completed",
                    )
                    .with_attribute(RESULT, "success");
                if let Some(usage) = done.usage {
                    event = event
                        .with_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
                        .with_attribute("gen_ai.usage.output_tokens", usage.output_tokens);
                }
                events.push(event);
            }
            Activity::ModelCallInterrupted { call } => events.push(
                self.task(
                    "task:complete",
                    nanos,
                    &model_task(*call),
                    "model",
                    "the turn ended before the model's answer",
                )
                .with_attribute(RESULT, "cancellation"),
            ),
            Activity::ToolCallStarted(call) => events.push(
                self.task(
                    "task:start",
                    nanos,
                    &tool_task(&call.call_id),
                    &call.tool,
                    format!("{} {}", call.tool, call.input),
                )
                .with_attribute("gen_ai.tool.call.id", call.call_id.as_str()),
            ),
            Activity::ToolCallEnded {
                call_id,
                tool,
                outcome,
            } => {
                let task = tool_task(call_id);
                let name = tool.as_deref().unwrap_or(UNKNOWN_TOOL);
                let text = outcome.text();
                if !outcome.is_error() {
                    events.push(self.task("task:stdout", nanos, &task, name, text.clone()));
                }
                let result = match outcome {
                    ToolOutcome::Interrupted => "cancellation",
                    _ if outcome.is_error() => "failure",
                    _ => "success",
                };
                let mut event = self
                    .task("task:complete", nanos, &task, name, text)
                    .with_attribute(RESULT, result)
                    .with_attribute("spool.tool.outcome", outcome.name())
                    .with_attribute("gen_ai.tool.call.id", call_id.as_ref());
                if outcome.is_error() {
                    event = event.with_severity(Severity::ERROR);
                }
                if matches!(outcome, ToolOutcome::Resolved(_)) {
                    event = event.with_attribute("spool.resolved", true);
                }
                events.push(event);
            }
            Activity::Suspended(parked) => *suspended = Some(*parked),
            Activity::TurnEnded(TurnOutcome::Completed(done)) => events.push(
                self.event("run:end", nanos, done.response.clone().unwrap_or_default())
                    .with_attribute("spool.turn_id", done.turn_id.as_str())
                    .with_attribute(RUN_RESULT, "success"),
            ),
            Activity::TurnEnded(TurnOutcome::Failed(failed)) => events.push(
                self.event("run:end", nanos, failed.message.clone())
                    .with_severity(Severity::ERROR)
                    .with_attribute("spool.turn_id", failed.turn_id.as_str())
                    .with_attribute("spool.code", failed.code.as_str())
                    .with_attribute(RUN_RESULT, "failure"),
            ),
            Activity::TurnEnded(TurnOutcome::Cancelled(cancelled)) => events.push(
                self.event("run:end", nanos, "cancelled")
                    .with_attribute("spool.turn_id", cancelled.turn_id.as_str())
                    .with_attribute(RUN_RESULT, "cancellation"),
            ),
            Activity::StateChanged(status) => {
                let mut event = self
                    .event("run:status", nanos, status.encode())
                    .with_attribute("spool.state", status.state().as_str());
                if let Some(suspended) = *suspended {
                    event = event
                        .with_attribute("spool.suspend.kind", suspended.kind.as_str())
                        .with_attribute("spool.suspend.prompt", suspended.prompt.as_str());
                }
                events.push(event);
            }
            // What changes no task: the state line, or nothing. A tool
            // call that parks completes when it is answered or wakes.
            _ => {}
        }
    }

    /// The wire event of a live delta: streamed text is the model call's
    /// `task:stdout`; thinking is marked as such; tool-call pieces are left
    /// to the tool call's own events.
    pub fn delta(&self, delta: &LiveDelta, nanos: u64) -> Option<WireEvent> {
        let activity = self.reader.delta(delta);
        if let Activity::ToolProgress {
            call_id,
            tool,
            turn,
            message,
        } = &activity
        {
            // A tool's progress is its own task's output, marked as such.
            let name = tool.as_deref().unwrap_or(UNKNOWN_TOOL);
            return Some(
                self.task("task:stdout", nanos, &tool_task(call_id), name, *message)
                    .with_attribute("spool.stream", "progress")
                    .with_attribute("spool.turn_id", turn.as_str()),
            );
        }
        let Activity::ModelStreamed {
            call: Some(call),
            turn,
            delta,
        } = activity
        else {
            return None;
        };
        let (text, stream) = match delta {
            Delta::Text(text) => (text.clone(), "text"),
            Delta::Thinking(text) => (text.clone(), "thinking"),
            _ => return None,
        };
        Some(
            self.task("task:stdout", nanos, &model_task(call), "model", text)
                .with_attribute("spool.stream", stream)
                .with_attribute("spool.turn_id", turn.as_str()),
        )
    }
}

/// A journal event's time, in nanoseconds since the epoch.
fn nanos_of(envelope: &Envelope) -> u64 {
    u64::try_from(envelope.recorded_at.unix_timestamp_nanos()).unwrap_or(0)
}

/// The attribute of a task's result (OpenTelemetry's CI/CD convention).
const RESULT: &str = "cicd.pipeline.task.run.result";

/// The attribute of a turn's result (the convention's pipeline result).
const RUN_RESULT: &str = "cicd.pipeline.result";

/// A model call's task: `model:<seq of its request>`.
fn model_task(call: Seq) -> String {
    format!("model:{}", call.0)
}

/// A tool call's task: `tool:<call id>`.
fn tool_task(call_id: &str) -> String {
    format!("tool:{call_id}")
}

#[cfg(test)]
mod tests {
    use spool_journal::TurnId;

    use super::*;

    #[test]
    fn a_tools_progress_is_its_own_tasks_stdout_marked_as_progress() {
        let run = RunId::new("run_1").unwrap();
        let mapper = Mapper::new(&run);
        let delta = LiveDelta {
            turn: TurnId::new("turn_1").unwrap(),
            after: Seq(3),
            n: 1,
            delta: Delta::ToolProgress {
                id: "c1".into(),
                message: "half way".into(),
            },
        };
        let event = mapper.delta(&delta, 7).expect("progress is an event");
        assert_eq!(event.kind, "task:stdout");
        assert_eq!(event.body, "half way");
        assert_eq!(event.attributes["spool.stream"], "progress");
        assert_eq!(event.attributes["spool.task.id"], "tool:c1");
        assert_eq!(
            event.span_id.as_deref(),
            Some(span_id(&run, "tool:c1").as_str())
        );
    }
}
