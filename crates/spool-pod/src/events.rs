//! A pod's events from its session's journal and live deltas: the table in
//! `docs/protocol/pod.md`. Deltas stream the answer as it comes; the
//! journal gives the rest (a block's whole text, tool results, usage, the
//! turn's start and end, state changes), so a listener that missed the
//! deltas still gets every `*_done`.

use std::collections::{HashMap, HashSet};

use spool_journal::fold::Status as RunStatus;
use spool_journal::{Envelope, Event as Journal};
use spool_runtime::engine::Delta;
use spool_wire::pod::{
    ErrorCode, Event, PodState, Status, TextData, ToolCallArgsDelta, ToolCallDone, ToolCallStart,
    ToolResult, TurnEnd, TurnResult, TurnStart, Usage,
};
use spool_wire::run::FailureCode;
use spool_wire::sentinel::{self, Sentinel};

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

/// Maps one session's journal events and deltas, in order, to pod events.
#[derive(Debug)]
pub struct Translator {
    pod_name: String,
    session: String,
    /// Turns started so far: `turn_start`'s number.
    turns: u64,
    state: PodState,
    /// Tool calls announced by a live delta: their `tool_call_start` and
    /// `tool_call_done` are not sent again from the journal.
    announced: HashSet<String>,
    /// The tool call a question or approval is parked on: its answer is
    /// that call's result.
    asked: Option<String>,
    /// Sleeping tool calls and when each wakes: its end is its result.
    sleeping: HashMap<String, time::OffsetDateTime>,
}

impl Translator {
    /// A translator for the session `session` of pod `pod_name`, before
    /// its first event.
    #[must_use]
    pub fn new(pod_name: &str, session: &str) -> Self {
        Self {
            pod_name: pod_name.to_owned(),
            session: session.to_owned(),
            turns: 0,
            state: PodState::Idle,
            announced: HashSet::new(),
            asked: None,
            sleeping: HashMap::new(),
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
        let mut events = Vec::new();
        let moved = spool_journal::fold::moved_to(&envelope.event).map(|status| pod_state(&status));
        // A turn's start is announced after the state it moves to.
        let starts = matches!(envelope.event, Journal::TurnStarted(_));
        if starts {
            self.turns += 1;
            self.announced.clear();
        }
        if let Some(state) = &moved
            && *state != self.state
            && (starts || !ends_turn(&envelope.event))
        {
            self.state = state.clone();
            events.push(self.status());
        }
        match &envelope.event {
            Journal::TurnStarted(_) => {
                events.push(Event::TurnStart(TurnStart { turn: self.turns }));
            }
            Journal::ModelCallCompleted(done) => {
                let message = &done.message;
                if let Some(thinking) = message.get("thinking").and_then(|v| v.as_str())
                    && !thinking.is_empty()
                {
                    events.push(Event::ThinkingDone(TextData {
                        text: thinking.to_owned(),
                    }));
                }
                if let Some(text) = message.get("text").and_then(|v| v.as_str())
                    && !text.is_empty()
                {
                    events.push(Event::TextDone(TextData {
                        text: text.to_owned(),
                    }));
                }
                if let Some(usage) = done.usage {
                    events.push(Event::Usage(Usage {
                        input_tokens: usage.input_tokens,
                        output_tokens: usage.output_tokens,
                    }));
                }
            }
            Journal::ToolCallRequested(call) if !self.announced.contains(&call.call_id) => {
                events.push(Event::ToolCallStart(ToolCallStart {
                    id: call.call_id.clone(),
                    name: call.tool.clone(),
                }));
                events.push(Event::ToolCallDone(ToolCallDone {
                    id: call.call_id.clone(),
                    name: call.tool.clone(),
                    arguments: call.input.to_string(),
                }));
            }
            Journal::ToolCallCompleted(done) => match Sentinel::decode(&done.output) {
                Ok(Some(Sentinel::Failure(failure))) => {
                    events.push(Event::ToolResult(ToolResult {
                        id: done.call_id.clone(),
                        output: failure.message.clone(),
                        is_error: true,
                    }))
                }
                // A suspension or a sleep: the pause says so.
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => events.push(Event::ToolResult(ToolResult {
                    id: done.call_id.clone(),
                    output: sentinel::content_string(&done.output),
                    is_error: false,
                })),
            },
            Journal::Suspended(suspended) => self.asked.clone_from(&suspended.call_id),
            Journal::Resumed(resumed) => {
                if let Some(call) = self.asked.take() {
                    events.push(Event::ToolResult(ToolResult {
                        id: call,
                        output: spool_runtime::view::answers_output(&resumed.answers),
                        is_error: false,
                    }));
                }
            }
            Journal::SleepStarted(sleep) => {
                self.sleeping.insert(sleep.call_id.clone(), sleep.wake_at);
            }
            Journal::SleepCompleted(woke) => {
                if let Some(wake_at) = self.sleeping.remove(&woke.call_id) {
                    let slept = sentinel::slept_output(woke.woken_at.unwrap_or(wake_at));
                    events.push(Event::ToolResult(ToolResult {
                        id: woke.call_id.clone(),
                        output: sentinel::content_string(&slept),
                        is_error: false,
                    }));
                }
            }
            Journal::ToolCallResolved(resolved) => events.push(Event::ToolResult(ToolResult {
                id: resolved.call_id.clone(),
                output: sentinel::content_string(&resolved.output),
                is_error: false,
            })),
            Journal::ToolCallAbandoned(abandoned) => events.push(Event::ToolResult(ToolResult {
                id: abandoned.call_id.clone(),
                output: abandoned
                    .reason
                    .clone()
                    .unwrap_or_else(|| "abandoned by an operator".into()),
                is_error: true,
            })),
            Journal::TurnCompleted(_) | Journal::TurnCancelled(_) => {
                events.push(self.turn_end(TurnResult::Finished));
            }
            Journal::TurnFailed(failed) => {
                events.push(Event::error(
                    error_code(&failed.code),
                    failed.message.clone(),
                ));
                events.push(self.turn_end(TurnResult::Finished));
            }
            _ => {}
        }
        // A pause ends the turn's run for now: `turn_end` paused.
        if matches!(
            envelope.event,
            Journal::Suspended(_) | Journal::SleepStarted(_) | Journal::BudgetExceeded(_)
        ) && moved.as_ref() == Some(&PodState::Paused)
        {
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
            turn: self.turns,
            result,
        })
    }

    /// The pod event of a live delta.
    pub fn delta(&mut self, delta: &Delta) -> Event {
        match delta {
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
        }
    }
}

/// Whether an event ends a turn (its state change is announced after the
/// turn's end).
fn ends_turn(event: &Journal) -> bool {
    matches!(
        event,
        Journal::TurnCompleted(_)
            | Journal::TurnFailed(_)
            | Journal::TurnCancelled(_)
            | Journal::Suspended(_)
            | Journal::SleepStarted(_)
            | Journal::BudgetExceeded(_)
    )
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
