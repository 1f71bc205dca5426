//! What the runtime tells callers about a run: its state and latest
//! boundary result, and the conversation for display.

use serde_json::{Value, json};
use spool_journal::event::{Suspended, Usage};
use spool_journal::fold::{State, Status};
use spool_journal::{Envelope, Event, RunId, Seq, TurnId};
use spool_wire::run::SuspendKind;
use spool_wire::sentinel::{self, Sentinel};

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
    /// messages (see `display_messages`), compactions aside.
    pub messages: Vec<Value>,
}

impl RunView {
    pub(crate) fn of(locked: &Locked) -> Self {
        let cached = locked.cached();
        let state = &cached.state;
        Self {
            run_id: locked.run().clone(),
            status: state.status,
            turn_id: state.turn.clone(),
            cursor: state.last_seq,
            response: state.response.clone(),
            suspend: state.suspension.clone().or_else(|| budget_suspend(state)),
            // The last turn's usage: what its completion recorded.
            usage: cached.turn_usage,
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
/// `tool_result`), in the order things happened. It is not the model's
/// context: a compaction summarizes the model's context and removes
/// nothing from here; a clear starts it over. Recorded sentinels never
/// appear: a tool's result is what the model was shown, a suspension's
/// answer is the person's message.
pub(crate) fn display_messages(log: &[Envelope]) -> Vec<Value> {
    let mut messages = Vec::new();
    // Input steered in while a model call was under way reached the model
    // after it: shown after its answer.
    let mut model_call_open = false;
    let mut steered_later: Vec<Value> = Vec::new();
    let mut suspended_call: Option<String> = None;
    let mut sleeping: Vec<(String, time::OffsetDateTime)> = Vec::new();
    let user = |text: &str| json!({"role": "user", "content": [text_part(text)]});
    let tool_result = |call_id: &str, content: String, is_error: bool| {
        let mut part = json!({"type": "tool_result", "tool_call_id": call_id, "content": content});
        if is_error {
            part["is_error"] = true.into();
        }
        json!({"role": "tool", "content": [part]})
    };
    for envelope in log {
        match &envelope.event {
            Event::TurnStarted(started) => messages.push(user(&started.input)),
            Event::InputSteered(steered) if model_call_open => {
                steered_later.push(user(&steered.input));
            }
            Event::InputSteered(steered) => messages.push(user(&steered.input)),
            Event::ModelCallRequested(_) => model_call_open = true,
            Event::ModelCallCompleted(done) => {
                model_call_open = false;
                let mut parts = Vec::new();
                if let Some(thinking) = done.message.get("thinking").and_then(Value::as_str) {
                    parts.push(json!({"type": "thinking", "thinking": thinking}));
                }
                if let Some(text) = done.message.get("text").and_then(Value::as_str)
                    && !text.is_empty()
                {
                    parts.push(text_part(text));
                }
                for call in done
                    .message
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
                messages.push(json!({"role": "assistant", "content": parts}));
                messages.append(&mut steered_later);
            }
            Event::ToolCallCompleted(done) => match Sentinel::decode(&done.output) {
                Ok(None) => messages.push(tool_result(
                    &done.call_id,
                    sentinel::content_string(&done.output),
                    false,
                )),
                Ok(Some(Sentinel::Failure(failure))) => messages.push(tool_result(
                    &done.call_id,
                    format!("error: {}", failure.message),
                    true,
                )),
                // A suspension's answer and a sleep's end come later.
                Ok(Some(_)) | Err(_) => {}
            },
            Event::Suspended(suspended) => suspended_call.clone_from(&suspended.call_id),
            Event::Resumed(resumed) => {
                let text = resumed
                    .answers
                    .iter()
                    .map(|a| a.text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                let mut message = user(&text);
                message["answers"] = serde_json::to_value(&resumed.answers).unwrap_or_default();
                if let Some(call) = suspended_call.take() {
                    message["tool_call_id"] = call.into();
                }
                messages.push(message);
            }
            Event::SleepStarted(sleep) => sleeping.push((sleep.call_id.clone(), sleep.wake_at)),
            Event::SleepCompleted(woke) => {
                if let Some(at) = sleeping.iter().position(|(call, _)| *call == woke.call_id) {
                    let (call, wake_at) = sleeping.swap_remove(at);
                    messages.push(tool_result(
                        &call,
                        sentinel::content_string(&sentinel::slept_output(wake_at)),
                        false,
                    ));
                }
            }
            Event::ToolCallResolved(resolved) => messages.push(tool_result(
                &resolved.call_id,
                sentinel::content_string(&resolved.output),
                false,
            )),
            Event::ToolCallAbandoned(abandoned) => messages.push(tool_result(
                &abandoned.call_id,
                "abandoned by an operator".into(),
                true,
            )),
            Event::ContextCleared(_) => {
                messages.clear();
                steered_later.clear();
            }
            // Ended without an answer: what was steered in stays shown.
            Event::TurnFailed(_) | Event::TurnCancelled(_) => {
                model_call_open = false;
                messages.append(&mut steered_later);
            }
            _ => {}
        }
    }
    messages.append(&mut steered_later);
    messages
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
