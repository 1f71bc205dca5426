//! A pod's events from its session's journal and live deltas: the table in
//! `docs/protocol/pod.md`. Deltas stream the answer as it comes; the
//! journal gives the rest (a block's whole text, tool results, usage, the
//! turn's start and end, state changes), so a listener that missed the
//! deltas still gets every `*_done`.

use std::collections::HashSet;

use spool_journal::Envelope;
use spool_journal::fold::Status as RunStatus;
use spool_runtime::activity::{Activity, Reader, ToolOutcome, TurnOutcome};
use spool_runtime::engine::Delta;
use spool_wire::pod::{
    ErrorCode, Event, PodState, Status, TextData, ToolCallArgsDelta, ToolCallDone, ToolCallStart,
    ToolResult, TurnEnd, TurnResult, TurnStart, Usage,
};
use spool_wire::run::FailureCode;

/// The pod state a run's status shows as: running is `running`, waiting
/// (for anything) is `paused`, everything else `idle`.
#[must_use]
pub fn pod_state(status: &RunStatus) -> PodState {
    match status {
        RunStatus::Running => PodState::Running,
        RunStatus::Waiting(_) => PodState::Paused,
        _ => PodState::Idle,
    }
}

/// Maps one session's journal events and deltas, in order, to pod events:
/// the Pod table over [`spool_runtime::activity`].
#[derive(Debug)]
pub struct Translator {
    pod_name: String,
    session: String,
    reader: Reader,
    state: PodState,
    /// Tool calls announced by a live delta: their `tool_call_start` and
    /// `tool_call_done` are not sent again from the journal.
    announced: HashSet<String>,
}

impl Translator {
    /// A translator for the session `session` of pod `pod_name`, before
    /// its first event.
    #[must_use]
    pub fn new(pod_name: &str, session: &str) -> Self {
        Self {
            pod_name: pod_name.to_owned(),
            session: session.to_owned(),
            reader: Reader::new(),
            state: PodState::Idle,
            announced: HashSet::new(),
        }
    }

    /// The pod's state after the events so far.
    #[must_use]
    pub fn state(&self) -> PodState {
        self.state.clone()
    }

    /// A `status` event of the present state.
    #[must_use]
    pub fn status(&self) -> Event {
        Event::Status(Status {
            state: self.state.clone(),
            session_id: self.session.clone(),
            pod_name: self.pod_name.clone(),
        })
    }

    /// The pod events of one journal event.
    pub fn journal(&mut self, envelope: &Envelope) -> Vec<Event> {
        let mut body = Vec::new();
        let mut moved = None;
        // The event starts a turn, or ends its running (an end or a pause).
        let mut starts = false;
        let mut ends = false;
        let mut pauses = false;
        for fact in self.reader.envelope(envelope) {
            match fact {
                Activity::TurnStarted { number, .. } => {
                    starts = true;
                    self.announced.clear();
                    body.push(Event::TurnStart(TurnStart { turn: number }));
                }
                Activity::ModelCallEnded { done, .. } => {
                    let message = &done.message;
                    if let Some(thinking) = message.get("thinking").and_then(|v| v.as_str())
                        && !thinking.is_empty()
                    {
                        body.push(Event::ThinkingDone(TextData {
                            text: thinking.to_owned(),
                        }));
                    }
                    if let Some(text) = message.get("text").and_then(|v| v.as_str())
                        && !text.is_empty()
                    {
                        body.push(Event::TextDone(TextData {
                            text: text.to_owned(),
                        }));
                    }
                    if let Some(usage) = done.usage {
                        body.push(Event::Usage(Usage {
                            input_tokens: usage.input_tokens,
                            output_tokens: usage.output_tokens,
                        }));
                    }
                }
                Activity::ToolCallStarted(call) if !self.announced.contains(&call.call_id) => {
                    body.push(Event::ToolCallStart(ToolCallStart {
                        id: call.call_id.clone(),
                        name: call.tool.clone(),
                    }));
                    body.push(Event::ToolCallDone(ToolCallDone {
                        id: call.call_id.clone(),
                        name: call.tool.clone(),
                        arguments: call.input.to_string(),
                    }));
                }
                // The result the model is given, when it is known: a
                // question's answer and a sleep's waking included.
                Activity::ToolCallEnded {
                    call_id, outcome, ..
                } => body.push(Event::ToolResult(ToolResult {
                    id: call_id.into_owned(),
                    output: match &outcome {
                        ToolOutcome::Failed(failure) => failure.message.clone(),
                        other => other.text(),
                    },
                    is_error: outcome.is_error(),
                })),
                Activity::Suspended(_) | Activity::SleepStarted(_) | Activity::BudgetStopped(_) => {
                    ends = true;
                    pauses = true;
                }
                Activity::TurnEnded(outcome) => {
                    ends = true;
                    if let TurnOutcome::Failed(failed) = outcome {
                        body.push(Event::error(
                            error_code(&failed.code),
                            failed.message.clone(),
                        ));
                    }
                    body.push(self.turn_end(TurnResult::Finished));
                }
                Activity::StateChanged(status) => moved = Some(pod_state(&status)),
                _ => {}
            }
        }
        let mut events = Vec::new();
        // A paused turn going on again (answered, woken, its budget
        // extended) starts again: every `turn_end` has its `turn_start`.
        let resumes = !starts && self.state == PodState::Paused && moved == Some(PodState::Running);
        // A turn's start is announced after the state it moves to.
        if let Some(state) = &moved
            && *state != self.state
            && (starts || !ends)
        {
            self.state = state.clone();
            events.push(self.status());
        }
        if resumes {
            events.push(Event::TurnStart(TurnStart {
                turn: self.reader.turns(),
            }));
        }
        events.append(&mut body);
        // A pause ends the turn's run for now: `turn_end` paused.
        if pauses && moved.as_ref() == Some(&PodState::Paused) {
            events.push(self.turn_end(TurnResult::Paused));
        }
        // A turn's end is announced before the state it leaves the pod in.
        if let Some(state) = moved
            && state != self.state
        {
            self.state = state;
            events.push(self.status());
        }
        events
    }

    fn turn_end(&self, result: TurnResult) -> Event {
        Event::TurnEnd(TurnEnd {
            turn: self.reader.turns(),
            result,
        })
    }

    /// The pod event of a live delta; none for a tool's progress, which
    /// the Pod protocol's closed set of events has no place for (its
    /// `tool_result` follows when the call ends).
    pub fn delta(&mut self, delta: &Delta) -> Option<Event> {
        Some(match delta {
            Delta::Text(text) => Event::TextDelta(TextData { text: text.clone() }),
            Delta::Thinking(text) => Event::ThinkingDelta(TextData { text: text.clone() }),
            Delta::ToolCallStart { id, name } => {
                self.announced.insert(id.clone());
                Event::ToolCallStart(ToolCallStart {
                    id: id.clone(),
                    name: name.clone(),
                })
            }
            Delta::ToolCallArguments { id, fragment } => {
                Event::ToolCallArgsDelta(ToolCallArgsDelta {
                    id: id.clone(),
                    json: fragment.clone(),
                })
            }
            Delta::ToolCallDone {
                id,
                name,
                arguments,
            } => {
                self.announced.insert(id.clone());
                Event::ToolCallDone(ToolCallDone {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                })
            }
            Delta::ToolProgress { .. } => return None,
        })
    }
}

/// The pod code of a turn's failure.
fn error_code(code: &FailureCode) -> ErrorCode {
    match code {
        FailureCode::ProviderError
        | FailureCode::Auth
        | FailureCode::Timeout
        | FailureCode::EngineCli => ErrorCode::ProviderError,
        FailureCode::ToolAbandoned => ErrorCode::ToolError,
        _ => ErrorCode::Internal,
    }
}
