//! What the runtime tells callers about a run: its state and latest
//! boundary result, and the conversation for display.

use serde_json::{Value, json};
use spool_journal::event::{Answer, Suspended, Usage};
use spool_journal::fold::{State, Status};
use spool_journal::{Envelope, Event, RunId, Seq, TurnId};
use spool_wire::run::SuspendKind;
use spool_wire::sentinel;

use crate::activity::{Activity, Reader, ToolOutcome};

use crate::runs::Locked;

/// A run's state and latest boundary result.
#[derive(Clone, Debug, PartialEq)]
pub struct RunView {
    /// The run.
    pub run_id: RunId,
    /// Its public state.
    pub status: Status,
    /// The current (or last) turn.
    pub turn_id: Option<TurnId>,
    /// The last journal position: stream after it.
    pub cursor: Option<Seq>,
    /// The last turn's answer.
    pub response: Option<String>,
    /// Why it waits, while it waits for an answer.
    pub suspend: Option<Suspended>,
    /// Tokens the last turn used.
    pub usage: Option<Usage>,
    /// Its title.
    pub title: Option<String>,
}

/// A run's conversation, state and cursor, read at one position.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// The state.
    pub view: RunView,
    /// The conversation for display: `{"role", "content": [parts]}`
    /// messages (see [`Conversation`]), compactions aside.
    pub messages: Vec<Value>,
}

/// What a listing shows of a run beyond its journal row: its turns,
/// tokens and cost, the addresses it holds, why its last turn failed, and
/// what it waits on (with the parked tool call's arguments). The console's
/// run list and inbox read it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RunDetail {
    /// The run's state and latest boundary result.
    pub view: RunView,
    /// Turns started over the run's life.
    pub turns: u64,
    /// Tokens every model call used, over all turns.
    pub usage: Usage,
    /// What those tokens cost in micro-dollars under the runtime's
    /// `[pricing]`; `None` without one.
    pub cost_micro_usd: Option<u64>,
    /// The addresses the run holds.
    pub addresses: Vec<spool_journal::Address>,
    /// Why the last turn failed, while the run rests failed.
    pub failure: Option<spool_journal::event::TurnFailed>,
    /// The parked tool call, while a tool's suspension holds the run.
    pub suspended_call: Option<spool_journal::event::ToolCallRequested>,
    /// When the run was created.
    pub created_at: Option<time::OffsetDateTime>,
    /// When its last event was recorded.
    pub updated_at: Option<time::OffsetDateTime>,
    /// Where it was forked from, when it is a fork.
    pub forked_from: Option<spool_journal::event::ForkLink>,
    /// Its events.
    pub events: u64,
    /// The bytes its events take as the journal stores them.
    pub bytes: u64,
    /// Whether it is past `warn_at` of a `[limits]` limit: new input is
    /// refused once it is past the limit itself.
    pub near_limit: bool,
    /// The digest of the agent definition its turns run on: the one it
    /// started with, or the last it moved to (`agent_changed`).
    pub agent: Option<String>,
}

impl RunDetail {
    pub(crate) fn of(locked: &Locked) -> Self {
        let pricing = locked.cached().agent.pricing;
        let view = RunView::of(locked);
        let state = locked.state();
        let suspended_call = view
            .suspend
            .as_ref()
            .and_then(|suspend| suspend.call_id.as_ref())
            .and_then(|call| {
                state
                    .parked_call
                    .as_ref()
                    .filter(|parked| parked.call_id == *call)
                    .or_else(|| state.open_calls.get(call).map(|(_, requested)| requested))
            })
            .cloned();
        Self {
            turns: state.turns,
            usage: state.usage,
            cost_micro_usd: pricing
                .as_ref()
                .map(|p| p.micro_usd(state.usage.input_tokens, state.usage.output_tokens)),
            addresses: state.addresses.iter().cloned().collect(),
            failure: state.failure.clone(),
            suspended_call,
            created_at: state.created_at,
            updated_at: state.updated_at,
            forked_from: state.forked_from.clone(),
            events: locked.cached().next().0,
            bytes: locked.cached().bytes,
            near_limit: locked.cached().near_limit(),
            agent: state.agent.clone(),
            view,
        }
    }
}

impl RunView {
    pub(crate) fn of(locked: &Locked) -> Self {
        let cached = locked.cached();
        Self::from_state(locked.run(), &cached.state, cached.turn_usage)
    }

    /// The view of `run` in `state`, with `usage` the last turn's
    /// completion recorded.
    fn from_state(run: &RunId, state: &State, usage: Option<Usage>) -> Self {
        Self {
            run_id: run.clone(),
            status: state.status,
            turn_id: state.turn.clone(),
            cursor: state.last_seq,
            response: state.response.clone(),
            suspend: state.suspension.clone().or_else(|| budget_suspend(state)),
            usage,
            title: state.title().map(str::to_owned),
        }
    }
}

impl Snapshot {
    /// The run as `locked` holds it, with its display history built from
    /// `log` (the run's events up to the same position).
    pub(crate) fn of(locked: &Locked, log: &[Envelope]) -> Self {
        Self {
            view: RunView::of(locked),
            messages: display_messages(log),
        }
    }
}

/// A message part: `{"type": "text", "text"}`.
fn text_part(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// The conversation for display, from a run's log, as the HTTP seed asks:
/// complete messages with content parts (`text`, `thinking`, `tool_call`,
/// `tool_result`), in the order things happened. See [`Conversation`].
pub(crate) fn display_messages(log: &[Envelope]) -> Vec<Value> {
    let mut conversation = Conversation::default();
    for envelope in log {
        conversation.apply(envelope);
    }
    conversation.messages()
}

/// The conversation for display, folded one event at a time: what a
/// snapshot's `messages` hold, and what a subscriber keeps up to date
/// without reading the log again.
///
/// It is not the model's context: a compaction summarizes the model's
/// context and removes nothing from here; a clear starts it over. Recorded
/// sentinels never appear: a tool's result is what the model was shown
/// (an error for a malformed record or a call its turn ended before its
/// result), a suspension's answer is the person's message, marked with the
/// call it answered.
///
/// The messages are a settled part, which only grows (until a clear), and
/// a pending tail: input steered in while a model call is under way, shown
/// last until the model's answer, which goes before it, settles both.
#[derive(Clone, Debug, Default)]
pub struct Conversation {
    settled: Vec<Value>,
    /// Input steered in while a model call was under way: it reached the
    /// model after that call, so it is shown after the call's answer.
    pending: Vec<Value>,
    reader: Reader,
    clears: u64,
}

fn user_message(text: &str) -> Value {
    json!({"role": "user", "content": [text_part(text)]})
}

fn tool_result_message(call_id: &str, content: String, is_error: bool) -> Value {
    let mut part = json!({"type": "tool_result", "tool_call_id": call_id, "content": content});
    if is_error {
        part["is_error"] = true.into();
    }
    json!({"role": "tool", "content": [part]})
}

impl Conversation {
    /// Folds the run's next event.
    pub fn apply(&mut self, envelope: &Envelope) {
        let model_call_open = self.reader.model_call().is_some();
        for fact in self.reader.envelope(envelope) {
            match fact {
                Activity::TurnStarted { started, .. } => {
                    self.settled.push(user_message(&started.input));
                }
                Activity::Input {
                    input,
                    turn: Some(_),
                    ..
                } => {
                    let message = user_message(input);
                    if model_call_open {
                        self.pending.push(message);
                    } else {
                        self.settled.push(message);
                    }
                }
                Activity::ModelCallEnded { done, .. } => {
                    self.settled.push(assistant_message(&done.message));
                    self.settled.append(&mut self.pending);
                }
                // A person's answer is their message; the model was given
                // it as the asking call's result.
                Activity::Resumed { answers, .. } => {
                    let text = answers
                        .iter()
                        .map(|a| a.text.as_str())
                        .collect::<Vec<_>>()
                        .join("\n");
                    let mut message = user_message(&text);
                    message["answers"] = serde_json::to_value(answers).unwrap_or_default();
                    self.settled.push(message);
                }
                Activity::ToolCallEnded {
                    outcome: ToolOutcome::Answered(_),
                    call_id,
                    ..
                } => {
                    if let Some(message) = self.settled.last_mut() {
                        message["tool_call_id"] = call_id.as_ref().into();
                    }
                }
                Activity::ToolCallEnded {
                    call_id, outcome, ..
                } => self.settled.push(tool_result_message(
                    &call_id,
                    outcome.text(),
                    outcome.is_error(),
                )),
                Activity::ContextChanged { cleared: true } => {
                    self.settled.clear();
                    self.pending.clear();
                    self.clears += 1;
                }
                // Ended without an answer: what was steered in stays shown.
                Activity::TurnEnded(_) => self.settled.append(&mut self.pending),
                _ => {}
            }
        }
    }

    /// The messages: the settled ones, then the pending tail.
    #[must_use]
    pub fn messages(&self) -> Vec<Value> {
        self.settled.iter().chain(&self.pending).cloned().collect()
    }

    /// The settled messages: they only grow, until a clear.
    #[must_use]
    pub fn settled(&self) -> &[Value] {
        &self.settled
    }

    /// The pending tail, shown after the settled messages.
    #[must_use]
    pub fn pending(&self) -> &[Value] {
        &self.pending
    }

    /// How many clears the conversation has seen: when it changes, the
    /// settled messages started over.
    #[must_use]
    pub fn clears(&self) -> u64 {
        self.clears
    }
}

/// An assistant message from a model call's recorded answer.
fn assistant_message(message: &Value) -> Value {
    let mut parts = Vec::new();
    if let Some(thinking) = message.get("thinking").and_then(Value::as_str) {
        parts.push(json!({"type": "thinking", "thinking": thinking}));
    }
    if let Some(text) = message.get("text").and_then(Value::as_str)
        && !text.is_empty()
    {
        parts.push(text_part(text));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        parts.push(json!({
            "type": "tool_call",
            "id": call.get("id"),
            "name": call.get("name"),
            "arguments": call.get("arguments"),
        }));
    }
    json!({"role": "assistant", "content": parts})
}

/// A run's state document (what a snapshot holds: its state and its
/// conversation) folded one event at a time from the start of its log, so
/// a reader can follow it at every position without the runtime's lock.
#[derive(Clone, Debug)]
pub struct Document {
    run: RunId,
    state: State,
    usage: Option<Usage>,
    conversation: Conversation,
}

impl Document {
    /// The document of `run` before its first event.
    #[must_use]
    pub fn new(run: &RunId) -> Self {
        Self {
            run: run.clone(),
            state: State::default(),
            usage: None,
            conversation: Conversation::default(),
        }
    }

    /// Folds the run's next event.
    pub fn apply(&mut self, envelope: &Envelope) {
        self.state.apply(envelope);
        self.conversation.apply(envelope);
        match &envelope.event {
            Event::TurnStarted(_) => self.usage = None,
            Event::TurnCompleted(done) if self.state.turn.as_ref() == Some(&done.turn_id) => {
                self.usage = done.usage;
            }
            _ => {}
        }
    }

    /// The run's state at the last folded event.
    #[must_use]
    pub fn view(&self) -> RunView {
        RunView::from_state(&self.run, &self.state, self.usage)
    }

    /// The conversation at the last folded event.
    #[must_use]
    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }
}

/// Answers as the model sees them (the suspended tool's result): one plain
/// answer as its text; a verdict or several answers as canonical JSON.
#[must_use]
pub fn answers_output(answers: &[Answer]) -> String {
    match answers {
        [
            Answer {
                text,
                approved: None,
            },
        ] => text.clone(),
        [one] => sentinel::content_string(&json!({"approved": one.approved, "text": one.text})),
        many => {
            sentinel::content_string(&serde_json::to_value(many).expect("answers are plain JSON"))
        }
    }
}

/// A used-up budget, shown the way every other wait is: what is used up,
/// and the verdict that answers it.
fn budget_suspend(state: &State) -> Option<Suspended> {
    let (Status::Waiting(SuspendKind::Budget), Some(budget), Some(turn)) =
        (&state.status, &state.budget, &state.turn)
    else {
        return None;
    };
    Some(Suspended {
        turn_id: turn.clone(),
        kind: SuspendKind::Budget,
        prompt: format!(
            "the {} budget is used up ({} of {}): approve to extend it, or reject to end the turn",
            budget.budget, budget.used, budget.limit
        ),
        call_id: None,
        input_schema: Some(serde_json::json!({"type": "object", "required": ["approved"]}).into()),
        options: Some(vec!["approve".into(), "reject".into()]),
    })
}
